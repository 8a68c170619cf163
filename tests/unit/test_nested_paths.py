"""Nested JSON fields declared by path (`fields: {customer.address.country: string}`) in the
spec: named with `_` for the dots (or renamed by the spec), their reason codes by that name, a
bad path refused naming its field (read on Spark: tests/spark/test_nested_fields.py)."""

import pytest

from lakehouse.config.settings import Settings
from lakehouse.specs.pipeline import SpecError, parse_spec
from spark_jobs.transforms.parse import reasons

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



@pytest.mark.parametrize("path", ["a", "a..b", "A.b", "a.b']", "a.b; drop", "a.$b", "a.b.*"])
def test_a_path_given_directly_is_dotted_identifiers_only(path):
    shape = {**SPEC.shape.model_dump(exclude={"avro"}), "paths": {"customer_address_country": path}}
    with pytest.raises(SpecError, match=r"paths.customer_address_country: .* is not a dotted "
                                        "path of lower-case identifiers"):
        parse_spec({"name": "shop", "topic": "shop", "shape": shape})
    assert parse_spec({"name": "shop", "topic": "shop", "shape": {
        **shape, "paths": SPEC.shape.paths}}).shape.paths == SPEC.shape.paths
