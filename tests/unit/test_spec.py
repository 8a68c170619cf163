"""Pipeline specs: the examples load, errors name the field, the default shape is the contract."""

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import SecretStr

from lakehouse.config.settings import Settings, SettingsError, is_credential
from lakehouse.events.shape import DEFAULT_SHAPE, bound_exponent
from lakehouse.specs.pipeline import SpecError, check_pipelines, load_spec, parse_spec
from lakehouse.tables import catalog

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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
    ({"window": {"size": "0 seconds"}}, "window.size: must be a positive duration"),
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
    ({"kafka_options": {"sasl.password": "x"}},
     "kafka_options: 'sasl.password' holds a credential: name the environment variable"),
    ({"kafka_options": {"client.id": ["a"]}},
     "kafka_options: 'client.id': ['a'] is not an option value: write a string, a number"),
    ({"secret_env": {"sasl.password": "pw"}},
     "secret_env['sasl.password']: 'pw' is not an environment variable's name"),
    ({"topic": "my orders"}, "topic: 'my orders' is not a Kafka topic name"),
    # Names the Spark code once used for its own columns run (tests/e2e/test_spec_pipeline_e2e.py);
    # a leading _ (Delta's _commit_version, the parser's _id_type) is the pipeline's own.
    ({"dimensions": [{"name": "_commit_version", "field": "region"}]},
     "dimensions[0]: '_commit_version': a column name starts with a letter"),
    ({"fields": {**FIELDS, "_amount": "decimal(18,2)"}, "measures": [{"field": "_amount"}]},
     "measures[0].field: '_amount': a column name starts with a letter"),
    ({"measures": [{"field": "amount", "name": "_a"}]},
     "measures[0]: '_a_sum': a column name starts with a letter"),
    ({"dimensions": [{"name": "reason", "field": "region"}]},
     "dimensions[0]: 'reason' is a column every table already has"),
    ({"dimensions": [{"name": "before_amount_sum", "field": "region"}]},
     "dimensions[0]: 'before_amount_sum' is the before image of measure column amount_sum"),
    ({"dimensions": [{"name": "replay_event_count", "field": "region"}]},
     "'replay_event_count' is the replay image of measure column event_count"),
    ({"measures": [{"field": "amount", "name": "events"}]},
     "measures[0]: 'events': its sum's gap figure would be events_missed"),
    ({"fields": {**FIELDS, "amount": "decimal(38,25)"}},
     "fields.amount: type 'decimal(38,25)': one of string, int, long, date, timestamp or "
     "decimal(p,s) with precision 1-38 and scale <= precision, at most 24"),
    ({"window": {"watermark_delay": "0 seconds"}},
     "window.watermark_delay: must be a positive duration"),
    ({"window": {"watermark_delay": "1 second", "correction_horizon": "0 seconds"}},
     "window.correction_horizon: must be a positive duration"),
    ({"window": {"watermark_delay": "2 minutes", "correction_horizon": "1 minute"}},
     "window: correction_horizon (0:01:00) must be at least watermark_delay (0:02:00)"),
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


def test_a_specs_owners_are_its_pipelines_and_each_is_an_owner_dagster_takes(tmp_path):
    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path),
                              "PIPELINE_OWNER": "team:platform, Alice (on call)"})
    assert base.asset_owners == ["team:platform"]  # free text: the scorecard's only
    own = parse_spec({**BASE, "owners": ["team:orders", " billing@example.com"]}).settings(
        base, {})
    assert own.pipeline_owner == "team:orders, billing@example.com"
    assert own.asset_owners == ["team:orders", "billing@example.com"]
    assert parse_spec(BASE).settings(base, {}).asset_owners == ["team:platform"]  # inherited
    with pytest.raises(SpecError, match=r"owners.*'orders team'.*team:billing"):
        parse_spec({**BASE, "owners": ["orders team"]})


DEPLOYMENT_SASL = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN",
                   "KAFKA_SASL_USERNAME": "lakehouse", "KAFKA_SASL_PASSWORD": "deployment-pw-7"}


@pytest.mark.parametrize("option, value", [("bootstrap.servers", "127.0.0.1:1"),
                                           ("security.protocol", "SASL_PLAINTEXT"),
                                           ("sasl.mechanism", "PLAIN"),
                                           ("sasl.mechanisms", "PLAIN")])
def test_a_spec_routing_elsewhere_never_gets_the_deployments_credentials(tmp_path, option, value):
    """A spec that chooses its brokers, protocol or mechanism is refused, naming the key, while
    the deployment has Kafka credentials and the spec brings none; with credentials of its own
    it gets only those, and none of the deployment's SASL/SSL options."""
    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path), **DEPLOYMENT_SASL})
    routed = parse_spec({**BASE, "kafka_options": {option: value}})
    with pytest.raises(SpecError, match=rf"kafka_options\.{option} sends the client to brokers"):
        routed.settings(base, {})
    # Without deployment credentials there is nothing to leak: it runs on its own brokers.
    assert routed.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)}), {})
    own = parse_spec({**BASE, "kafka_options": {option: value, "sasl.username": "orders"},
                      "secret_env": {"sasl.password": "ORDERS_SASL_PASSWORD"}})
    config = own.settings(base, {"ORDERS_SASL_PASSWORD": "orders-pw-3"}).client_config
    assert config["sasl.password"] == "orders-pw-3" and config["sasl.username"] == "orders"
    assert "deployment-pw-7" not in str(config)
    assert config.get("sasl.mechanism") == (value if option == "sasl.mechanism" else None)
    # A spec that keeps the deployment's brokers keeps its credentials.
    plain = parse_spec({**BASE, "kafka_options": {"fetch.min.bytes": "1024"}}).settings(base, {})
    assert plain.client_config["sasl.password"] == "deployment-pw-7"


