"""Avro records decoded by Spark's `from_avro` on real Spark into the classification the JSON
path uses: both writer versions into one shape, unknown schema ids and undecodable bytes
quarantined with their own reasons, decimals exact, timestamp-millis as epoch milliseconds
(the spec's side: tests/unit/test_avro.py)."""

import io
import struct
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import fastavro
import pytest
from test_avro import EXAMPLES, SPEC, V1, V2, _yaml

from lakehouse.config.settings import Settings, utc
from lakehouse.specs.pipeline import parse_spec
from spark_jobs.transforms.parse import parsed_events, reasons

BROKER_TIME = datetime(2026, 11, 21, 14, 1, tzinfo=UTC)
AT = datetime(2026, 11, 21, 14, 0, 5, 123000, tzinfo=UTC)
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def body(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def confluent(sid: int, schema: dict, **fields) -> bytes:
    record = {"order_id": "o1", "created_at": AT, "region": "eu-west", "amount": Decimal("19.99"),
              **({"currency": "USD"} if schema is V2 else {}), **fields}
    return b"\x00" + struct.pack(">I", sid) + body(schema, record)


def split(spark, settings, values):
    rows = [(b"k", v, "t", 0, i, BROKER_TIME) for i, v in enumerate(values)]
    with parsed_events(spark.createDataFrame(rows, SCHEMA), settings) as (valid, bad):
        return ({r.offset: r for r in valid.collect()}, {r.offset: r for r in bad.collect()})


@pytest.fixture()
def settings(tmp_path):
    return SPEC.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path),
                                            "LAKEHOUSE_START_DATE": "2026-01-01"}), {})


def test_both_versions_decode_into_one_shape_with_exact_decimals(spark, settings):
    big = Decimal("9999999999999999.99")  # decimal(18,2)'s largest: no double holds it
    valid, bad = split(spark, settings, [
        confluent(1, V1),  # no currency in v1: the reader's default, EUR
        confluent(2, V2, amount=-big, order_id="o2"),
        confluent(2, V2, amount=Decimal("0.01"), region="ap-south", order_id="o3"),
        confluent(1, V1, amount=big, created_at=AT - timedelta(days=1), order_id="o4"),
    ])
    assert not bad, {o: (r.reason, r.detail) for o, r in bad.items()}
    assert [(valid[i].event_id, valid[i].region, valid[i].currency, valid[i].amount)
            for i in range(4)] == [("o1", "eu-west", "EUR", Decimal("19.99")),
                                   ("o2", "eu-west", "USD", -big),
                                   ("o3", "ap-south", "USD", Decimal("0.01")),
                                   ("o4", "eu-west", "EUR", big)]
    assert [utc(valid[i].event_time) for i in (0, 3)] == [AT, AT - timedelta(days=1)]
    assert str(valid[1].amount) == "-9999999999999999.99"


def test_unknown_ids_and_undecodable_bytes_are_quarantined_with_details(spark, settings):
    good = confluent(2, V2)
    values = [
        confluent(7, V2),  # a schema id the spec does not know
        good[:3],  # shorter than the header
        b'{"order_id": "o1"}',  # JSON on the Avro topic: no magic byte
        b"\x01" + good[1:],  # another magic byte
        good[: len(good) - 4],  # cut short: the decoder reads past the end
        good[:5] + b"\x03\xff\xff",  # a string length that is negative
        # A bomb: a first string claiming 2,000,000,000 bytes (zig-zag varint), a few bytes
        # given: refused by Avro's limits (below) before anything is allocated.
        good[:5] + b"\x80\xd0\xac\xf3\x0e" + b"x" * 8,
        confluent(2, V2, region=None),  # decodes; region is null
        confluent(1, V1, created_at=AT + timedelta(days=3650)),
        b"",
    ]
    valid, bad = split(spark, settings, values)
    assert not valid
    got = [(bad[i].reason, bad[i].detail) for i in range(len(values))]
    assert got[:7] == [
        ("unknown_schema_id", "schema id 7 is not one of the spec's (1, 2)"),
        ("invalid_avro", "3 bytes: shorter than the Confluent header (magic byte 0, 4-byte "
                         "schema id)"),
        ("invalid_avro", "first byte 0x7B is not the Confluent magic byte 0"),
        ("invalid_avro", "first byte 0x01 is not the Confluent magic byte 0"),
        ("invalid_avro", "the bytes after the header do not decode as schema id 2 "
                         "(orders_v2.avsc)"),
        ("invalid_avro", "the bytes after the header do not decode as schema id 2 "
                         "(orders_v2.avsc)"),
        ("invalid_avro", "the bytes after the header do not decode as schema id 2 "
                         "(orders_v2.avsc)"),
    ]
    assert [r for r, _ in got[7:]] == ["missing_region", "event_time_in_future",
                                       "empty_payload"]
    import base64

    assert [base64.b64decode(bad[i].raw_value) for i in range(9)] == values[:9]  # bytes kept
    # The JVM that decoded them bounds what a record may claim by MAX_EVENT_BYTES.
    system = spark.sparkContext._jvm.java.lang.System
    assert {what: system.getProperty(f"org.apache.avro.limits.{what}.maxLength")
            for what in ("string", "bytes", "collectionItems")} == dict.fromkeys(
        ("string", "bytes", "collectionItems"), str(settings.max_event_bytes))


