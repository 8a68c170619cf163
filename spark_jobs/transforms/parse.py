"""Kafka records -> (valid events, quarantined records), with native Spark functions only.

The JSON is parsed once into a VARIANT (`try_parse_json`): unlike `from_json` with string
fields, a VARIANT keeps plain-notation JSON numbers as exact decimals, so `value` never passes
through a binary float. Numbers in exponent notation arrive in the VARIANT as doubles; for those
rare rows (and only those: CASE WHEN evaluates lazily) the value is re-read with Jackson's exact
BigDecimal path (`from_json` into decimal(38,18)). A nested field is read at its path
(`EventShape.path_of`). An Avro pipeline's records are decoded by `from_avro`
(`spark_jobs.transforms.avro`) into typed columns, read as typed (`_avro_fields`): the same
reason codes, with no text or pattern for a field the decoder already typed.

The classification's working columns are its own: the fixed ones start with `__` (`__text`,
`__id_type`), a field's are `_<name>_<part>` (`_amount_text`); a spec's column names start with
a letter (`lakehouse.events.shape`), so none of them can be a spec's column or another's.

Every input row leaves in exactly one of the two outputs; a quarantined row carries a reason code
(`REASONS`), a human-readable detail, and its raw bytes (base64) with partition and offset.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings, spark_interval
from lakehouse.events.shape import DEFAULT_SHAPE, EventShape, bound_exponent, precision_scale
from spark_jobs.transforms import avro
from spark_jobs.transforms.projections import Projections


def record_reasons(shape: EventShape) -> tuple[str, ...]:
    """The record-level codes after `empty_payload`: JSON's, or an Avro shape's (a value with no
    Confluent header is `invalid_avro` before its schema id is read)."""
    if shape.format == "avro":
        return (("unknown_schema_id", "invalid_avro") if shape.avro.wire_format == "confluent"
                else ("invalid_avro",))
    return ("invalid_utf8", "invalid_json", "not_an_object")


def reasons(shape: EventShape) -> tuple[str, ...]:
    """Reason codes, in the order they are checked (the first that applies is recorded): the
    record, then the id and the dimensions, the time and the measure fields by name."""
    dims, fields = shape.dimension_names, shape.measure_fields
    return (
        "payload_too_large", "empty_payload", *record_reasons(shape),
        "missing_event_id", *(f"missing_{d}" for d in dims),
        "invalid_event_id", *(f"invalid_{d}" for d in dims),
        "missing_event_time", *(f"missing_{f}" for f in fields),
        "invalid_event_time", *(f"invalid_{f}" for f in fields),
        *(f"{f}_too_precise" for f in fields), *(f"{f}_out_of_range" for f in fields),
        "event_time_in_future", "event_time_before_start",
    )


REASONS = reasons(DEFAULT_SHAPE)  # the default pipeline's (the contract's reason codes)
# A measure's checks: (numeric_like, too_precise, in_range).
Checks = dict[str, tuple[Column, Column, Column]]

_EPOCH_MS = r"^[0-9]{1,15}$"
_EPOCH_S = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"
_ISO_WITH_OFFSET = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
    r"(Z|z|[+-][0-9]{2}(:?[0-9]{2})?)$"
)
_TIME_FORMS = {"epoch_millis": "epoch milliseconds", "epoch_seconds": "epoch seconds",
               "iso8601": "ISO-8601 with an offset"}
_INTEGER = r"^[+-]?[0-9]{1,18}$"
_ISO_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
# Plain decimal notation (trailing fractional zeros allowed beyond the scale).
_PLAIN_NUMBER = r"^[+-]?[0-9]+(\.[0-9]*)?$"


def _at_most_decimals(scale: int) -> str:
    return rf"^[+-]?[0-9]+(\.[0-9]{{0,{scale}}}0*)?$"


def max_abs(measure_type: str) -> str:
    """Exclusive bound of a measure field's |value|, 10^min(p-s, 24-s) (`bound_exponent`): what
    decimal(p,s) holds, and small enough that sums of 10^14 events fit the sum's decimal(38,s)."""
    return "1" + "0" * bound_exponent(measure_type)


def _blank(c: Column) -> Column:
    return c.isNull() | (F.trim(c) == "")