def test_an_unreadable_spec_is_named(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml: not YAML"):
        load_spec(tmp_path / "bad.yaml")


def test_a_flow_mapping_that_cuts_a_decimal_is_named_with_the_fix(tmp_path):
    path = tmp_path / "orders.yaml"
    path.write_text("name: orders\ntopic: orders\nevent_id: order_id\n"
                    "event_time: {field: created_at}\ndimensions: [region]\n"
                    "measures: [{field: amount}]\n"
                    "fields: {order_id: string, created_at: timestamp, region: string, "
                    "amount: decimal(10,2)}\n")
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert str(error.value) == (
        f"{path}: fields.amount: 'decimal(10' is a decimal type cut at its comma: in a YAML flow "
        "mapping ({...}) a comma separates entries; quote the type (amount: 'decimal(p,s)') or "
        "declare the fields one per line")
    path.write_text(path.read_text().replace("decimal(10,2)", "'decimal(10,2)'"))
    assert load_spec(path).shape.fields["amount"] == "decimal(10,2)"


def test_kafka_options_take_yaml_numbers_and_booleans_as_text(tmp_path):
    path = tmp_path / "orders.yaml"
    text = (EXAMPLES / "orders.yaml").read_text()
    path.write_text(text + "kafka_options:\n  fetch.min.bytes: 1024\n  check.crcs: true\n"
                    "  security.protocol: SASL_SSL\n")
    spec = load_spec(path)
    assert spec.source.options == {"fetch.min.bytes": "1024", "check.crcs": "true",
                                   "security.protocol": "SASL_SSL"}
    s = spec.settings(Settings.from_env({}), {})
    assert s.client_config["fetch.min.bytes"] == "1024"


@pytest.mark.parametrize("size,delay,horizon", [
    ("1 minute", "0 seconds", "7 days"), ("1 minute", "30 seconds", "0 seconds"),
    ("0 seconds", "30 seconds", "7 days"), ("7 minutes", "30 seconds", "7 days"),
    ("1 minute", "2 minutes", "1 minute"), ("500 ms", "1 second", "1 day"),
    ("10 seconds", "1 minute", "3 days"),
])
def test_spec_windows_follow_the_settings_rules(size, delay, horizon):
    """One set of rules: a spec's window values pass exactly when the same values pass as
    WINDOW_SIZE, WATERMARK_DELAY and CORRECTION_HORIZON."""
    try:
        Settings.from_env({"WINDOW_SIZE": size, "WATERMARK_DELAY": delay,
                           "CORRECTION_HORIZON": horizon})
        settings_ok = True
    except SettingsError:
        settings_ok = False
    try:
        parse_spec({**BASE, "window": {"size": size, "watermark_delay": delay,
                                       "correction_horizon": horizon}})
        spec_ok = True
    except SpecError:
        spec_ok = False
    assert spec_ok == settings_ok


def test_the_range_rule_holds_for_every_accepted_decimal():
    """decimal(p,s) is accepted for 1 <= p <= 38 and s <= min(p, 24); every accepted type's
    values are below 10^min(p-s, 24-s): within the type, and 10^14 of them sum within
    decimal(38,s)."""
    from spark_jobs.transforms.parse import max_abs

    accepted = []
    for p in range(1, 39):
        for s in range(p + 1):
            kind = f"decimal({p},{s})"
            try:
                parse_spec({**BASE, "fields": {**FIELDS, "amount": kind}})
            except SpecError as exc:
                assert s > 24 and "at most 24" in str(exc), kind
                continue
            accepted.append(kind)
            e = bound_exponent(kind)
            assert s <= 24 and e == min(p - s, 24 - s) >= 0, kind
            assert max_abs(kind) == "1" + "0" * e
            bound = Decimal(10) ** e
            assert bound <= Decimal(10) ** (p - s)  # the type holds every value below it
            assert bound * 10 ** 14 <= Decimal(10) ** (38 - s)  # the sum's decimal(38,s)
    assert len(accepted) == sum(min(p, 24) + 1 for p in range(1, 39))


@pytest.mark.parametrize("option", [
    "sasl.password", "sasl.jaas.config", "ssl.key.password", "ssl.keystore.password",
    "ssl.truststore.password", "ssl.key.pem", "ssl.keystore.key",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config"])
def test_one_credential_list_for_specs_and_run_overrides(option, monkeypatch):
    """The options a spec may not hold inline are those a run may not send to other brokers."""
    from assets.resources import _own_brokers

    assert is_credential(option)
    with pytest.raises(SpecError, match=f"kafka_options: '{option}' holds a credential"):
        parse_spec({**BASE, "kafka_options": {option: "x"}})
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-a:9092")
    moved = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "kafka-b:9092"}).model_copy(
        update={"kafka_options": {option: SecretStr("x")}})
    with pytest.raises(SettingsError, match="may not be overridden"):
        _own_brokers(moved)
    plain = moved.model_copy(update={"kafka_options": {"security.protocol": SecretStr("SSL")}})
    assert _own_brokers(plain) is plain and not is_credential("security.protocol")
