"""Generated events and an independent reference for any pipeline spec (`lakehouse.specs.pipeline`).

`generate_for_spec` is `testkit.generator.generate` for a spec's event shape: its fields, its
time forms, its dimensions and decimal measures, with the same traffic (disorder, late events,
re-sent duplicates) and malformed records whose kind is the reason code the parser records
(`malformed_kinds`). `expected_windows_for_spec` counts what the aggregates must hold in plain
Python (no Spark, no Delta), with the semantics of `testkit.reference`: valid kinds only, the
first arrival of an event id within its event date, tumbling windows aligned to the epoch, UTC.
"""

from __future__ import annotations

import json
import operator
import random
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_DOWN, Decimal, localcontext

from lakehouse.events.shape import EventShape, precision_scale
from lakehouse.specs.pipeline import PipelineSpec
from testkit import avro_events
from testkit.generator import Generated, GeneratorConfig, Record, _encode
from testkit.reference import VALID_KINDS, dedup

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
VOCABULARY = 5  # values per dimension
RECENT = 50  # a duplicate of one of the last RECENT events is "duplicate", older: "late_duplicate"
# Realistic values for well-known field names; any other string field: f"{field}-{k}".
WORDS = {
    "region": ("eu-west", "us-east", "ap-south", "sa-east", "af-south"),
    "currency": ("EUR", "USD", "GBP", "CHF", "SEK"),
    "event_type": ("app_open", "screen_view", "add_to_cart", "purchase", "app_close"),
}
_DROP, _FUTURE, _BEFORE_START = object(), object(), object()
_DIGITS = re.compile(r"^\s*[0-9]+\s*$")
_COMBINE = {"sum": operator.add, "min": min, "max": max}


def _plan(shape: EventShape) -> dict[str, tuple[str | None, object]]:
    """Malformed kind -> (the field it spoils, what replaces it), in the order the default parser
    checks (`spark_jobs.transforms.parse.REASONS`).

    A kind the parser could not record is left out: a dimension whose field is the id or an
    earlier dimension's (its absence is reported as that one). Where two kinds would spell one
    code (a measure field named `json`), the first keeps it."""
    t, measured = shape.event_time.field, shape.measure_fields
    plan: dict[str, tuple[str | None, object]] = {
        "invalid_json": (None, None), "not_an_object": (None, None), "invalid_utf8": (None, None),
        "missing_event_id": (shape.event_id, _DROP)}
    read = {shape.event_id}
    for d in shape.dimensions:
        if d.source not in read:
            read.add(d.source)
            plan.setdefault(f"missing_{d.name}", (d.source, _DROP))
    for f in measured:
        plan.setdefault(f"missing_{f}", (f, _DROP))
    plan.setdefault("invalid_event_time", (t, "yesterday at noon"))
    for f in measured:
        plan.setdefault(f"invalid_{f}", (f, "12,50 EUR"))
    for f in measured:  # one fractional digit more than the scale
        plan.setdefault(f"{f}_too_precise",
                        (f, "0." + "0" * precision_scale(shape.fields[f])[1] + "7"))
    plan.setdefault("event_time_in_future", (t, _FUTURE))
    plan.setdefault("event_time_before_start", (t, _BEFORE_START))
    return plan


def malformed_kinds(spec: PipelineSpec) -> tuple[str, ...]:
    """The quarantine reason codes `generate_for_spec` makes records of, for this spec."""
    if spec.shape.format == "avro":
        return tuple(avro_events.plan(spec.shape))
    return tuple(_plan(spec.shape))


# ---- nested fields: an event is the JSON object, a field is at its path (`shape.path_of`) ----

def get(shape: EventShape, event: dict, field: str):
    """The value of a declared field in an event (None when its path is absent)."""
    for key in shape.path_of(field).split("."):
        if not isinstance(event, dict) or key not in event:
            return None
        event = event[key]
    return event


