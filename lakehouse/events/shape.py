"""The shape of a pipeline's events: which JSON fields they carry, which is the id and the time,
which are the group-by dimensions and which decimal fields are summed, minimised, maximised.

The shape fixes the columns of the tables (bronze, the late lane, the aggregates, the changelog):
`DEFAULT_SHAPE` is the contract's (`event_id`, `key`, `event_time`, one `value` as
decimal(38,6)) and the catalog builds those tables' columns from it. A pipeline spec
(`lakehouse.specs.pipeline`) declares another. Pure pydantic: no Spark.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from lakehouse.events.avro import AvroInput, check_fields

IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
# Columns the tables that hold a pipeline's dimensions or measure fields already have (bronze,
# the late lane, the aggregates, the changelog), and those of `quarantined_events`, which the
# classification carries beside them.
RESERVED_COLUMNS = frozenset({
    "event_date", "window_start", "window_end", "event_count", "event_fingerprint", "status",
    "watermark", "batch_id", "updated_at", "bronze_version", "revision", "replayed_at", "cause",
    "corrected_at", "run_id", "event_id", "event_time", "payload_event_time", "attributes",
    "record_key", "record_key_base64", "topic", "partition", "offset", "kafka_timestamp", "ingested_at",
    "bronze_batch_id", "lateness_ms", "batch_watermark", "recorded_at",
    "reason", "detail", "value_bytes", "raw_key", "raw_value", "quarantine_date",
})
# Names whose reason codes would read as a record-level one (`invalid_json`, `invalid_utf8`).
RESERVED_NAMES = frozenset({"json", "utf8"})
# Images of a measure column `m` beside the dimensions: `before_m`/`after_m` in the changelog,
# `streaming_m`/`reconciled_m`/`replay_m` in the proofs' comparisons (expectations).
IMAGE_PREFIXES = ("before", "after", "streaming", "reconciled", "replay")
# A measure's sum is reported with what the watermark cost it, `<name>_missed`, beside the
# count's `events_missed` (the fast path's gap): no measure may be named `events`.
RESERVED_MEASURE_NAMES = frozenset({"events"})
# Scale at most 24: a value is then below 10^(24-s) (`value_bound`), so a sum of 10^14 of them
# is below 10^(38-s) and fits the sum's decimal(38,s).
MAX_SCALE = 24
SUMMED_EVENTS_EXPONENT = 14
DIMENSION_TYPES = {"string": "STRING", "int": "INT", "long": "BIGINT", "date": "DATE"}
SCALAR_TYPES = (*DIMENSION_TYPES, "timestamp")
TIME_FORMS = ("iso8601", "epoch_seconds", "epoch_millis")
AGGREGATES = ("sum", "min", "max")


def _identifier(text: str) -> str:
    if not IDENT.match(text):
        raise ValueError(f"{text!r} is not a column name: lower-case letters, digits and _, "
                         "starting with a letter or _ (at most 63 characters)")
    return text


Identifier = Annotated[str, AfterValidator(_identifier)]
STRICT = ConfigDict(extra="forbid", frozen=True)


def _field_type(text: str) -> str:
    t = re.sub(r"\s+", "", str(text).lower())
    if t in SCALAR_TYPES:
        return t
    m = _DECIMAL.match(t)
    if not m or not 1 <= int(m.group(1)) <= 38 or int(m.group(2)) > min(int(m.group(1)),
                                                                         MAX_SCALE):
        raise ValueError(f"type {text!r}: one of {', '.join(SCALAR_TYPES)} or decimal(p,s) "
                         f"with precision 1-38 and scale <= precision, at most {MAX_SCALE} (so "
                         f"that sums of 10^{SUMMED_EVENTS_EXPONENT} events fit decimal(38,s))")
    return f"decimal({m.group(1)},{m.group(2)})"


FieldType = Annotated[str, AfterValidator(_field_type)]


def precision_scale(field_type: str) -> tuple[int, int]:
    """(p, s) of a validated `decimal(p,s)` field type."""
    m = _DECIMAL.match(field_type)
    return int(m.group(1)), int(m.group(2))


def bound_exponent(field_type: str) -> int:
    """A measure field's values are below 10^e in magnitude, e = min(p-s, 24-s) (>= 0 for
    every accepted type): what decimal(p,s) holds, and small enough that the sum of 10^14 of
    them fits the sum's decimal(38,s)."""
    p, s = precision_scale(field_type)
    return min(p - s, 38 - SUMMED_EVENTS_EXPONENT - s)


