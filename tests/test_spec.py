"""Pipeline specs: the examples load, errors name the field, the default shape is the contract."""

from datetime import timedelta
from pathlib import Path

import pytest

from lakehouse import catalog
from lakehouse.settings import Settings
from lakehouse.shape import DEFAULT_SHAPE
from specs.pipeline import SpecError, check_pipelines, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FIELDS = {"order_id": "string", "created_at": "timestamp", "region": "string",
          "amount": "decimal(18,2)", "qty": "int"}
BASE = {"name": "orders", "topic": "orders", "fields": FIELDS, "event_id": "order_id",
        "event_time": {"field": "created_at"}, "dimensions": ["region"],
        "measures": [{"field": "amount"}]}


def test_the_order_example_declares_its_columns():
    spec = load_spec(EXAMPLES / "orders.yaml")
    assert spec.shape.window_id == ("window_start", "region", "currency")
    assert spec.shape.measure_columns_typed() == [
        ("event_count", "bigint"), ("amount_sum", "decimal(38,2)"),
        ("amount_min", "decimal(18,2)"), ("amount_max", "decimal(18,2)"),
        ("event_fingerprint", "decimal(38,0)")]
    assert (spec.windows.size, spec.windows.watermark_delay) == (
        timedelta(minutes=1), timedelta(seconds=30))
    apps = load_spec(EXAMPLES / "app_events.yaml")
    assert apps.shape.measure_columns == ("event_count", "event_fingerprint")
    assert apps.shape.event_time.formats == ("epoch_seconds",)


def test_the_default_shape_is_the_contract():
    assert DEFAULT_SHAPE.window_id == ("window_start", "key")
    assert DEFAULT_SHAPE.measure_columns == ("event_count", "value_sum", "value_min", "value_max",
                                       "event_fingerprint")
    assert "key STRING NOT NULL" in catalog.STREAMING.ddl
    assert "value_sum DECIMAL(38,6) NOT NULL" in catalog.RECONCILED.ddl
    assert "before_value_max DECIMAL(38,6)" in catalog.CORRECTIONS.ddl


@pytest.mark.parametrize("change,needle", [
    ({"measures": [{"field": "amout"}]}, "measures[0].field: 'amout' is not a declared field"),
    ({"measures": [{"field": "qty"}]}, "measures[0]: 'qty' is int"),
    ({"fields": {**FIELDS, "amount": "double"}}, "fields.amount: type 'double'"),
    ({"window": {"size": "0 seconds"}}, "window: size 0:00:00: a window must be positive"),
    ({"window": {"size": "7 minutes"}}, "divide a day evenly"),
    ({"window": {"size": "soon"}}, "window.size: 'soon' is not a duration"),
    ({"dimensions": ["event_count"]}, "dimensions[0]: 'event_count' is not a declared field"),
    ({"dimensions": ["amount"]}, "dimensions[0]: field 'amount' is decimal(18,2)"),
    ({"dimensions": [{"name": "amount", "field": "region"}]},
     "measures[0].field: column 'amount' is declared twice (also by dimensions[0])"),
    ({"fields": {**FIELDS, "json": "string"}, "dimensions": ["json"]},
     "dimensions[0]: 'json' would give reason codes that read as the record's"),
    ({"event_time": {"field": "region"}}, "event_time.field: field 'region' is string"),
    ({"event_time": {"field": "created_at", "formats": ["epoch_seconds", "epoch_millis"]}},
     "ambiguous"),
    ({"kafka_options": {"sasl.password": "x"}}, "holds a credential"),
    ({"tables": "bronze_events"}, "tables 'bronze_events' is a folder the default pipeline"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ({"name": "Orders!"}, "name: 'Orders!' is not a column name"),
])
def test_a_spec_error_names_the_file_and_the_field(change, needle):
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, **change}, "orders.yaml")
    assert str(error.value).startswith("orders.yaml: ") and needle in str(error.value)


def test_pipelines_are_checked_side_by_side():
    orders = parse_spec(BASE)
    with pytest.raises(SpecError, match="one name 'orders'"):
        check_pipelines([orders, parse_spec({**BASE, "tables": "orders_2"})])
    with pytest.raises(SpecError, match="one table folder 'shared'"):
        check_pipelines([parse_spec({**BASE, "tables": "shared"}),
                         parse_spec({**BASE, "name": "refunds", "tables": "shared"})])
    assert len(check_pipelines([orders, parse_spec({**BASE, "name": "refunds"})])) == 2


def test_a_pipeline_gets_its_own_folder_topic_windows_and_secret(tmp_path):
    spec = parse_spec({**BASE, "window": {"size": "10 seconds"},
                       "secret_env": {"sasl.password": "ORDERS_SASL_PASSWORD"}})
    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    with pytest.raises(SpecError, match="ORDERS_SASL_PASSWORD"):
        spec.settings(base, {})
    s = spec.settings(base, {"ORDERS_SASL_PASSWORD": "pw-9"})
    assert s.root == f"{tmp_path}/orders" and s.checkpoint_path("ingest").startswith(s.root)
    assert (s.events_topic, s.window_size, s.pipeline) == ("orders", timedelta(seconds=10),
                                                           "orders")
    assert s.client_config["sasl.password"] == "pw-9" and "pw-9" not in repr(s)
    assert s.shape.window_id == ("window_start", "region")
    assert base.shape == DEFAULT_SHAPE and base.pipeline == "default"


def test_an_unreadable_spec_is_named(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml: not YAML"):
        load_spec(tmp_path / "bad.yaml")