def put(shape: EventShape, event: dict, field: str, value) -> None:
    *outer, leaf = shape.path_of(field).split(".")
    for key in outer:
        event = event.setdefault(key, {})
    event[leaf] = value


def drop(shape: EventShape, event: dict, field: str) -> None:
    *outer, leaf = shape.path_of(field).split(".")
    for key in outer:
        event = event[key]
    event.pop(leaf)


# ---- generation --------------------------------------------------------------------------------

def _time(shape: EventShape, t: datetime, rnd: random.Random) -> str | int:
    """`t` (whole milliseconds) in one of the spec's forms, each spelled as producers do."""
    form = rnd.choice(shape.event_time.formats)
    if form == "iso8601":
        text = t.isoformat(timespec="milliseconds")
        return text if rnd.random() < 0.2 else text.replace("+00:00", "Z")
    ms = (t - EPOCH) // timedelta(milliseconds=1)
    if form == "epoch_millis":
        return str(ms) if rnd.random() < 0.3 else ms
    return ms // 1000


def _decimal(field_type: str, rnd: random.Random) -> Decimal:
    """Up to the scale's digits (sometimes fewer) within the precision; a few refunds (< 0)."""
    p, s = precision_scale(field_type)
    d = Decimal(f"{rnd.randint(1, min(10 ** p - 1, 5 * 10 ** (s + 3)))}E-{s}")
    if s and rnd.random() < 0.2:
        with localcontext(prec=80):
            d = d.quantize(Decimal(f"1E-{rnd.randint(0, s - 1)}"), rounding=ROUND_DOWN)
    return -d if d and rnd.random() < 0.05 else d


def _json_number(d: Decimal, rnd: random.Random) -> float | str:
    """A JSON number where a double spells `d` exactly in plain notation, else (and for some
    anyway) a string: `_encode` writes floats by their shortest repr."""
    f = float(d)
    if rnd.random() < 0.3 or "e" in repr(f) or Decimal(repr(f)) != d:
        return format(d, "f")
    return f


def _scalar(field: str, field_type: str, k: int, start: datetime) -> str | int:
    if field_type in ("int", "long"):
        return k
    if field_type == "date":
        return (start.date() - timedelta(days=k)).isoformat()
    words = WORDS.get(field)
    return words[k % len(words)] if words else f"{field}-{k}"


def _event_id(spec: PipelineSpec, seed: int, i: int) -> str | int:
    """Unique per seed: a string, or for a numeric id i (int) or seed * 10**9 + i (long)."""
    kind = spec.shape.fields[spec.shape.event_id]
    if kind == "string":
        return f"{spec.name}-{seed}-{i}"
    return i if kind == "int" else seed * 10 ** 9 + i


