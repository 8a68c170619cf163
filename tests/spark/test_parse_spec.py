"""The parser for a spec's event shape on real Spark: the declared fields become columns, each
field's own reason codes, the declared time forms only, exact decimals at the declared scale."""

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from lakehouse.config.settings import Settings, utc
from lakehouse.specs.pipeline import load_spec
from spark_jobs.transforms.parse import parsed_events, reasons

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BROKER_TIME = datetime(2026, 11, 21, 14, 1, tzinfo=UTC)
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def settings_of(name: str, tmp_path) -> Settings:
    return load_spec(EXAMPLES / name).settings(
        Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)}), {})


def split(spark, settings, values):
    rows = [(b"k", v, "t", 0, i, BROKER_TIME) for i, v in enumerate(values)]
    with parsed_events(spark.createDataFrame(rows, SCHEMA), settings) as (valid, bad):
        return ({r.offset: r for r in valid.collect()}, {r.offset: r for r in bad.collect()})


def order(**fields) -> bytes:
    base = {"order_id": "o1", "created_at": "2026-11-21T14:00:05.123Z", "region": "eu-west",
            "currency": "EUR", "amount": "19.99"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_orders_parse_into_their_declared_columns(spark, tmp_path):
    s = settings_of("orders.yaml", tmp_path)
    valid, bad = split(spark, s, [
        order(), order(amount=-5), order(amount=1.5e2), order(created_at=1795168846100),
        order(amount="7.50000"),  # trailing zeros are not precision
    ])
    assert not bad, {o: r.reason for o, r in bad.items()}
    first = valid[0]
    assert list(first.asDict())[:6] == ["event_id", "region", "currency", "event_time",
                                        "payload_event_time", "amount"]
    assert (first.event_id, first.region, first.currency, first.amount) == (
        "o1", "eu-west", "EUR", Decimal("19.99"))
    assert utc(first.event_time) == datetime(2026, 11, 21, 14, 0, 5, 123000, tzinfo=UTC)
    assert [valid[i].amount for i in (1, 2, 4)] == [Decimal("-5.00"), Decimal("150.00"),
                                                   Decimal("7.50")]
    assert utc(valid[3].event_time) == datetime(2026, 11, 20, 10, 0, 46, 100000, tzinfo=UTC)


def test_each_field_has_its_own_reason(spark, tmp_path):
    s = settings_of("orders.yaml", tmp_path)
    cases = {
        "missing_event_id": order(order_id=...),
        "missing_region": order(region=...),
        "missing_currency": order(currency=" "),
        "invalid_region": order(region=["eu"]),
        "missing_amount": order(amount=...),
        "missing_event_time": order(created_at=...),
        "invalid_event_time": order(created_at="yesterday"),
        "invalid_amount": order(amount="12,50 EUR"),
        "amount_too_precise": order(amount="0.001"),
        "amount_out_of_range": order(amount="12345678901234567.00"),
        "event_time_in_future": order(created_at="2036-01-01T00:00:00Z"),
    }
    valid, bad = split(spark, s, list(cases.values()))
    assert not valid
    got = {bad[i].reason: bad[i].detail for i in range(len(cases))}
    assert list(got) == list(cases)
    assert set(got) <= set(reasons(s.shape))
    assert got["invalid_event_time"] == ("created_at=yesterday is neither epoch milliseconds "
                                         "nor ISO-8601 with an offset")
    assert "at most 2 fractional digits" in got["amount_too_precise"]
    assert got["invalid_region"] == "region is a JSON array, not a string"


def test_only_the_declared_time_forms_count(spark, tmp_path):
    s = settings_of("app_events.yaml", tmp_path)  # epoch seconds only
    event = {"id": "a1", "event_type": "tap"}
    valid, bad = split(spark, s, [
        json.dumps({**event, "ts": 1795168846}).encode(),
        json.dumps({**event, "ts": "1795168846.25"}).encode(),
        json.dumps({**event, "ts": "2026-11-21T14:00:05Z"}).encode(),
    ])
    assert [utc(valid[i].event_time) for i in (0, 1)] == [
        datetime(2026, 11, 20, 10, 0, 46, tzinfo=UTC),
        datetime(2026, 11, 20, 10, 0, 46, 250000, tzinfo=UTC)]
    assert bad[2].reason == "invalid_event_time" and "is not epoch seconds" in bad[2].detail
    assert list(valid[0].asDict())[:4] == ["event_id", "event_type", "event_time",
                                           "payload_event_time"]


def test_the_default_reasons_are_the_contract():
    from lakehouse.events.shape import DEFAULT_SHAPE
    from spark_jobs.transforms.parse import REASONS

    assert reasons(DEFAULT_SHAPE) == REASONS == (
        "payload_too_large", "empty_payload", "invalid_utf8", "invalid_json", "not_an_object",
        "missing_event_id", "missing_key", "invalid_event_id", "invalid_key",
        "missing_event_time", "missing_value", "invalid_event_time", "invalid_value",
        "value_too_precise", "value_out_of_range", "event_time_in_future",
        "event_time_before_start")
