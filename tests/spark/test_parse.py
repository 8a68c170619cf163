"""The parser on real Spark: every reason code, exact values, and a fuzz test that every
record ends in exactly one of bronze or quarantine."""

import json
from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from lakehouse.config.settings import Settings, utc
from spark_jobs.transforms.parse import REASONS, parsed_events

BROKER_TIME = datetime(2026, 11, 21, 14, 1, tzinfo=UTC)
SETTINGS = Settings.from_env({"MAX_EVENT_BYTES": "2048"})
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def ev(**fields) -> bytes:
    base = {"event_id": "e1", "key": "k1", "event_time": "2026-11-21T14:00:05.123Z", "value": 1}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def split(spark, values, settings=SETTINGS):
    rows = [(b"k", v, "t", 0, i, BROKER_TIME) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, SCHEMA)
    with parsed_events(df, settings) as (valid, bad):
        return ({r.offset: r for r in valid.collect()}, {r.offset: r for r in bad.collect()})


VALID_CASES = [
    (ev(), Decimal("1.000000"), datetime(2026, 11, 21, 14, 0, 5, 123000, tzinfo=UTC)),
    (ev(value=12.5), Decimal("12.500000"), None),
    (ev(value="0.000001"), Decimal("0.000001"), None),
    (ev(value="-3.10"), Decimal("-3.100000"), None),
    (ev(value=1.5e3), Decimal("1500.000000"), None),  # exponent notation, exact
    (ev(value="12.3400000"), Decimal("12.340000"), None),  # trailing zeros are not precision
    (ev(value=999999999999999999.999999), None, None),  # not exact as a double -> see below
    (ev(event_time=1795168846100), None, datetime(2026, 11, 20, 10, 0, 46, 100000, tzinfo=UTC)),
    (ev(event_time="1795168846100"), None, datetime(2026, 11, 20, 10, 0, 46, 100000, tzinfo=UTC)),
    (ev(event_time="2026-11-21T16:00:05+02:00"), None, datetime(2026, 11, 21, 14, 0, 5, tzinfo=UTC)),
    (ev(event_time="2026-11-21T13:00:05.5-0100"), None, datetime(2026, 11, 21, 14, 0, 5, 500000, tzinfo=UTC)),
    (ev(attributes={"country": "DE", "tags": [1, 2]}), None, None),
    # A nested "value" with many digits does not decide for the top-level one.
    (b'{"event_id":"e1","key":"k1","event_time":1795168846100,'
     b'"attributes":{"value":1.123456789e0},"value":2.5e0}', Decimal("2.500000"), None),
    (b'{"event_id":"e1","key":"k1","event_time":1795168846100,"value":12.5E-5}',
     Decimal("0.000125"), None),
    (ev(event_time="2025-01-01T00:00:00Z"), None, datetime(2025, 1, 1, tzinfo=UTC)),  # the first instant
    # JSON's whitespace around the object (a line-delimited producer's newline, a tab).
    (b"\n\t " + ev() + b"\r\n", Decimal("1.000000"), None),
]


def test_valid_records_parse_exactly(spark):
    values = [c[0] for c in VALID_CASES]
    values[6] = b'{"event_id":"e1","key":"k1","event_time":1795168846100,' \
                b'"value":999999999999999999.999999}'
    valid, bad = split(spark, values)
    assert not bad, {o: r.reason for o, r in bad.items()}
    for i, (_, value, when) in enumerate(VALID_CASES):
        if value is not None:
            assert valid[i].value == value
        if when is not None:
            assert utc(valid[i].event_time) == utc(valid[i].payload_event_time) == when
    assert valid[6].value == Decimal("999999999999999999.999999")
    assert json.loads(valid[11].attributes) == {"country": "DE", "tags": [1, 2]}
    assert valid[0].event_date.isoformat() == "2026-11-21"
    assert utc(valid[0].kafka_timestamp) == BROKER_TIME


