"""Nested JSON fields declared by path (`fields: {customer.address.country: string}`): named
with `_` for the dots (or renamed by the spec), read from the VARIANT at their path on real
Spark, their reason codes by that name and their details naming the path; the generator and the
reference build and read the same nested events."""

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from lakehouse.config.settings import Settings, utc
from specs.pipeline import SpecError, parse_spec
from transforms.parse import parsed_events, reasons

SHOP = {
    "name": "shop", "topic": "shop",
    "fields": {"order.id": "string", "order.created_at": "timestamp",
               "customer.address.country": "string", "order.total.amount": "decimal(12,2)",
               "channel": "string"},
    "event_id": "order.id", "event_time": {"field": "order.created_at"},
    "dimensions": ["customer.address.country", {"name": "sales_channel", "field": "channel"}],
    "measures": [{"field": "order.total.amount", "name": "revenue"}],
}
SPEC = parse_spec(SHOP)
BROKER_TIME = datetime(2026, 11, 21, 14, 1, tzinfo=UTC)
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def test_a_path_is_a_field_named_with_underscores():
    shape = SPEC.shape
    assert shape.paths == {"order_id": "order.id", "order_created_at": "order.created_at",
                           "customer_address_country": "customer.address.country",
                           "order_total_amount": "order.total.amount"}
    assert (shape.event_id, shape.event_time.field) == ("order_id", "order_created_at")
    assert shape.dimension_names == ("customer_address_country", "sales_channel")
    assert shape.measure_fields == ("order_total_amount",)
    assert shape.measure_columns == ("event_count", "revenue_sum", "revenue_min", "revenue_max",
                                     "event_fingerprint")
    codes = reasons(shape)
    assert {"missing_customer_address_country", "invalid_order_total_amount",
            "order_total_amount_too_precise"} <= set(codes)
    assert shape.path_of("channel") == "channel"
    flat = parse_spec({**SHOP, "fields": {k.replace(".", "_"): v
                                          for k, v in SHOP["fields"].items()},
                       "event_id": "order_id", "event_time": {"field": "order_created_at"},
                       "dimensions": ["customer_address_country",
                                      {"name": "sales_channel", "field": "channel"}],
                       "measures": [{"field": "order_total_amount", "name": "revenue"}]})
    base = Settings.from_env({})
    # Same columns, another spec version: where the fields are read from differs.
    assert flat.shape.dimension_names == shape.dimension_names and not flat.shape.paths
    assert flat.settings(base, {}).results_version != SPEC.settings(base, {}).results_version


@pytest.mark.parametrize(("change", "needle"), [
    ({"fields": {**SHOP["fields"], "order_total_amount": "string"}},
     "fields.order.total.amount: its column name 'order_total_amount' is also declared"),
    ({"fields": {**SHOP["fields"], "customer.address_country": "string"}},
     "column name 'customer_address_country' is also field 'customer.address.country'"),
    ({"fields": {**SHOP["fields"], "customer.Address": "string"}},
     "fields.customer.Address: 'Address' is not a path segment"),
    ({"dimensions": ["customer.address.city"]},
     "dimensions[0]: 'customer.address.city' is not a declared field"),
    ({"paths": {"a": "b"}}, "paths: Extra inputs are not permitted"),  # not a spec key
    ({"format": "avro", "avro": {"schemas": {1: {"type": "record", "name": "R",
                                                 "fields": [{"name": "x", "type": "string"}]}}}},
     "nested fields are read from JSON events"),
])
def test_a_bad_path_is_refused_with_its_field(change, needle):
    with pytest.raises(SpecError) as err:
        parse_spec({**SHOP, **change})
    assert needle in str(err.value), err.value


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
