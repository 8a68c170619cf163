"""Avro input (`format: avro`), the spec side: the spec's schemas validated at load, and the
reason codes of an Avro shape (decoding on Spark: tests/spark/test_avro_decode.py)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from lakehouse.config.settings import Settings
from lakehouse.specs.pipeline import SpecError, load_spec, parse_spec
from spark_jobs.transforms.parse import REASONS, reasons

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC = load_spec(EXAMPLES / "orders_avro.yaml")
V1, V2 = (SPEC.shape.avro.schemas[i].parsed for i in (1, 2))


def test_the_avro_reasons_are_the_avro_shapes_only():
    codes = reasons(SPEC.shape)
    assert codes[:4] == ("payload_too_large", "empty_payload", "unknown_schema_id",
                         "invalid_avro")
    assert {"invalid_json", "invalid_utf8", "not_an_object"}.isdisjoint(codes)
    assert {"missing_region", "amount_too_precise", "event_time_in_future"} <= set(codes)
    assert not {"unknown_schema_id", "invalid_avro"} & set(REASONS)
    assert REASONS[2:5] == ("invalid_utf8", "invalid_json", "not_an_object")


def test_the_json_pipelines_digests_are_those_of_before_the_format_field():
    """The assets' code version (`results_version`) of JSON pipelines is unchanged: no date is
    stale because the shape learned a format (the digests of main before Avro)."""
    base = Settings.from_env({})
    assert base.results_version == "0b9c71901080"
    assert load_spec(EXAMPLES / "orders.yaml").settings(base, {}).results_version == (
        "110e91d227fe")
    # The avro spec's version covers its schemas: another reader id is another version.
    other = parse_spec({**_yaml(), "avro": {**_yaml()["avro"], "reader": 1},
                        "fields": {k: v for k, v in _yaml()["fields"].items() if k != "currency"},
                        "dimensions": ["region"]}, folder=EXAMPLES)
    assert other.settings(base, {}).results_version != SPEC.settings(base, {}).results_version


def _yaml() -> dict:
    return yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())


def _spec_in(tmp_path, change, files=None) -> Path:
    for name in ("orders_v1.avsc", "orders_v2.avsc"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    data = _yaml()
    change(data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# A writer without the id, which the reader schema requires (no default).
V1_NO_ID = json.dumps({**V1, "fields": [f for f in V1["fields"] if f["name"] != "order_id"]})


@pytest.mark.parametrize(("change", "files", "needle"), [
    (lambda d: d["avro"]["schemas"].update({3: "orders_v3.avsc"}), None,
     "avro: schemas[3]: cannot read orders_v3.avsc beside the spec"),
    (lambda d: d["avro"]["schemas"].update({3: "bad.avsc"}), {"bad.avsc": "{not json"},
     "schemas[3]: bad.avsc is not JSON"),
    (lambda d: d["avro"]["schemas"].update({3: "enum.avsc"}),
     {"enum.avsc": '{"type": "enum", "name": "E", "symbols": ["A"]}'},
     "schemas[3]: enum.avsc is not an Avro record schema"),
    (lambda d: d["avro"]["schemas"].update({"x": "orders_v1.avsc"}), None,
     "schemas: 'x' is not a schema id"),
    (lambda d: d.pop("avro"), None, "format avro: declare its schemas"),
    (lambda d: d.pop("format"), None, "avro: the schemas are for format: avro"),
    (lambda d: d["avro"].update(reader=5), None, "reader: 5 is not one of the schema ids [1, 2]"),
    (lambda d: d["avro"]["schemas"].update({0: "v0.avsc"}), {"v0.avsc": V1_NO_ID},
     "avro: schemas[0] (v0.avsc): lacks field 'order_id' of the reader schema (orders_v2.avsc),"
     " which has no default"),
    (lambda d: d["fields"].update(discount="decimal(10,2)"), None,
     "fields.discount: not a field of the reader schema (orders_v2.avsc"),
    (lambda d: d["event_time"].update(formats=["iso8601"]), None,
     "fields.created_at: the event time is"),
    (lambda d: d["avro"].update(wire_format="plain"), None,
     "wire_format plain: declare its one writer schema"),
    (lambda d: d["avro"]["schemas"].update({3: "../orders_v1.avsc"}), None,
     "schemas[3]: '../orders_v1.avsc': a schema file is named by its name beside the spec"),
    (lambda d: d["avro"]["schemas"].update({3: "/etc/passwd"}), None,
     "schemas[3]: '/etc/passwd': a schema file is named by its name beside the spec"),
])
def test_a_bad_avro_spec_is_refused_naming_the_file_and_the_field(tmp_path, change, files,
                                                                 needle):
    path = _spec_in(tmp_path, change, files)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).startswith(f"{path}: "), err.value
    assert needle in str(err.value), err.value


def test_a_float_measure_and_an_incompatible_version_are_refused():
    floats = {**V2, "fields": [*V2["fields"][:3], {"name": "amount", "type": "double"},
                               V2["fields"][4]]}
    with pytest.raises(SpecError, match="amount: decimal.18,2. cannot be read from .double. "
                                        "in inline schema.*not exact"):
        parse_spec({**_yaml(), "avro": {"schemas": {1: floats}}})
    ints = {**V1, "fields": [*V1["fields"][:3], {"name": "amount", "type": "string"}]}
    with pytest.raises(SpecError, match=r"schemas\[1\] \(inline schema\): field 'amount' is "
                                        r"\"string\", the reader schema"):
        parse_spec({**_yaml(), "avro": {"schemas": {1: ints, 2: V2}}})
    with pytest.raises(SpecError, match="give the schema inline here"):
        parse_spec(_yaml())  # no spec file: no folder to read schema files in