BAD_CASES = [
    (b"x" * 3000, "payload_too_large"),
    (b"", "empty_payload"),
    (None, "empty_payload"),
    (b'{"event_id": "\xff\xfe"}', "invalid_utf8"),
    (b'{"event_id": "e1", ', "invalid_json"),
    (b"NaN", "invalid_json"),
    (b'[{"event_id": "e1"}]', "not_an_object"),
    (b'"just a string"', "not_an_object"),
    (b"42", "not_an_object"),
    (ev(event_id=...), "missing_event_id"),
    (ev(event_id="  "), "missing_event_id"),
    (ev(key=...), "missing_key"),
    (ev(key=""), "missing_key"),
    (ev(event_time=...), "missing_event_time"),
    (ev(value=...), "missing_value"),
    (ev(value=None), "missing_value"),
    (ev(event_time="2026-11-21T14:00:05"), "invalid_event_time"),  # no offset: never guessed
    (ev(event_time="yesterday"), "invalid_event_time"),
    (ev(event_time=1.5), "invalid_event_time"),
    (ev(event_time="2026-13-45T99:00:00Z"), "invalid_event_time"),
    (ev(value="12,50"), "invalid_value"),
    (ev(value="NaN"), "invalid_value"),
    (ev(value=True), "invalid_value"),
    (ev(value={"amount": 1}), "invalid_value"),
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"value":1e400}', "invalid_value"),
    (ev(value="0.1234567"), "value_too_precise"),
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"value":1.0000000000000001e0}',
     "value_too_precise"),
    (ev(value="1000000000000000000"), "value_out_of_range"),
    (ev(value=-1e19), "value_out_of_range"),
    (ev(event_time="2026-11-21T14:06:01Z"), "event_time_in_future"),
    # Digits past decimal(38,18)'s 18th are rounded away by an exact read: count them in the text.
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"value":1.0000000000000000001e0}',
     "value_too_precise"),
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"value":1e-19}', "value_too_precise"),
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"attributes":{"value":1},'
     b'"value":0.00000000000000000000000000000000000000001}', "value_too_precise"),
    (b'{"event_id":"e","key":"k","event_time":1795168846100,"value":125E-8}', "value_too_precise"),
    # Epoch seconds sent as milliseconds: January 1970, before any partition.
    (ev(event_time=1795168846), "event_time_before_start"),
    (ev(event_time="2024-12-31T23:59:59Z"), "event_time_before_start"),
    # Identity fields that are no string: an object's, array's or boolean's text is no id.
    (ev(event_id={"id": 1}), "invalid_event_id"),
    (ev(event_id=[1]), "invalid_event_id"),
    (ev(event_id=True), "invalid_event_id"),
    (ev(key=["merchant-1"]), "invalid_key"),
    (ev(key=False), "invalid_key"),
    # 41 fractional digits, no exponent: a double in the VARIANT (0.1 as text), too precise.
    (b'{"event_id":"e","key":"k","event_time":1795168846100,'
     b'"value":0.10000000000000000000000000000000000000001}', "value_too_precise"),
    # Text after the object: Spark's parser alone would read the first event and drop the rest.
    (ev() + ev(event_id="e2"), "invalid_json"),
    (ev() + b" garbage", "invalid_json"),
    (ev() + b", " + ev(event_id="e2"), "invalid_json"),
    (ev() + b",0", "invalid_json"),
    (ev() + b",0,null", "invalid_json"),
    (ev() + b"]", "invalid_json"),
    # Text that closes the parser's own wrapper early, then more: the wrapper's shape alone
    # would accept it.
    (ev() + b",0] garbage", "invalid_json"),
    (ev() + b" , 0 ] " + ev(event_id="e2"), "invalid_json"),
]