def _not_scalar(variant_type: Column) -> Column:
    """An identity field that is a JSON object, array or boolean: its text is no id. (A number
    is kept as its JSON text: `123` and `"123"` are one id.)"""
    return variant_type.startswith("OBJECT") | variant_type.startswith("ARRAY") | (
        variant_type == "BOOLEAN")


@contextmanager
def parsed_events(raw: DataFrame, settings: Settings) -> Iterator[tuple[DataFrame, DataFrame]]:
    """Split Kafka rows (key, value, topic, partition, offset, timestamp) into valid events and
    quarantined records, with the classification computed once and cached for both outputs.

    The cache is also a plan barrier: without it Spark pushes each `reason` filter down through
    the staged projections and evaluates the JSON parse once per reference (seen: 7x slower)."""
    classified = classify(raw, settings).persist()
    try:
        yield _split(classified, settings)
    finally:
        classified.unpersist()


def _split(classified: DataFrame, settings: Settings) -> tuple[DataFrame, DataFrame]:
    valid = classified.where(F.col("reason").isNull()).select(*valid_columns(settings.shape))
    quarantined = quarantine_projection(classified.where(F.col("reason").isNotNull()), settings)
    return valid, quarantined


def _path(path: str) -> str:
    """The VARIANT path of a field's (dotted) path in the event (the first element of the
    parsed `[<payload>,0]`: `_json_fields`)."""
    return "$[0]" + "".join(f"['{p}']" if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", p) else f".{p}"
                         for p in path.split("."))


def _exact_reread(path: str, exact: str) -> Column:
    """The number at `path` re-read from the JSON text by Jackson's exact BigDecimal path."""
    *outer, leaf = path.split(".")
    ddl = f"`{leaf}` {exact}"
    for part in reversed(outer):
        ddl = f"`{part}` struct<{ddl}>"
    value = F.from_json("__text", ddl)
    for part in path.split("."):
        value = value[part]
    return value


def _event_time(text: Column, formats: tuple[str, ...]) -> Column:
    """The payload's event time in the declared forms (null when none applies)."""
    parsed = None
    for form in formats:
        pattern, value = {
            "epoch_millis": (_EPOCH_MS, lambda: F.timestamp_millis(text.cast("long"))),
            "epoch_seconds": (_EPOCH_S, lambda: F.timestamp_seconds(text.cast("decimal(18,6)"))),
            "iso8601": (_ISO_WITH_OFFSET, lambda: F.try_to_timestamp(text)),
        }[form]
        parsed = (F.when if parsed is None else parsed.when)(text.rlike(pattern), value())
    return parsed


def _dimension(shape: EventShape, name: str) -> tuple[Column, Column, Column]:
    """(value, missing, invalid) of a dimension. Strings keep a number's JSON text (`123` and
    `"123"` are one value); an object, array or boolean is no dimension value."""
    source = {d.name: d.source for d in shape.dimensions}[name]
    kind = shape.fields[source]
    text = F.col(f"_{name}_text")
    missing = _blank(text)
    not_scalar = _not_scalar(F.col(f"_{name}_type"))
    if kind == "string":
        return text, missing, not_scalar
    if kind == "date":
        value = F.when(F.trim(text).rlike(_ISO_DATE),
                       F.try_to_timestamp(F.trim(text), F.lit("yyyy-MM-dd")).cast("date"))
    else:
        value = F.when(F.trim(text).rlike(_INTEGER),
                       F.trim(text).try_cast("int" if kind == "int" else "bigint"))
    return value, missing, not_scalar | value.isNull()


# The projections built in this process (`_built`), by what they are built from: a few specs'
# worth (an edited spec's previous ones go first); a lock for callers on several threads.
_BUILT: dict[tuple, Projections] = {}
_KEEP_BUILT = 16
_BUILT_LOCK = threading.Lock()


def _built(build: Callable[..., Projections], df: DataFrame, settings: Settings) -> DataFrame:
    """`build`'s projections applied to `df`, built once per process for each spec and its limits
    (what `build` takes: a few hundred expressions cost thousands of py4j round trips, ~0.7-1 s
    of driver time for the classification), for classic Spark and Spark Connect apart (their
    columns do not mix)."""
    inputs = (settings.shape, settings.max_event_bytes, settings.future_skew,
              settings.timestamp_policy, settings.partitions_start_date)
    key = (build.__name__, type(df).__module__, settings.shape.model_dump_json(), *inputs[1:])
    with _BUILT_LOCK:
        built = _BUILT.get(key)
    if built is None:
        built = build(*inputs)
        with _BUILT_LOCK:
            _BUILT[key] = built
            while len(_BUILT) > _KEEP_BUILT:
                del _BUILT[next(iter(_BUILT))]
    return built.apply(df)