class Dimension(BaseModel):
    """A group-by column: `name` in the tables, the value of declared field `field`."""

    model_config = STRICT
    name: Identifier
    field: str | None = None  # default: the name

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        if isinstance(data, str) and "." in data:  # a path no field declares (the shape says)
            return {"name": data.replace(".", "_"), "field": data}
        return {"name": data} if isinstance(data, str) else data

    @property
    def source(self) -> str:
        return self.field or self.name


class Measure(BaseModel):
    """A decimal field aggregated exactly, one column per aggregate (`<name>_sum`, `_min`,
    `_max`; name defaults to the field). A sum is decimal(38, field's scale)."""

    model_config = STRICT
    field: str
    name: Identifier | None = None
    aggregates: tuple[Literal["sum", "min", "max"], ...] = AGGREGATES

    @model_validator(mode="after")
    def _aggregates(self) -> Measure:
        if not self.aggregates:
            raise ValueError("aggregates: declare at least one of sum, min, max")
        if len(set(self.aggregates)) != len(self.aggregates):
            raise ValueError(f"aggregates {list(self.aggregates)} repeat an aggregate")
        return self

    @property
    def column_prefix(self) -> str:
        return self.name or self.field


class EventTime(BaseModel):
    model_config = STRICT
    field: str = "event_time"
    formats: tuple[Literal["iso8601", "epoch_seconds", "epoch_millis"], ...] = (
        "iso8601", "epoch_millis")

    @model_validator(mode="after")
    def _unambiguous(self) -> EventTime:
        if not self.formats:
            raise ValueError("formats: declare at least one of " + ", ".join(TIME_FORMS))
        if {"epoch_seconds", "epoch_millis"} <= set(self.formats):
            raise ValueError("formats: epoch_seconds and epoch_millis together are ambiguous "
                             "(1700000000 is both 2023 and January 1970): declare one")
        return self