def test_every_malformed_record_is_quarantined_with_its_reason(spark):
    values = [c[0] for c in BAD_CASES]
    valid, bad = split(spark, values)
    assert not valid, list(valid)
    got = {o: bad[o].reason for o in bad}
    assert got == {i: reason for i, (_, reason) in enumerate(BAD_CASES)}
    assert {r for _, r in BAD_CASES} <= set(REASONS)
    # Raw bytes are kept (base64), with position and a readable detail where it helps.
    import base64

    assert base64.b64decode(bad[3].raw_value) == BAD_CASES[3][0]
    assert bad[0].value_bytes == 3000 and "MAX_EVENT_BYTES=2048" in bad[0].detail
    assert "0.1234567" in bad[25].detail
    assert bad[26].detail.startswith("value=1.0000000000000001")
    assert bad[5].quarantine_date.isoformat() == "2026-11-21"
    assert bad[42].detail.startswith("more text after the JSON value")
    assert bad[4].detail is None  # not JSON at all: no such claim
    assert "LAKEHOUSE_START_DATE=2025-01-01" in bad[34].detail
    assert bad[36].detail == "event_id is a JSON object, not a string"
    assert bad[39].detail == "key is a JSON array, not a string"


def test_future_skew_boundary_is_inclusive(spark):
    valid, bad = split(spark, [ev(event_time="2026-11-21T14:06:00Z")])  # exactly 5 min
    assert list(valid) == [0] and not bad


def test_kafka_timestamp_policy_drives_windows_from_broker_time(spark):
    s = Settings.from_env({"TIMESTAMP_POLICY": "kafka_timestamp"})
    valid, _ = split(spark, [ev(event_time="2026-11-20T01:00:00Z")], s)
    assert utc(valid[0].event_time) == BROKER_TIME
    assert utc(valid[0].payload_event_time) == datetime(2026, 11, 20, 1, 0, tzinfo=UTC)
    assert valid[0].event_date.isoformat() == "2026-11-21"


def test_a_classification_is_built_once_for_each_spec_and_limits(spark):
    """The built expressions are reused by an equal settings value (a new run's), never by
    another limit: a stale build would let the 200-byte limit's oversized record through."""
    from spark_jobs.transforms import parse

    record = ev(attributes={"note": "x" * 200})
    valid, bad = split(spark, [record], Settings.from_env({"MAX_EVENT_BYTES": "2048"}))
    assert list(valid) == [0] and not bad
    built = dict(parse._BUILT)
    valid, bad = split(spark, [record], Settings.from_env({"MAX_EVENT_BYTES": "2048"}))
    assert list(valid) == [0]
    assert parse._BUILT.keys() == built.keys() and all(  # the same build, not a second one
        parse._BUILT[k] is b for k, b in built.items())
    valid, bad = split(spark, [record], Settings.from_env({"MAX_EVENT_BYTES": "200"}))
    assert not valid and bad[0].reason == "payload_too_large"
    assert bad[0].detail.endswith("> MAX_EVENT_BYTES=200")
    # Another time policy after the default's build: its own (the event time is the broker's).
    valid, _ = split(spark, [record], Settings.from_env(
        {"MAX_EVENT_BYTES": "2048", "TIMESTAMP_POLICY": "kafka_timestamp"}))
    assert utc(valid[0].event_time) == BROKER_TIME


near_valid = st.fixed_dictionaries(
    {},
    optional={
        "event_id": st.one_of(st.text(max_size=8), st.integers(), st.none()),
        "key": st.one_of(st.text(max_size=8), st.none(), st.booleans()),
        "event_time": st.one_of(
            st.integers(min_value=-10, max_value=2**53), st.text(max_size=30),
            st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        ),
        "value": st.one_of(
            st.decimals(allow_nan=True, allow_infinity=True).map(str),
            st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.text(max_size=10),
        ),
        "attributes": st.one_of(st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
                                st.text(max_size=5)),
    },
).map(lambda d: json.dumps(d).encode())
payloads = st.lists(st.one_of(st.binary(max_size=64), near_valid, st.none()), min_size=1,
                    max_size=150)


@hsettings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(payloads)
def test_fuzz_every_record_lands_exactly_once(spark, values):
    valid, bad = split(spark, values)
    assert set(valid) | set(bad) == set(range(len(values)))
    assert not set(valid) & set(bad)
    for row in valid.values():
        assert row.event_id and row.key and row.event_time is not None
        assert row.value is not None and abs(row.value) < Decimal(10) ** 18
        assert row.event_date >= SETTINGS.partitions_start_date
    for row in bad.values():
        assert row.reason in REASONS