def classify(raw: DataFrame, settings: Settings) -> DataFrame:
    """valid_columns(shape) plus `reason` (null for a valid event) and what the quarantine
    needs. The event's fields are read as the pipeline's shape declares them (`_built`)."""
    return _built(_classification, raw, settings)


def _classification(shape: EventShape, max_event_bytes: int, future_skew: timedelta,
                    timestamp_policy: str, start_date: date) -> Projections:
    """`classify`'s projections, built from exactly what they depend on."""
    dims, fields = shape.dimension_names, shape.measure_fields
    # Staged selects: each expensive expression is computed once and referenced by name
    # (Spark does not collapse projections that would duplicate non-cheap expressions).
    is_avro = shape.format == "avro"
    df = Projections().select(
        F.col("key").alias("__raw_key"),
        F.col("value").alias("__raw_value"),
        # The JSON text (Avro: none; its fields are never JSON doubles to re-read).
        (F.lit(None).cast("string") if is_avro else F.col("value").cast("string")).alias("__text"),
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        F.octet_length("value").alias("value_bytes"),
    )
    too_big = F.col("value_bytes") > F.lit(max_event_bytes)
    # The fields as read: event_id, __id_type, _<d>_text, _<d>_type, __time_text,
    # payload_event_time, each measure's value with _<f>_text and _<f>_exact, attributes; and
    # each measure's (numeric_like, too_precise, in_range).
    if is_avro:
        df, checks = _avro_fields(avro.decode(df, shape.avro, ~too_big), shape)
    else:
        df, checks = _json_fields(df, shape, too_big)
    dimension = {d: _dimension(shape, d) for d in dims}

    payload_time = F.col("payload_event_time")
    skew_s = int(future_skew.total_seconds())
    in_future = payload_time > F.col("kafka_timestamp") + F.expr(f"INTERVAL {skew_s} SECONDS")
    counted_time = (
        F.col("kafka_timestamp") if timestamp_policy == "kafka_timestamp" else payload_time
    )
    # e.g. epoch seconds sent as milliseconds (January 1970): no partition would ever hold it.
    before_start = counted_time < F.lit(start_date).cast("timestamp")

    reason = (
        F.when(too_big, "payload_too_large")
        .when(F.col("__raw_value").isNull() | (F.col("value_bytes") == 0), "empty_payload"))
    if is_avro:
        reason = avro.record_reason(reason, shape.avro)
    else:
        reason = (reason.when(~F.col("__utf8"), "invalid_utf8")
                  .when(F.col("__v").isNull(), "invalid_json")
                  .when(~F.col("__is_object"), "not_an_object"))
    reason = reason.when(_blank(F.col("event_id")), "missing_event_id")
    for d in dims:
        reason = reason.when(dimension[d][1], f"missing_{d}")
    reason = reason.when(_not_scalar(F.col("__id_type")), "invalid_event_id")
    for d in dims:
        reason = reason.when(dimension[d][2], f"invalid_{d}")
    reason = reason.when(F.col("__time_text").isNull(), "missing_event_time")
    for f in fields:
        reason = reason.when(F.col(f"_{f}_text").isNull(), f"missing_{f}")
    reason = reason.when(payload_time.isNull(), "invalid_event_time")
    for f in fields:
        reason = reason.when(~checks[f][0], f"invalid_{f}")
    for f in fields:
        reason = reason.when(checks[f][1], f"{f}_too_precise")
    for f in fields:
        reason = reason.when(~checks[f][2], f"{f}_out_of_range")
    reason = (reason.when(in_future, "event_time_in_future")
              .when(before_start, "event_time_before_start"))

    event_time = counted_time
    quarantine_only = quarantine_columns_only(shape)
    final = {
        "event_id": F.col("event_id"),
        **{d: dimension[d][0] for d in dims},
        "event_time": event_time,
        "payload_event_time": F.col("payload_event_time"),
        **{f: F.col(f) for f in fields},
        "attributes": F.col("attributes"),
        # The Kafka key as text when it is UTF-8, else exactly, as base64: a string column
        # holding other bytes would fail every Parquet reader but Spark's (delta-rs, polars).
        "record_key": F.when(F.is_valid_utf8("__raw_key"), F.col("__raw_key").cast("string")),
        "record_key_base64": F.when(~F.is_valid_utf8("__raw_key"), F.base64("__raw_key")),
        **{c: F.col(c) for c in ("topic", "partition", "offset", "kafka_timestamp")},
        "event_date": F.to_date(event_time),
        "reason": reason,
        "value_bytes": F.col("value_bytes"),
        **{c: F.col(c) for c in quarantine_only},
    }
    df = df.select(*[column.alias(name) for name, column in final.items()])
    # What only the quarantine projection reads is kept for rejected rows only: a cached
    # classification then holds no second copy of every valid payload.
    rejected = F.col("reason").isNotNull()
    return df.select(*[F.when(rejected, F.col(c)).alias(c) if c in quarantine_only else c
                       for c in final])


