"""Avro record values -> the decoded record's typed fields, with native Spark functions only.

Each record is decoded once by Spark's `from_avro` (spark-avro), with its writer schema (the
Confluent header's schema id picks it; `plain`: the one schema) and the spec's reader schema
(option `avroSchema`), so every version decodes into one struct, `__record`. The classification
(`spark_jobs.transforms.parse`) reads its fields as they are typed: a decimal (Avro's decimal
logical type) or an integer measure is checked as a number, a timestamp-millis time is a
timestamp already, strings are the JSON path's text; no field passes through a VARIANT.

A record that does not decode is `invalid_avro`, found by a field the reader schema gets with a
default (`lakehouse.events.avro.DECODED_FIELD`): in PERMISSIVE mode Spark turns a record it cannot
decode into all-null fields, which the field's null tells from a record whose fields are null.
Avro binary has no length: bytes left after a record that decodes are not detected.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from lakehouse.events.avro import DECODED_FIELD, AvroInput, branches, kind
from spark_jobs.transforms.projections import Projections

HEADER_BYTES = 5  # Confluent: magic byte 0, then the schema id (4 bytes, big-endian)


def schema_id(value: Column) -> Column:
    """The schema id of a Confluent-framed value (bytes 2-5, big-endian)."""
    return F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")


def _has_header(value: Column) -> Column:
    return (F.octet_length(value) >= HEADER_BYTES) & (F.hex(F.substring(value, 1, 1)) == "00")


def decode(df: Projections, avro: AvroInput, attempt: Column) -> Projections:
    """`df` (with `__raw_value`) plus `__header_ok`, `__schema_id` and `__record` (the reader
    schema's struct; null, or all fields null, when it was not decoded: not attempted, no header,
    unknown id, bytes that do not decode: `decoded`). `attempt`: which rows to decode at all
    (CASE WHEN is lazy)."""
    if avro.pending:
        raise RuntimeError(f"the writer schemas of registry {avro.registry.url} (subject "
                           f"{avro.registry.subject}) were not fetched: run with "
                           "lakehouse.events.schema_registry.with_registry_schemas(settings)")
    value = F.col("__raw_value")
    if avro.wire_format == "confluent":
        header_ok, sid_col = _has_header(value), schema_id(value)
        body = F.expr(f"substring(__raw_value, {HEADER_BYTES + 1})")
    else:
        (only,) = avro.schemas
        header_ok, sid_col, body = F.lit(True), F.lit(only).cast("long"), value
    df = df.add(header_ok.alias("__header_ok"), sid_col.alias("__schema_id"))
    options = {"mode": "PERMISSIVE", "avroSchema": avro.reader_json()}
    record = None
    for sid, writer in sorted(avro.schemas.items()):
        decoded = from_avro(body, writer.text, options)
        condition = attempt & F.col("__header_ok") & (F.col("__schema_id") == sid)
        record = (F.when if record is None else record.when)(condition, decoded)
    return df.add(record.alias("__record"))


def decoded() -> Column:
    """True for a record `decode` decoded."""
    return F.coalesce(F.col("__record")[DECODED_FIELD], F.lit(False))


def field_kinds(avro: AvroInput) -> dict[str, str]:
    """The reader schema's fields and what each holds (`lakehouse.events.avro.kind` of its
    non-null branch; `union` for a union of several types)."""
    out = {}
    for name, t in avro.reader_schema.fields.items():
        bs, _ = branches(t)
        out[name] = kind(bs[0]) if len(bs) == 1 else "union"
    return out


def decimal_scale(avro: AvroInput, name: str) -> int:
    """A reader field's decimal scale (0 for an integer)."""
    (t, *_), _ = branches(avro.reader_schema.fields[name])
    return int(t.get("scale", 0)) if isinstance(t, dict) else 0


def attributes(avro: AvroInput) -> Column:
    """The record's `attributes` field as JSON text (a string as itself), as the JSON path
    reads `$.attributes`; null when the reader schema has none."""
    if "attributes" not in avro.reader_schema.fields:
        return F.lit(None).cast("string")
    one = F.to_variant_object(F.struct(F.col("__record")["attributes"].alias("attributes")))
    return F.try_variant_get(one, "$.attributes", "string")


def record_reason(reason: Column, avro: AvroInput) -> Column:
    """The record-level reason codes of an Avro value, after `empty_payload`."""
    reason = reason.when(~F.col("__header_ok"), "invalid_avro")
    if avro.wire_format == "confluent":
        reason = reason.when(~F.col("__schema_id").isin(*avro.schemas), "unknown_schema_id")
    return reason.when(~decoded(), "invalid_avro")


def record_detail(detail: Column, reason: Column, avro: AvroInput) -> Column:
    """Human-readable details of `unknown_schema_id` and `invalid_avro` (rejected rows only:
    read from `__raw_value`)."""
    value = F.col("__raw_value")
    ids = ", ".join(map(str, sorted(avro.schemas)))
    if avro.wire_format == "plain":
        (schema,) = avro.schemas.values()
        return detail.when(reason == "invalid_avro",
                           F.lit(f"the bytes do not decode as Avro of {schema.source}"))
    sid = schema_id(value)
    known = (f"registered under subject {avro.registry.subject}" if avro.registry
             else "one of the spec's")
    which = None
    for s, schema in sorted(avro.schemas.items()):
        which = (F.when if which is None else which.when)(sid == s, F.lit(schema.source))
    return (
        detail.when(reason == "unknown_schema_id",
                    F.format_string(f"schema id %d is not {known} ({ids})", sid))
        .when((reason == "invalid_avro") & (F.octet_length(value) < HEADER_BYTES),
              F.format_string("%d bytes: shorter than the Confluent header (magic byte 0, "
                              "4-byte schema id)", F.octet_length(value)))
        .when((reason == "invalid_avro") & ~_has_header(value),
              F.concat(F.lit("first byte 0x"), F.hex(F.substring(value, 1, 1)),
                       F.lit(" is not the Confluent magic byte 0")))
        .when(reason == "invalid_avro",
              F.concat(F.lit("the bytes after the header do not decode as schema id "),
                       sid.cast("string"), F.lit(" ("), which, F.lit(")")))
    )
