"""Nested JSON fields declared by path (`fields: {customer.address.country: string}`), read from
the VARIANT at their path on real Spark, their reason codes by their names and their details
naming the path; the generator and the reference build and read the same nested events (the
spec's side: tests/unit/test_nested_paths.py)."""

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from test_nested_paths import SPEC

from lakehouse.config.settings import Settings, utc
from spark_jobs.transforms.parse import parsed_events

BROKER_TIME = datetime(2026, 11, 21, 14, 1, tzinfo=UTC)
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def event(**changes) -> bytes:
    e = {"order": {"id": "o1", "created_at": "2026-11-21T14:00:05.123Z",
                   "total": {"amount": "19.99"}},
         "customer": {"address": {"country": "DE", "amount": 1.2345}}, "channel": "web"}
    for path, value in changes.items():
        node, (*outer, leaf) = e, path.split("__")
        for key in outer:
            node = node[key]
        if value is ...:
            node.pop(leaf)
        else:
            node[leaf] = value
    return json.dumps(e).encode()


def split(spark, settings, values):
    rows = [(b"k", v, "t", 0, i, BROKER_TIME) for i, v in enumerate(values)]
    with parsed_events(spark.createDataFrame(rows, SCHEMA), settings) as (valid, bad):
        return ({r.offset: r for r in valid.collect()}, {r.offset: r for r in bad.collect()})


def test_nested_fields_are_read_at_their_paths_with_their_reasons(spark, tmp_path):
    settings = SPEC.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)}), {})
    values = [
        event(), event(order__total__amount=1.5e2),  # exponent notation: re-read exactly
        event(order__total__amount=-0.07, order__id=123),
        event(customer__address__country=...), event(customer__address=...),
        event(order__total__amount=1.234e-1), event(customer__address__country=["x"]),
        event(order__total__amount="12,50"), event(order__id=...),
        event(order__created_at="yesterday"),
    ]
    valid, bad = split(spark, settings, values)
    assert sorted(valid) == [0, 1, 2]
    assert list(valid[0].asDict())[:6] == ["event_id", "customer_address_country",
                                           "sales_channel", "event_time", "payload_event_time",
                                           "order_total_amount"]
    assert [(v.event_id, v.customer_address_country, v.sales_channel, v.order_total_amount)
            for v in valid.values()] == [("o1", "DE", "web", Decimal("19.99")),
                                         ("o1", "DE", "web", Decimal("150.00")),
                                         ("123", "DE", "web", Decimal("-0.07"))]
    assert utc(valid[0].event_time) == datetime(2026, 11, 21, 14, 0, 5, 123000, tzinfo=UTC)
    assert {o: (r.reason, r.detail) for o, r in bad.items()} == {
        3: ("missing_customer_address_country", "no value at customer.address.country"),
        4: ("missing_customer_address_country", "no value at customer.address.country"),
        # 1.234e-1 has 4 digits at the scale 2: the literal of the path's key decides (the
        # `amount` of customer.address is another number).
        5: ("order_total_amount_too_precise", "order.total.amount=0.1234 (exact decimal, at "
                                              "most 2 fractional digits, |v| < 10000000000)"),
        6: ("invalid_customer_address_country",
            "customer.address.country is a JSON array, not a string"),
        7: ("invalid_order_total_amount", "order.total.amount=12,50 (exact decimal, at most 2 "
                                          "fractional digits, |v| < 10000000000)"),
        8: ("missing_event_id", None),
        9: ("invalid_event_time",
            "order.created_at=yesterday is neither epoch milliseconds nor ISO-8601 with an "
            "offset"),
    }


def test_generated_nested_events_are_classified_as_the_reference_reads_them(spark, tmp_path):
    from testkit.generator import GeneratorConfig
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import generate_for_spec, malformed_kinds, rows_for_spec

    settings = SPEC.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path),
                                                "LAKEHOUSE_START_DATE": "2026-01-01"}), {})
    g = generate_for_spec(SPEC, GeneratorConfig(
        count=600, seed=3, end=datetime(2026, 11, 21, 12, tzinfo=UTC), span=timedelta(hours=4),
        malformed_fraction=0.1))
    assert set(malformed_kinds(SPEC)) <= set(g.kinds())
    first = next(r for r in g.records if r.kind == "event")
    assert set(json.loads(first.value)) == {"order", "customer", "channel"}
    assert set(json.loads(first.value)["customer"]["address"]) == {"country"}
    valid, bad = split(spark, settings, [r.value for r in g.records])
    assert Counter(r.reason for r in bad.values()) == Counter(
        r.kind for r in g.records if r.kind not in VALID_KINDS)
    rows = rows_for_spec(SPEC, g.records)
    assert [(r.event_id, r.time, r.dimensions, r.values["order_total_amount"]) for r in rows] == [
        (v.event_id, utc(v.event_time), (v.customer_address_country, v.sales_channel),
         v.order_total_amount) for v in (valid[i] for i in sorted(valid))]