def _json_fields(df: Projections, shape: EventShape, too_big: Column
                 ) -> tuple[Projections, Checks]:
    """A JSON payload's fields, read from its VARIANT (`classify`)."""
    dims, fields = shape.dimension_names, shape.measure_fields
    df = df.add(F.is_valid_utf8("__text").alias("__utf8"))
    # Parse only payloads that are valid UTF-8 and not oversized (CASE WHEN is lazy). Spark's
    # parser reads the first JSON value and ignores what follows it, so the payload is parsed as
    # the first element of `[<payload>,0]`: text after the value ("{..} x", two events "{..}{..}")
    # breaks the array, and "{..},{..}" gives it a third element. `__v` is that array (the event
    # at `$[0]`, `_path`), null unless it is exactly [event, 0].
    text = F.col("__text")
    df = df.add(F.when(~too_big & F.col("__utf8"), F.try_parse_json(
        F.concat(F.lit("["), text, F.lit(",0]")))).alias("__w"))
    w = F.col("__w")
    df = df.add(((F.try_variant_get(w, "$[1]", "int") == 0)
                 & F.try_variant_get(w, "$[2]", "variant").isNull()).alias("__wrapped"))
    # A payload can close the wrapper itself and go on ("{..},0] more", "{..} ,0] {..}"): only
    # one holding a ']' can, so those rows alone (CASE WHEN is lazy) must also be the second and
    # last element of `[0,<payload>]`, which such text gives a third ([0,{..},0]). That parse
    # never fails where the first was accepted: its reader stops after the array's first value.
    alone = F.when(~text.contains("]"), F.lit(True)).otherwise(F.try_variant_get(
        F.try_parse_json(F.concat(F.lit("[0,"), text, F.lit("]"))), "$[2]", "variant").isNull())
    df = df.add(F.when(F.col("__wrapped") & alone, w).alias("__v"))
    v = F.col("__v")
    source = {d.name: d.source for d in shape.dimensions}

    def type_of(at: str) -> Column:
        return F.schema_of_variant(F.try_variant_get(v, at, "variant"))

    def text_and_type(field: str, alias: str) -> list[Column]:
        at = _path(shape.path_of(field))
        return [F.try_variant_get(v, at, "string").alias(f"_{alias}_text"),
                type_of(at).alias(f"_{alias}_type")]

    def identity(field: str, text_alias: str, type_alias: str) -> list[Column]:
        """An id's or a dimension's text, and its VARIANT type only where the text could be an
        object's, an array's or a boolean's (CASE WHEN is lazy: a string or a number's text
        starting otherwise is neither, and skips the lookup, ~1.8 µs a field a record)."""
        at = _path(shape.path_of(field))
        text = F.try_variant_get(v, at, "string")
        maybe_not_scalar = (text.startswith("{") | text.startswith("[")
                            | text.isin("true", "false"))
        return [text.alias(text_alias), F.when(maybe_not_scalar, type_of(at)).alias(type_alias)]

    df = df.add(
        *identity(shape.event_id, "event_id", "__id_type"),
        *[c for d in dims for c in identity(source[d], f"_{d}_text", f"_{d}_type")],
        F.try_variant_get(v, _path(shape.path_of(shape.event_time.field)), "string")
        .alias("__time_text"),
        *[c for f in fields for c in text_and_type(f, f)],
        F.try_variant_get(v, _path("attributes"), "string").alias("attributes"),
        # Valid JSON whose first character past JSON's whitespace is '{' is an object.
        F.ltrim("__text", F.lit(" \t\n\r")).startswith("{").alias("__is_object"),
    )
    return _text_measures(df, shape, fields, v, _text_time(shape))