class EventShape(BaseModel):
    """What fixes the tables' columns: the event's fields and which are the id, the time, the
    dimensions and the measures (every event is also counted: `event_count`)."""

    model_config = STRICT
    fields: dict[Identifier, FieldType] = Field(default_factory=lambda: {
        "event_id": "string", "key": "string", "event_time": "timestamp",
        "value": "decimal(38,6)"})
    event_id: str = "event_id"
    event_time: EventTime = EventTime()
    dimensions: tuple[Dimension, ...] = (Dimension(name="key"),)
    measures: tuple[Measure, ...] = (Measure(field="value"),)
    # The record value's encoding: one JSON object (the contract's), or Avro (`lakehouse.events.avro`).
    format: Literal["json", "avro"] = "json"
    avro: AvroInput | None = None
    # Nested fields: a field's name -> its path in the event (`customer_address_country` ->
    # `customer.address.country`), from `fields` keys with dots (`_nested_paths`); set by no spec.
    paths: dict[Identifier, str] = Field(default_factory=dict)

    @field_validator("paths")
    @classmethod
    def _paths_are_dotted_names(cls, paths: dict[str, str]) -> dict[str, str]:
        """A path is lower-case identifiers joined by dots, and its field is named after it:
        nothing else ever reaches the JSON paths Spark reads."""
        for name, path in paths.items():
            parts = path.split(".") if isinstance(path, str) else []
            if len(parts) < 2 or not all(IDENT.match(p) for p in parts):
                raise ValueError(f"paths.{name}: {path!r} is not a dotted path of lower-case "
                                 "identifiers (a dotted `fields` key declares one)")
        return paths

    @model_validator(mode="before")
    @classmethod
    def _nested_paths(cls, data: Any) -> Any:
        """A dotted `fields` key is a path into nested objects: the field's name is the path with
        `_` for the dots (`customer.address.country` -> `customer_address_country`), and the id,
        time, dimension and measure references that spell the path are that name."""
        if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
            return data
        data, fields, paths = dict(data), {}, dict(data.get("paths") or {})
        for key, kind in data["fields"].items():
            key = str(key)
            if "." not in key:
                fields[key] = kind
                continue
            for part in key.split("."):
                if not IDENT.match(part):
                    raise ValueError(f"fields.{key}: {part!r} is not a path segment: lower-case "
                                     "letters, digits and _, starting with a letter or _")
            name = key.replace(".", "_")
            if name in data["fields"] or name in fields:
                raise ValueError(f"fields.{key}: its column name {name!r} is also "
                                 f"{'field ' + repr(paths[name]) if name in paths else 'declared'}"
                                 ": rename one")
            fields[name], paths[name] = kind, key
        if fields.keys() == data["fields"].keys():
            return data  # no dotted key (a shape re-validated from its dump keeps its paths)
        if data.get("format") == "avro":
            raise ValueError(f"fields.{next(iter(paths.values()))}: nested fields are read from "
                             "JSON events; an Avro spec declares its reader schema's top-level "
                             "fields")
        named = {path: name for name, path in paths.items()}

        def ref(value: Any) -> Any:
            return named.get(value, value) if isinstance(value, str) else value

        def field_ref(value: Any) -> Any:
            if isinstance(value, dict) and "field" in value:
                return {**value, "field": ref(value["field"])}
            return ref(value)

        data.update(fields=fields, paths=paths)
        if "event_id" in data:
            data["event_id"] = ref(data["event_id"])
        if isinstance(data.get("event_time"), dict):
            data["event_time"] = field_ref(data["event_time"])
        for key in ("dimensions", "measures"):
            if isinstance(data.get(key), list | tuple):
                data[key] = [field_ref(v) for v in data[key]]
        return data

    def path_of(self, field: str) -> str:
        """Where a declared field is in the event: its dotted path (its name at the top)."""
        return self.paths.get(field, field)

    @model_validator(mode="after")
    def _input(self) -> EventShape:
        if self.format == "avro" and self.avro is None:
            raise ValueError("format avro: declare its schemas (avro: {wire_format: confluent, "
                             "schemas: {1: orders_v1.avsc}})")
        if self.format == "json" and self.avro is not None:
            raise ValueError("avro: the schemas are for format: avro (the default is json)")
        if self.avro is not None:
            check_fields(self.avro, self.fields, self.event_time.field, self.event_time.formats)
        return self

    @model_validator(mode="after")
    def _refer_to_fields(self) -> EventShape:
        def declared(where: str, name: str, allowed: tuple[str, ...] | None = None) -> str:
            if name not in self.fields:
                raise ValueError(f"{where}: {name!r} is not a declared field "
                                 f"(fields: {', '.join(self.fields)})")
            kind = self.fields[name]
            if allowed and not kind.startswith(allowed):
                raise ValueError(f"{where}: field {name!r} is {kind}; it must be "
                                 + " or ".join(allowed))
            return kind

        declared("event_id", self.event_id, ("string", "int", "long"))
        declared("event_time.field", self.event_time.field, ("timestamp",))
        if not self.dimensions:
            raise ValueError("dimensions: declare at least one group-by dimension")
        for i, d in enumerate(self.dimensions):
            declared(f"dimensions[{i}]", d.source, tuple(DIMENSION_TYPES))
        for i, m in enumerate(self.measures):
            kind = declared(f"measures[{i}].field", m.field)
            if not kind.startswith("decimal"):
                raise ValueError(f"measures[{i}]: {m.field!r} is {kind}: sums, minima and "
                                 "maxima are exact decimals, declare it decimal(p,s)")
        # Bronze and the late lane hold the dimensions (by name) and the measure fields side by
        # side; the aggregates the dimensions and the measure columns.
        seen: dict[str, str] = {}
        for where, column in [*((f"dimensions[{i}]", d.name)
                                for i, d in enumerate(self.dimensions)),
                              *((f"measures[{i}].field", f)
                                for i, f in enumerate(self.measure_fields)),
                              *((f"measures[{i}]", c) for i, m in enumerate(self.measures)
                                for c, _ in self.measure_columns_of(m))]:
            if column.startswith("_"):
                raise ValueError(f"{where}: {column!r}: a column name starts with a letter "
                                 "(names starting with _ are the pipeline's own working "
                                 "columns and Delta's, such as _commit_version)")
            if column in RESERVED_NAMES:
                raise ValueError(f"{where}: {column!r} would give reason codes that read as the "
                                 f"record's (invalid_{column}): choose another name")
            if column in RESERVED_COLUMNS:
                raise ValueError(f"{where}: {column!r} is a column every table already has")
            if column in seen:
                raise ValueError(f"{where}: column {column!r} is declared twice "
                                 f"(also by {seen[column]})")
            seen[column] = where
        images = {f"{side}_{m}": (side, m) for side in IMAGE_PREFIXES
                  for m in self.measure_columns}
        for i, d in enumerate(self.dimensions):
            if d.name in images:
                side, m = images[d.name]
                raise ValueError(f"dimensions[{i}]: {d.name!r} is the {side} image of measure "
                                 f"column {m} (late_corrections' before_/after_ columns, the "
                                 "proofs' streaming_/reconciled_/replay_ ones): choose another "
                                 "name")
        for i, m in enumerate(self.measures):
            if m.column_prefix in RESERVED_MEASURE_NAMES and "sum" in m.aggregates:
                raise ValueError(f"measures[{i}]: {m.column_prefix!r}: its sum's gap figure "
                                 f"would be {m.column_prefix}_missed, the count's: set another "
                                 "name")
        return self

    def columns_of(self, aggregate: str) -> tuple[str, ...]:
        """The measure columns of one aggregate ("sum", "min" or "max")."""
        return tuple(f"{m.column_prefix}_{aggregate}" for m in self.measures
                     if aggregate in m.aggregates)

    @property
    def additive_columns(self) -> tuple[str, ...]:
        """Columns two partial aggregates of one window combine by adding."""
        return ("event_count", *self.columns_of("sum"), "event_fingerprint")

    @property
    def measure_fields(self) -> tuple[str, ...]:
        """The decimal fields the measures read (bronze and the late lane keep them)."""
        return tuple(dict.fromkeys(m.field for m in self.measures))

    def column_type(self, name: str) -> str:
        """SQL type of a dimension (by its name) or a measure field in bronze."""
        dims = {d.name: d.source for d in self.dimensions}
        kind = self.fields[dims.get(name, name)]
        return DIMENSION_TYPES.get(kind, kind.upper())

    def measure_columns_of(self, m: Measure) -> list[tuple[str, str]]:
        kind = self.fields[m.field]
        scale = precision_scale(kind)[1]
        # Sums widen to 38 digits at the field's scale; min and max keep the field's type.
        return [(f"{m.column_prefix}_{a}", f"decimal(38,{scale})" if a == "sum" else kind)
                for a in m.aggregates]

    # ---- the columns it fixes --------------------------------------------------------------
    @property
    def dimension_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    @property
    def window_id(self) -> tuple[str, ...]:
        """One row per window and dimension values in every aggregate table."""
        return ("window_start", *self.dimension_names)

    def measure_columns_typed(self) -> list[tuple[str, str]]:
        return [("event_count", "bigint"),
                *(c for m in self.measures for c in self.measure_columns_of(m)),
                ("event_fingerprint", "decimal(38,0)")]

    @property
    def measure_columns(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.measure_columns_typed())

    @property
    def window_key_ddl(self) -> str:
        return ", ".join(["event_date DATE NOT NULL", "window_start TIMESTAMP NOT NULL",
                          "window_end TIMESTAMP NOT NULL",
                          *(f"{d.name} {DIMENSION_TYPES[self.fields[d.source]]} NOT NULL"
                            for d in self.dimensions)])

    @property
    def measures_ddl(self) -> str:
        return ", ".join(f"{c} {t.upper()} NOT NULL" for c, t in self.measure_columns_typed())


DEFAULT_SHAPE = EventShape()
