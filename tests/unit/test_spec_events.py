"""Generated events for any pipeline spec and the plain-Python reference: no Kafka, no Spark."""

import json
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.specs.pipeline import load_spec, parse_spec
from testkit.generator import GeneratorConfig, Record, _encode
from testkit.reference import VALID_KINDS
from testkit.spec_events import (
    expected_windows_for_spec,
    generate_for_spec,
    malformed_kinds,
    parse_time,
    table_windows_for_spec,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ORDERS = load_spec(EXAMPLES / "orders.yaml")
APPS = load_spec(EXAMPLES / "app_events.yaml")
# Every field type, a wide scale, a dimension renamed, two measures on one field, ISO and seconds.
WIDE = parse_spec({
    "name": "meters", "topic": "meters",
    "fields": {"id": "long", "at": "timestamp", "site": "string", "unit": "int",
               "day": "date", "kwh": "decimal(38,10)", "price": "decimal(5,5)"},
    "event_id": "id", "event_time": {"field": "at", "formats": ["iso8601", "epoch_seconds"]},
    "dimensions": [{"name": "site_name", "field": "site"}, "unit", "day"],
    "measures": [{"field": "kwh"}, {"field": "kwh", "name": "peak", "aggregates": ["max"]},
                 {"field": "price", "aggregates": ["sum"]}],
    "window": {"size": "5 minutes"}})
SPECS = pytest.mark.parametrize("spec", [ORDERS, APPS, WIDE], ids=lambda s: s.name)
END = datetime(2026, 11, 21, 0, 30, tzinfo=UTC)


def cfg(**kw) -> GeneratorConfig:
    return GeneratorConfig(**{"count": 4000, "seed": 5, "end": END, "span": timedelta(hours=6),
                              "malformed_fraction": 0.02, **kw})


def test_the_kinds_are_the_parser_reason_codes_of_the_spec():
    assert malformed_kinds(ORDERS) == (
        "invalid_json", "not_an_object", "invalid_utf8", "missing_event_id", "missing_region",
        "missing_currency", "missing_amount", "invalid_event_time", "invalid_amount",
        "amount_too_precise", "event_time_in_future", "event_time_before_start")
    assert malformed_kinds(APPS) == (
        "invalid_json", "not_an_object", "invalid_utf8", "missing_event_id",
        "missing_event_type", "invalid_event_time", "event_time_in_future",
        "event_time_before_start")  # no measures: no measure kinds
    kinds = malformed_kinds(WIDE)
    assert {"missing_site_name", "missing_kwh", "price_too_precise"} <= set(kinds)
    assert kinds.count("missing_kwh") == 1 and "missing_site" not in kinds
    # A dimension on the id's field or on another dimension's: its absence is reported as that.
    shared = parse_spec({
        "name": "o", "topic": "o", "fields": {"id": "string", "at": "timestamp", "shop": "string"},
        "event_id": "id", "event_time": {"field": "at"}, "measures": [],
        "dimensions": [{"name": "order", "field": "id"}, "shop", {"name": "store", "field": "shop"}]})
    assert [k for k in malformed_kinds(shared) if k.startswith("missing_")] == [
        "missing_event_id", "missing_shop"]


@SPECS
def test_same_seed_same_bytes_another_seed_others(spec):
    a, b = generate_for_spec(spec, cfg()), generate_for_spec(spec, cfg())
    c = generate_for_spec(spec, cfg(seed=6))
    assert [(r.key, r.value, r.kind) for r in a.records] == [
        (r.key, r.value, r.kind) for r in b.records]
    assert [r.value for r in a.records] != [r.value for r in c.records]


@SPECS
def test_every_kind_appears_and_malformed_records_are_what_they_say(spec):
    g = generate_for_spec(spec, cfg())
    kinds = g.kinds()
    assert len(g.records) == 4000
    for kind in (*VALID_KINDS, *malformed_kinds(spec)):
        assert kinds[kind] > 0, kind
    assert set(kinds) == {*VALID_KINDS, *malformed_kinds(spec)}
    shape = spec.shape
    for r in g.records:
        if r.kind in VALID_KINDS:
            assert r.event is not None and r.value == _encode(r.event)
            assert r.key == str(r.event[shape.dimensions[0].source]).encode()
            continue
        assert r.event is None
        try:
            e = json.loads(r.value.decode())
        except UnicodeDecodeError:
            assert r.kind == "invalid_utf8"
            continue
        except json.JSONDecodeError:
            assert r.kind == "invalid_json"
            continue
        if r.kind == "not_an_object":
            assert isinstance(e, list)
        elif r.kind == "missing_event_id":
            assert shape.event_id not in e
        elif r.kind.startswith("missing_"):
            assert set(shape.fields) - set(e) == {
                {d.name: d.source for d in shape.dimensions}.get(r.kind[8:], r.kind[8:])}
        elif r.kind.startswith("event_time_"):
            t = parse_time(spec, e[shape.event_time.field])
            assert t.year == 1970 if r.kind.endswith("start") else t > END + timedelta(days=3000)
        elif r.kind == "invalid_event_time":
            with pytest.raises(ValueError):
                parse_time(spec, e[shape.event_time.field])


@SPECS
def test_valid_times_parse_into_the_span_in_every_declared_form(spec):
    c = cfg()
    g = generate_for_spec(spec, c)
    forms = Counter()
    for r in g.records:
        if r.kind in VALID_KINDS:
            raw = r.event[spec.shape.event_time.field]
            t = parse_time(spec, raw)
            assert t.tzinfo is not None
            # epoch seconds drop the milliseconds: up to a second earlier
            assert END - c.span - c.disorder - timedelta(seconds=1) <= t <= END, raw
            forms["int" if isinstance(raw, int) else "digits" if raw.isdigit()
                  else raw[-1] if raw.endswith("Z") else raw[-6:]] += 1
    declared = spec.shape.event_time.formats
    expected = {*(("Z", "+00:00") if "iso8601" in declared else ()),
                *(("int", "digits") if "epoch_millis" in declared else ()),
                *(("int",) if "epoch_seconds" in declared else ())}
    assert set(forms) == expected


@SPECS
def test_measures_keep_the_declared_scale_and_precision_and_mix_numbers_and_strings(spec):
    g = generate_for_spec(spec, cfg())
    seen = Counter()
    for r in g.records:
        if r.kind not in VALID_KINDS:
            continue
        e = json.loads(r.value, parse_float=Decimal)
        for f in spec.shape.measure_fields:
            p, s = (int(x) for x in spec.shape.fields[f][8:-1].split(","))
            v = Decimal(e[f])
            assert v.as_tuple().exponent >= -s, (f, e[f])
            assert abs(v) < Decimal(10) ** (p - s), (f, e[f])
            seen[f, type(e[f]).__name__] += 1
            seen[f, "refund"] += v < 0
            seen[f, "fewer digits"] += v.as_tuple().exponent > -s
    for f in spec.shape.measure_fields:
        assert all(seen[f, what] > 0 for what in ("str", "Decimal", "refund", "fewer digits")), seen


def test_wide_dimensions_have_their_types():
    g = generate_for_spec(WIDE, cfg(count=500))
    windows = expected_windows_for_spec(WIDE, g.records)
    start, site, unit, day = next(iter(windows))
    assert start.tzinfo is None and start.minute % 5 == 0 and start.second == 0
    assert (type(site), type(unit), type(day)) == (str, int, date)
    assert set(next(iter(windows.values()))) == {
        "event_count", "kwh_sum", "kwh_min", "kwh_max", "peak_max", "price_sum"}


def record(kind: str, order_id: str, at, amount, region: str = "eu-west") -> Record:
    event = {"order_id": order_id, "created_at": at, "region": region, "currency": "EUR",
             "amount": amount}
    return Record(region.encode(), _encode(event), kind, event)


def test_a_hand_counted_case():
    """Two windows; a re-send of o-1 with another amount is dropped (the first arrival counts);
    a malformed record counts nowhere."""
    noon = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    ms = int((noon + timedelta(seconds=40)).timestamp()) * 1000
    records = [
        record("event", "o-1", "2026-11-21T12:00:10.000Z", "10.50"),
        record("event", "o-2", str(ms), 2.25),
        record("duplicate", "o-1", "2026-11-21T12:00:10.000Z", "99.99"),
        record("late", "o-3", "2026-11-21T12:01:05.250+00:00", "-3"),
        record("invalid_amount", "o-4", "2026-11-21T12:01:06.000Z", "12,50 EUR"),
    ]
    assert expected_windows_for_spec(ORDERS, records) == {
        (datetime(2026, 11, 21, 12, 0), "eu-west", "EUR"): {
            "event_count": 2, "amount_sum": Decimal("12.75"), "amount_min": Decimal("2.25"),
            "amount_max": Decimal("10.50")},
        (datetime(2026, 11, 21, 12, 1), "eu-west", "EUR"): {
            "event_count": 1, "amount_sum": Decimal("-3.00"), "amount_min": Decimal("-3.00"),
            "amount_max": Decimal("-3.00")},
    }
    sums = expected_windows_for_spec(ORDERS, records).values()
    assert [str(w["amount_sum"]) for w in sums] == ["12.75", "-3.00"]  # at the column's scale


def test_dedup_keeps_the_first_arrival_per_event_date():
    first = record("event", "o-1", "2026-11-21T23:59:59.999Z", "1.00", region="us-east")
    again = record("duplicate", "o-1", "2026-11-21T23:59:59.999Z", "5.00", region="ap-south")
    next_day = record("late_duplicate", "o-1", "2026-11-22T00:00:00.000Z", "7.00")
    got = expected_windows_for_spec(ORDERS, [first, again, next_day])
    assert sorted((k[0].day, k[1], v["amount_sum"]) for k, v in got.items()) == [
        (21, "us-east", Decimal("1.00")), (22, "eu-west", Decimal("7.00"))]
    got = expected_windows_for_spec(ORDERS, [again, first])
    assert [(k[1], v["event_count"]) for k, v in got.items()] == [("ap-south", 1)]


def test_app_events_count_per_ten_seconds_in_epoch_seconds():
    def app(i: str, ts, kind: str = "event") -> Record:
        event = {"id": i, "ts": ts, "event_type": "purchase"}
        return Record(b"purchase", _encode(event), kind, event)

    t = int(datetime(2026, 11, 21, 12, 0, tzinfo=UTC).timestamp())
    got = expected_windows_for_spec(APPS, [app("a", t + 9), app("b", t), app("c", t + 10),
                                           app("a", t + 9, "duplicate")])
    assert got == {(datetime(2026, 11, 21, 12, 0, 0), "purchase"): {"event_count": 2},
                   (datetime(2026, 11, 21, 12, 0, 10), "purchase"): {"event_count": 1}}


def test_parse_time_takes_only_the_declared_forms():
    at = datetime(2026, 11, 21, 12, 0, 0, 123000, tzinfo=UTC)
    assert parse_time(ORDERS, "2026-11-21T12:00:00.123Z") == at
    assert parse_time(ORDERS, "2026-11-21T13:00:00.123+01:00") == at
    assert parse_time(ORDERS, 1795262400123) == parse_time(ORDERS, "1795262400123") == at
    assert parse_time(APPS, 1795262400) == at.replace(microsecond=0)
    for spec, raw in ((APPS, "2026-11-21T12:00:00Z"), (ORDERS, "2026-11-21T12:00:00"),
                      (ORDERS, "yesterday at noon"), (ORDERS, True)):
        with pytest.raises(ValueError):
            parse_time(spec, raw)


@pytest.fixture()
def tokyo_host(monkeypatch):
    """The Python process in Tokyo: a naive timestamp must never be read as local time."""
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("tokyo_host")
@pytest.mark.parametrize("tz", ["UTC", "Asia/Tokyo", None])
def test_a_table_reads_back_in_the_reference_shape(tz):
    g = generate_for_spec(ORDERS, cfg(count=800))
    expected = expected_windows_for_spec(ORDERS, g.records)
    rows = [{"window_start": k[0].replace(tzinfo=UTC) if tz else k[0], "region": k[1],
             "currency": k[2], "event_fingerprint": Decimal(7), **v}
            for k, v in expected.items()]
    schema = pa.schema([("window_start", pa.timestamp("us", tz=tz)), ("region", pa.string()),
                        ("currency", pa.string()), ("event_count", pa.int64()),
                        ("amount_sum", pa.decimal128(38, 2)), ("amount_min", pa.decimal128(18, 2)),
                        ("amount_max", pa.decimal128(18, 2)),
                        ("event_fingerprint", pa.decimal128(38, 0))])
    table = pa.Table.from_pylist(rows, schema=schema)
    assert table_windows_for_spec(ORDERS, table) == expected
    changed = table.set_column(3, "event_count", pa.array([1] * len(rows), pa.int64()))
    assert table_windows_for_spec(ORDERS, changed) != expected


def test_a_non_utc_host_generates_and_counts_the_same(monkeypatch):
    """The same bytes and windows with the host in Tokyo and `end` in its local time."""
    import time

    in_utc = generate_for_spec(ORDERS, cfg(count=1000))
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert time.localtime(END.timestamp()).tm_hour == 9
        local = generate_for_spec(ORDERS, cfg(count=1000, end=END.astimezone()))
        windows = expected_windows_for_spec(ORDERS, local.records)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [r.value for r in local.records] == [r.value for r in in_utc.records]
    assert windows == expected_windows_for_spec(ORDERS, in_utc.records)
    assert {k[0].date() for k in windows} == {date(2026, 11, 20), date(2026, 11, 21)}