def _text_time(shape: EventShape) -> Column:
    """`payload_event_time` from `__time_text`, in the declared forms."""
    return _event_time(F.trim(F.col("__time_text")), shape.event_time.formats)


def _text_measures(df: Projections, shape: EventShape, fields: tuple[str, ...],
                   v: Column | None, time: Column) -> tuple[Projections, Checks]:
    """`payload_event_time` (`time`), and the measure `fields` from their `_<f>_text` and
    `_<f>_type` (`v`: the VARIANT, for a JSON double's exact re-read; None: no doubles)."""

    # Measure fields: exact decimals. Plain notation (VARIANT decimal, integer or numeric
    # string) is cast from its exact text; exponent notation (VARIANT double) is re-read
    # exactly by Jackson.
    types = {f: shape.fields[f] for f in fields}
    exact = {f: f"decimal(38,{max(18, precision_scale(types[f])[1])})" for f in fields}
    staged = []
    for f in fields:
        text, is_double = F.trim(F.col(f"_{f}_text")), F.col(f"_{f}_type") == "DOUBLE"
        staged += [
            F.when(is_double, _exact_reread(shape.path_of(f), exact[f])).alias(f"_{f}_exact"),
            (text.rlike(_PLAIN_NUMBER) & ~is_double).alias(f"_{f}_plain"),
            text.rlike(_at_most_decimals(precision_scale(types[f])[1])).alias(f"_{f}_scale"),
            text.isin("NaN", "Infinity", "-Infinity").alias(f"_{f}_nonfinite"),
        ]
    df = df.add(time.alias("payload_event_time"), *staged)
    checks: Checks = {}
    values = []
    for f in fields:
        text, is_double = F.trim(F.col(f"_{f}_text")), F.col(f"_{f}_type") == "DOUBLE"
        exact_f, plain = F.col(f"_{f}_exact"), F.col(f"_{f}_plain")
        numeric_like = plain | (is_double & ~F.col(f"_{f}_nonfinite"))
        too_precise = F.when(plain, ~F.col(f"_{f}_scale")).otherwise(
            # Same-type comparison: mixed decimal scales would be widened back to the scale.
            (exact_f.isNotNull() & (exact_f != exact_f.cast(types[f]).cast(exact[f])))
            # The re-read rounds digits past its scale, so count them in the literal text.
            | (F.lit(False) if v is None else is_double & _literal_too_precise(
                F.col("__text"), v, shape.path_of(f), precision_scale(types[f])[1])))
        values.append(
            F.when(plain, text.try_cast(types[f])).otherwise(exact_f.cast(types[f])).alias(f))
        checks[f] = (numeric_like, too_precise, _in_range(F.col(f), types[f]))
    return (df.add(*values) if values else df), checks


def _in_range(value: Column, measure_type: str) -> Column:
    # The bound may not fit the field's own type (10^16 in decimal(18,2)): at its scale.
    bound = F.lit(max_abs(measure_type)).cast(f"decimal(38,{precision_scale(measure_type)[1]})")
    return value.isNotNull() & (F.abs(value) < bound)