def _event(spec: PipelineSpec, cfg: GeneratorConfig, rnd: random.Random, i: int, t: datetime,
           start: datetime) -> dict:
    shape = spec.shape
    hot = shape.dimensions[0].source
    event: dict = {}
    for name, kind in shape.fields.items():
        if name == shape.event_id:
            put(shape, event, name, _event_id(spec, cfg.seed, i))
        elif name == shape.event_time.field:
            put(shape, event, name, _time(shape, t, rnd))
        elif kind == "timestamp":
            put(shape, event, name, t.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
        elif kind.startswith("decimal"):
            put(shape, event, name, _json_number(_decimal(kind, rnd), rnd))
        else:
            k = 0 if name == hot and rnd.random() < cfg.hot_key_share else rnd.randrange(VOCABULARY)
            put(shape, event, name, _scalar(name, kind, k, start))
    return event


def _key(spec: PipelineSpec, event: dict) -> bytes | None:
    value = get(spec.shape, event, spec.shape.dimensions[0].source)
    return None if value is None else str(value).encode()


def _malformed(spec: PipelineSpec, kind: str, base: dict, t: datetime,
               rnd: random.Random) -> bytes:
    field, replacement = _plan(spec.shape)[kind]
    raw = _encode(base)
    if kind == "invalid_json":
        return raw[: len(raw) // 2]  # no strict prefix of an object is JSON
    if kind == "not_an_object":
        return b"[" + raw + b"]"
    if kind == "invalid_utf8":
        return b'{"\xff\xfe":0,' + raw[1:]
    forms = spec.shape.event_time.formats
    if replacement is _DROP:
        drop(spec.shape, base, field)
    elif replacement is _FUTURE:  # far beyond any skew whenever it is produced
        put(spec.shape, base, field, _time(spec.shape, t + timedelta(days=3650), rnd))
    elif replacement is _BEFORE_START:
        put(spec.shape, base, field,  # seconds where milliseconds are due
            int(t.timestamp()) if "epoch_millis" in forms
            else "1970-01-02T00:00:00Z" if "iso8601" in forms else 86_400)
    else:
        put(spec.shape, base, field, replacement)
    return _encode(base)


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def generate_for_spec(spec: PipelineSpec, cfg: GeneratorConfig) -> Generated:
    """The records to produce to the spec's topic, in arrival order, over `cfg.span` of event
    time ending at `cfg.end` (default: now, to the minute). Pure: same spec and config, same
    bytes. The n-th malformed record is of kind `malformed_kinds(spec)[n % len]`, so every kind
    appears once there are that many."""
    rnd = random.Random(cfg.seed)
    end = _utc(cfg.end) if cfg.end else datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - cfg.span
    step = cfg.span / max(cfg.count, 1)
    kinds = malformed_kinds(spec)
    disorder_ms = int(cfg.disorder / timedelta(milliseconds=1))
    # Avro specs: the same events, written as Avro records (testkit.avro_events); JSON: as text.
    codec = avro_events.AvroCodec(spec.shape) if spec.shape.format == "avro" else None
    out, sent, malformed = Generated(), [], 0
    for i in range(cfg.count):
        nominal = start + step * i  # the arrival clock
        nominal -= timedelta(microseconds=nominal.microsecond % 1000)  # whole milliseconds
        roll = rnd.random()
        if roll < cfg.malformed_fraction:
            kind = kinds[malformed % len(kinds)]
            malformed += 1
            base = _event(spec, cfg, rnd, i, nominal, start)
            key = _key(spec, base)  # before the record is spoiled
            value = (codec.malformed(kind, base, nominal, rnd, malformed // len(kinds)) if codec
                     else _malformed(spec, kind, base, nominal, rnd))
            out.records.append(Record(key, value, kind))
        elif roll < cfg.malformed_fraction + cfg.duplicate_fraction and sent:
            old = len(sent) > RECENT and rnd.random() < 0.3
            event, value = rnd.choice(sent[:-RECENT] if old else sent[-RECENT:])  # unchanged
            out.records.append(Record(_key(spec, event), value,
                                      "late_duplicate" if old else "duplicate", event))
        else:
            late = rnd.random() < cfg.late_fraction and nominal - start > timedelta(hours=3)
            behind = (timedelta(seconds=rnd.randint(120, 3 * 3600)) if late
                      else timedelta(milliseconds=rnd.randint(0, disorder_ms)))
            t = nominal - behind
            event = _event(spec, cfg, rnd, i, t, start)
            if codec:
                value, event = codec.encode(event, t, rnd)
            else:
                value = _encode(event)
            sent.append((event, value))
            out.records.append(Record(_key(spec, event), value, "late" if late else "event",
                                      event))
    return out


# ---- the reference -----------------------------------------------------------------------------

def parse_time(spec: PipelineSpec, raw: str | int) -> datetime:
    """An event time in one of the spec's forms as an aware UTC datetime; ValueError otherwise
    (an ISO time without an offset included: its instant is unknown)."""
    forms = spec.shape.event_time.formats
    if isinstance(raw, datetime) and raw.tzinfo is not None:  # Avro's timestamp-millis
        return raw.astimezone(UTC)
    if (isinstance(raw, int) and not isinstance(raw, bool)) or (
            isinstance(raw, str) and _DIGITS.match(raw)):
        if "epoch_millis" in forms:
            return EPOCH + timedelta(milliseconds=int(raw))
        if "epoch_seconds" in forms:
            return EPOCH + timedelta(seconds=int(raw))
    elif isinstance(raw, str) and "iso8601" in forms:
        t = datetime.fromisoformat(raw.strip())
        if t.tzinfo is not None:
            return t.astimezone(UTC)
    raise ValueError(f"{raw!r} is none of {', '.join(forms)}")


def window_start(spec: PipelineSpec, t: datetime) -> datetime:
    size = spec.windows.size
    return EPOCH + ((t - EPOCH) // size) * size


def _dimension(field_type: str, value) -> str | int | date:
    if field_type in ("int", "long"):
        return int(value)
    if field_type == "date":
        return value if isinstance(value, date) else date.fromisoformat(value)
    return str(value)


@dataclass(frozen=True)
class SpecRow:
    event_id: str
    time: datetime
    dimensions: tuple
    values: dict  # measure field -> Decimal


def rows_for_spec(spec: PipelineSpec, records) -> list[SpecRow]:
    """The valid rows of records in arrival order, read from their bytes (decimals exactly)."""
    shape, rows = spec.shape, []
    for r in records:
        if r.kind not in VALID_KINDS:
            continue
        e = (avro_events.decode(shape, r.value) if shape.format == "avro"
             else json.loads(r.value, parse_float=Decimal))
        rows.append(SpecRow(
            str(get(shape, e, shape.event_id)), parse_time(spec, get(shape, e,
                                                                    shape.event_time.field)),
            tuple(_dimension(shape.fields[d.source], get(shape, e, d.source))
                  for d in shape.dimensions),
            {f: Decimal(v.strip() if isinstance(v := get(shape, e, f), str) else v)
             for f in shape.measure_fields}))
    return rows


def expected_windows_for_spec(spec: PipelineSpec, records) -> dict:
    """{(window_start naive UTC, *dimension values): {"event_count": n, <measure column>:
    Decimal at the column's scale}} for arrival-ordered records: what gold must hold."""
    return windows_of_rows(spec, rows_for_spec(spec, records))


def windows_of_rows(spec: PipelineSpec, rows: list[SpecRow]) -> dict:
    """`expected_windows_for_spec` of arrival-ordered valid rows (the first arrival of an id
    within its date counts)."""
    shape, out = spec.shape, {}
    columns = [(m.field, column, aggregate, precision_scale(kind)[1])
               for m in shape.measures
               for (column, kind), aggregate in zip(shape.measure_columns_of(m), m.aggregates,
                                                    strict=True)]
    with localcontext(prec=80):  # exact: sums of decimal(38, s) values need up to 38+ digits
        for r in dedup(rows):
            k = (window_start(spec, r.time).replace(tzinfo=None), *r.dimensions)
            acc = out.setdefault(k, {"event_count": 0})
            acc["event_count"] += 1
            for field, column, aggregate, _ in columns:
                v = r.values[field]
                acc[column] = _COMBINE[aggregate](acc[column], v) if column in acc else v
        for acc in out.values():
            for _, column, _, scale in columns:
                acc[column] = acc[column].quantize(Decimal(f"1E-{scale}"))
    return out


def table_windows_for_spec(spec: PipelineSpec, table) -> dict:
    """A pyarrow aggregates table in `expected_windows_for_spec`'s shape (event_fingerprint
    and the bookkeeping columns left out). A naive window_start is UTC already (never local)."""
    measures = [c for m in spec.shape.measures for c, _ in spec.shape.measure_columns_of(m)]
    out = {}
    for r in table.to_pylist():
        start = r["window_start"]
        if start.tzinfo is not None:
            start = start.astimezone(UTC).replace(tzinfo=None)
        out[(start, *(r[d] for d in spec.shape.dimension_names))] = {
            "event_count": r["event_count"], **{c: r[c] for c in measures}}
    return out
