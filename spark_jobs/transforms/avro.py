"""Avro record values -> the VARIANT the JSON path parses into, with native Spark functions only.

Each record is decoded once by Spark's `from_avro` (spark-avro), with its writer schema (the
Confluent header's schema id picks it; `plain`: the one schema) and the spec's reader schema
(option `avroSchema`), so every version decodes into one struct; the struct becomes a VARIANT
object (`to_variant_object`) and the classification goes on as for JSON: per-field reason codes,
exact decimals (Avro's decimal logical type is a Spark decimal, kept exact in the VARIANT), the
time forms. A timestamp-millis field enters the VARIANT as its epoch milliseconds.

A record that does not decode is `invalid_avro`, found by a field the reader schema gets with a
default (`lakehouse.events.avro.DECODED_FIELD`): in PERMISSIVE mode Spark turns a record it cannot
decode into all-null fields, which the field's null tells from a record whose fields are null.
Avro binary has no length: bytes left after a record that decodes are not detected.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from lakehouse.events.avro import DECODED_FIELD, AvroInput, branches, kind

HEADER_BYTES = 5  # Confluent: magic byte 0, then the schema id (4 bytes, big-endian)


def schema_id(value: Column) -> Column:
    """The schema id of a Confluent-framed value (bytes 2-5, big-endian)."""
    return F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")


def _has_header(value: Column) -> Column:
    return (F.octet_length(value) >= HEADER_BYTES) & (F.hex(F.substring(value, 1, 1)) == "00")


def decode(df: DataFrame, avro: AvroInput, attempt: Column) -> DataFrame:
    """`df` (with `__raw_value`) plus `__header_ok`, `__schema_id` and `__v` (the record as a
    VARIANT object; null when it was not decoded: not attempted, no header, unknown id, bytes
    that do not decode). `attempt`: which rows to decode at all (CASE WHEN is lazy)."""
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
    df = df.select("*", header_ok.alias("__header_ok"), sid_col.alias("__schema_id"))
    options = {"mode": "PERMISSIVE", "avroSchema": avro.reader_json()}
    record = None
    for sid, writer in sorted(avro.schemas.items()):
        decoded = from_avro(body, writer.text, options)
        condition = attempt & F.col("__header_ok") & (F.col("__schema_id") == sid)
        record = (F.when if record is None else record.when)(condition, decoded)
    df = df.select("*", record.alias("__record"))
    r = F.col("__record")
    fields = []
    for name, t in avro.reader_schema.fields.items():
        (first, *_), _ = branches(t)
        # Epoch milliseconds: the time form the spec declares for timestamp-millis.
        c = F.unix_millis(r[name]) if kind(first) == "timestamp-millis" else r[name]
        fields.append(c.alias(name))
    v = F.when(r[DECODED_FIELD], F.to_variant_object(F.struct(*fields)))
    return df.select(*[c for c in df.columns if c != "__record"], v.alias("__v"))


def record_reason(reason: Column, avro: AvroInput) -> Column:
    """The record-level reason codes of an Avro value, after `empty_payload`."""
    reason = reason.when(~F.col("__header_ok"), "invalid_avro")
    if avro.wire_format == "confluent":
        reason = reason.when(~F.col("__schema_id").isin(*avro.schemas), "unknown_schema_id")
    return reason.when(F.col("__v").isNull(), "invalid_avro")


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