def _avro_fields(df: Projections, shape: EventShape) -> tuple[Projections, Checks]:
    """A decoded Avro record's fields (`avro.decode`'s `__record`), read as typed: a decimal or
    integer measure is checked as a number (no text, no regular expression), a timestamp-millis
    time is a timestamp; the other kinds (strings, a long's epoch) are read as their text by the
    JSON path's rules. An Avro field is never an object, an array or a boolean where the spec
    reads it (`lakehouse.events.avro.check_fields`), so no id or dimension is `invalid_` for it."""
    dims, fields = shape.dimension_names, shape.measure_fields
    kinds = avro.field_kinds(shape.avro)
    r = F.col("__record")
    source = {d.name: d.source for d in shape.dimensions}
    time_field = shape.event_time.field
    time_kind = kinds.get(time_field)
    time_text = (F.unix_millis(r[time_field]) if time_kind == "timestamp-millis"
                 else r[time_field]).cast("string")
    numbers = [f for f in fields if kinds.get(f) in ("decimal", "int", "long")]
    scalar = F.lit("STRING")  # what the JSON path's type check sees: no object, array, boolean
    df = df.add(
        r[shape.event_id].cast("string").alias("event_id"), scalar.alias("__id_type"),
        *[c for d in dims for c in (r[source[d]].cast("string").alias(f"_{d}_text"),
                                    scalar.alias(f"_{d}_type"))],
        time_text.alias("__time_text"),
        *[c for f in fields for c in (r[f].cast("string").alias(f"_{f}_text"),
                                      scalar.alias(f"_{f}_type"))],
        avro.attributes(shape.avro).alias("attributes"),
    )
    texts = tuple(f for f in fields if f not in numbers)
    # A timestamp-millis time as its epoch milliseconds' text would be read: 0 to 15 digits
    # (`_EPOCH_MS`); any other kind by its text.
    time = _text_time(shape)
    if time_kind == "timestamp-millis":
        in_form = (F.unix_millis(r[time_field]).between(0, 10**15 - 1)
                   & F.lit("epoch_millis" in shape.event_time.formats))
        time = F.when(in_form, r[time_field])
    df, checks = _text_measures(df, shape, texts, None, time)
    typed = []
    for f in numbers:
        t = shape.fields[f]
        scale, avro_scale = precision_scale(t)[1], avro.decimal_scale(shape.avro, f)
        value = r[f].try_cast(t)  # null when it overflows t: out of range
        # More fractional digits than t has: what rounding to t's scale would change.
        wide = f"decimal(38,{avro_scale})"
        too_precise = (F.lit(False) if avro_scale <= scale else
                       r[f].cast(f"decimal(38,{scale})").cast(wide) != r[f].cast(wide))
        typed.extend([value.alias(f), F.lit(None).cast(t).alias(f"_{f}_exact")])
        checks[f] = (F.lit(True), too_precise, _in_range(F.col(f), t))
    return (df.add(*typed) if typed else df), checks


def quarantine_columns_only(shape: EventShape) -> tuple[str, ...]:
    return ("__raw_key", "__raw_value", "__time_text", "__id_type",
            *(f"_{d}_{part}" for d in shape.dimension_names for part in ("text", "type")),
            *(f"_{f}_{part}" for f in shape.measure_fields for part in ("text", "exact")))


def _literal_too_precise(text: Column, v: Column, path: str, scale: int) -> Column:
    """True when a `"<key>": <number>` literal in the JSON text (the path's last key) equals the
    parsed double and has more than `scale` fractional digits once its exponent is applied
    (1.25E-7 has 9). Only such literals count, so a field of that name elsewhere in the object
    cannot decide (unless it is the same number)."""
    as_double = F.try_variant_get(v, _path(path), "double")
    field = path.split(".")[-1]

    def fractional_digits(literal: Column) -> Column:
        fraction = F.regexp_replace(F.regexp_extract(literal, r"\.([0-9]*)", 1), "0+$", "")
        exponent = F.coalesce(
            F.regexp_extract(literal, r"[eE]([+-]?[0-9]+)", 1).try_cast("int"), F.lit(0))
        return F.length(fraction) - exponent

    # The literal text of a top-level-looking number of that field (any notation).
    pattern = rf'"{re.escape(field)}"\s*:\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)'
    literals = F.regexp_extract_all(text, F.lit(pattern), 1)
    return F.exists(literals, lambda lit: (lit.try_cast("double") == as_double)
                    & (fractional_digits(lit) > scale))


def _not_a_string(field: str, type_column: str) -> Column:
    """'key is a JSON array, not a string', from `schema_of_variant` text such as ARRAY<BIGINT>."""
    return F.concat(F.lit(f"{field} is a JSON "), F.lower(F.split(type_column, "<")[0]),
                    F.lit(", not a string"))