def test_plain_avro_decodes_with_its_one_schema(spark, tmp_path):
    data = {**_yaml(), "avro": {"wire_format": "plain", "schema": "orders_v2.avsc"}}
    spec = parse_spec(data, folder=EXAMPLES)
    assert reasons(spec.shape)[2] == "invalid_avro" and "unknown_schema_id" not in reasons(
        spec.shape)
    s = spec.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)}), {})
    record = confluent(2, V2, amount=Decimal("-12.30"))[5:]
    valid, bad = split(spark, s, [record, record[:-3]])
    assert (valid[0].currency, valid[0].amount) == ("USD", Decimal("-12.30"))
    assert (bad[1].reason, bad[1].detail) == (
        "invalid_avro", "the bytes do not decode as Avro of orders_v2.avsc")


def test_generated_avro_records_are_classified_as_their_kinds(spark, settings):
    """The generator's records (testkit.avro_events, fastavro) through from_avro: every valid one
    valid and equal to fastavro's reading of it, every malformed one with its kind's reason."""
    from testkit.generator import GeneratorConfig
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import generate_for_spec, malformed_kinds, rows_for_spec

    g = generate_for_spec(SPEC, GeneratorConfig(
        count=700, seed=11, end=datetime(2026, 11, 21, 12, tzinfo=UTC), span=timedelta(hours=4),
        malformed_fraction=0.08))
    kinds = g.kinds()
    assert set(malformed_kinds(SPEC)) <= set(kinds), kinds
    valid, bad = split(spark, settings, [r.value for r in g.records])
    assert Counter(r.reason for r in bad.values()) == Counter(
        r.kind for r in g.records if r.kind not in VALID_KINDS)
    assert {i for i, r in enumerate(g.records) if r.kind in VALID_KINDS} == set(valid)
    rows = rows_for_spec(SPEC, g.records)
    ours = [valid[i] for i in sorted(valid)]
    assert [(r.event_id, r.time, r.dimensions, r.values["amount"]) for r in rows] == [
        (v.event_id, utc(v.event_time), (v.region, v.currency), v.amount) for v in ours]
    assert {v.currency for v in ours} >= {"EUR", "USD"}


TYPED = {"type": "record", "name": "Line", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "region", "type": {"type": "enum", "name": "Region", "symbols": ["eu", "us"]}},
    {"name": "amount",
     "type": {"type": "bytes", "logicalType": "decimal", "precision": 24, "scale": 4}},
    {"name": "qty", "type": "long"},
    {"name": "fee", "type": "string"},
]}


def test_typed_fields_are_checked_as_their_spec_types(spark, tmp_path):
    """The decoded struct's typed fields (no VARIANT, no text): a decimal of a larger scale than
    the spec's is too precise only past it, one too large is out of range, a long measure, an
    enum dimension, a string measure read as text, a time before 1970 invalid (as its epoch
    milliseconds' text is)."""
    spec = parse_spec({
        "name": "lines", "topic": "lines", "format": "avro",
        "avro": {"wire_format": "plain", "schema": TYPED},
        "fields": {"order_id": "string", "created_at": "timestamp", "region": "string",
                   "amount": "decimal(18,2)", "qty": "decimal(12,0)", "fee": "decimal(10,2)"},
        "event_id": "order_id", "event_time": {"field": "created_at", "formats": ["epoch_millis"]},
        "dimensions": ["region"],
        "measures": [{"field": f, "aggregates": ["sum"]} for f in ("amount", "qty", "fee")],
    })
    s = spec.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path),
                                         "LAKEHOUSE_START_DATE": "2026-01-01"}), {})

    def line(**fields) -> bytes:
        return body(TYPED, {"order_id": "l1", "created_at": AT, "region": "eu",
                            "amount": Decimal("12.3400"), "qty": 3, "fee": "0.50", **fields})

    valid, bad = split(spark, s, [
        line(),
        line(region="us", qty=2**35, fee=" 7 ", amount=Decimal("-9999999999999999.9900")),
        line(amount=Decimal("12.3450")),
        line(amount=Decimal("10000000000000000")),
        line(amount=Decimal("12345678901234567890.1234")),
        line(created_at=datetime(1969, 12, 31, tzinfo=UTC)),
        line(fee="abc"),
        line(qty=10**12),
        line(order_id=" "),
    ])
    assert not {o: (r.reason, r.detail) for o, r in bad.items() if o < 2}
    assert [(v.event_id, v.region, v.amount, v.qty, v.fee, utc(v.event_time))
            for v in (valid[0], valid[1])] == [
        ("l1", "eu", Decimal("12.34"), Decimal(3), Decimal("0.50"), AT),
        ("l1", "us", Decimal("-9999999999999999.99"), Decimal(2**35), Decimal("7.00"), AT)]
    assert {o: bad[o].reason for o in bad} == {
        2: "amount_too_precise", 3: "amount_out_of_range", 4: "amount_too_precise",
        5: "invalid_event_time", 6: "invalid_fee", 7: "qty_out_of_range",
        8: "missing_event_id"}
    assert bad[2].detail == ("amount=12.3450 (exact decimal, at most 2 fractional digits, "
                             "|v| < 10000000000000000)")
    assert bad[5].detail.startswith("created_at=-86400000 is not epoch milliseconds")