def quarantine_projection(df: DataFrame, settings: Settings) -> DataFrame:
    """The quarantine's columns from `classify` output; apply after filtering on `reason`, so the
    base64 encoding and details are computed for rejected rows only (`_built`)."""
    return _built(_quarantine, df, settings)


def _quarantine(shape: EventShape, max_event_bytes: int, future_skew: timedelta,
                timestamp_policy: str, start_date: date) -> Projections:
    """`quarantine_projection`'s projection, built from what it depends on."""
    reason = F.col("reason")
    forms = " nor ".join(_TIME_FORMS[f] for f in sorted(shape.event_time.formats))
    # Details name a field by its path in the event (its name, at the top level).
    time_field = shape.path_of(shape.event_time.field)
    detail = (
        F.when(reason == "payload_too_large",
               F.format_string("%d bytes > MAX_EVENT_BYTES=%d", "value_bytes",
                               F.lit(max_event_bytes)))
        .when(reason == "invalid_event_time",
              F.concat(F.lit(f"{time_field}="), F.substring("__time_text", 1, 80),
                       F.lit(f" is {'neither ' if ' nor ' in forms else 'not '}{forms}")))
        .when(reason == "invalid_event_id",
              _not_a_string(shape.path_of(shape.event_id), "__id_type"))
        # Parsed alone, the payload is JSON: it is one value followed by more text.
        .when((reason == "invalid_json")
              & F.try_parse_json(F.col("__raw_value").cast("string")).isNotNull(),
              F.lit("more text after the JSON value (two events in one record?)"))
    )
    nested = shape.paths
    for name, source in [(d.name, d.source) for d in shape.dimensions] + [
            (f, f) for f in shape.measure_fields]:
        if source in nested:  # a nested field's absence: which path was looked up
            detail = detail.when(reason == f"missing_{name}",
                                 F.lit(f"no value at {nested[source]}"))
    if shape.format == "avro":
        detail = avro.record_detail(detail, reason, shape.avro)
    for f in shape.measure_fields:
        kind = shape.fields[f]
        detail = detail.when(
            reason.isin(f"invalid_{f}", f"{f}_too_precise", f"{f}_out_of_range"),
            F.concat(F.lit(f"{shape.path_of(f)}="),
                     F.substring(F.coalesce(F.col(f"_{f}_exact").cast("string"),
                                            F.col(f"_{f}_text")), 1, 80),
                     F.lit(f" (exact decimal, at most {precision_scale(kind)[1]} fractional "
                           f"digits, |v| < {max_abs(kind)})")))
    for d in shape.dimensions:
        kind = shape.fields[d.source]
        detail = detail.when(
            reason == f"invalid_{d.name}",
            _not_a_string(nested.get(d.source, d.name), f"_{d.name}_type") if kind == "string"
            else F.concat(F.lit(f"{nested.get(d.source, d.name)}="),
                          F.substring(f"_{d.name}_text", 1, 80),
                     F.lit(f" is not {'an ISO date' if kind == 'date' else 'an integer'}")))
    detail = (
        detail.when(reason == "event_time_before_start",
                    F.concat(F.lit(f"{time_field}="), F.col("__time_text"),
                             F.lit(f" is before LAKEHOUSE_START_DATE="
                                   f"{start_date}"
                                   " (epoch seconds sent as milliseconds?)")))
        .when(reason == "event_time_in_future",
              F.concat(F.lit(f"{time_field}="), F.col("__time_text"), F.lit(" is more than "),
                       F.lit(spark_interval(future_skew)),
                       F.lit(" after the broker append time")))
    )
    return Projections().select(
        "reason",
        detail.alias("detail"),
        "topic",
        "partition",
        "offset",
        "kafka_timestamp",
        "value_bytes",
        F.base64("__raw_key").alias("raw_key"),
        F.base64("__raw_value").alias("raw_value"),
        F.to_date("kafka_timestamp").alias("quarantine_date"),
    )


def valid_columns(shape: EventShape) -> tuple[str, ...]:
    """A valid event's columns (bronze's, before its batch bookkeeping)."""
    return ("event_id", *shape.dimension_names, "event_time", "payload_event_time",
            *shape.measure_fields, "attributes", "record_key", "record_key_base64", "topic",
            "partition", "offset", "kafka_timestamp", "event_date")
