"""Avro records for a `format: avro` spec, and their independent decoding, with fastavro (a pure
Python Avro implementation, testkit-only: production decodes with Spark's `from_avro`).

`AvroCodec` turns `testkit.spec_events`' generated events into records of the spec's wire format
(Confluent: magic byte 0, 4-byte big-endian schema id, Avro binary), each written with one of
the spec's writer schemas at random (a field a writer lacks is left out: the reader schema's
default fills it), and makes the malformed records whose kind is the reason code the parser
records (`plan`). `decode` reads a record back as the reader schema sees it (fastavro's own
schema resolution), for the reference count.
"""

from __future__ import annotations

import io
import json
import random
import struct
import urllib.request
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import lru_cache

import fastavro

from lakehouse.events.avro import AvroInput, branches, kind
from lakehouse.events.shape import EventShape, precision_scale

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
UNKNOWN_ID_OFFSET = 97  # an id past the spec's newest: a schema registered after the spec
DROP, FUTURE, BEFORE_START = "drop", "future", "before_start"
# What an invalid_avro record is, in turn: a JSON object on the Avro topic (no magic byte), a
# record cut short, a header alone cut short, a record with its first byte changed.
INVALID_FORMS = ("json", "truncated", "short", "bad_magic")


def _writer_kind(avro: AvroInput, field: str) -> tuple[str, bool]:
    """The reader schema's kind of a field and whether it may be null."""
    bs, nullable = branches(avro.reader_schema.fields[field])
    return kind(bs[0]), nullable


def _scale(t) -> int | None:
    (b, *_), _ = branches(t)
    return b.get("scale", 0) if isinstance(b, dict) and b.get("logicalType") == "decimal" else None


def plan(shape: EventShape) -> dict[str, tuple[str | None, object]]:
    """Malformed kind -> (the field it spoils, what replaces it), in the parser's order
    (`spark_jobs.transforms.parse.reasons`), for what an Avro record can carry: a null only in a nullable
    field, a bad time or value only where the schema holds text."""
    avro = shape.avro
    t, measured = shape.event_time.field, shape.measure_fields
    out: dict[str, tuple[str | None, object]] = {}
    if avro.wire_format == "confluent":
        out["unknown_schema_id"] = (None, None)
    out["invalid_avro"] = (None, None)

    def nullable(field: str) -> bool:
        return _writer_kind(avro, field)[1]

    if nullable(shape.event_id):
        out["missing_event_id"] = (shape.event_id, DROP)
    read = {shape.event_id}
    for d in shape.dimensions:
        if d.source not in read:
            read.add(d.source)
            if nullable(d.source):
                out.setdefault(f"missing_{d.name}", (d.source, DROP))
    for f in measured:
        if nullable(f):
            out.setdefault(f"missing_{f}", (f, DROP))
    if _writer_kind(avro, t)[0] == "string":
        out.setdefault("invalid_event_time", (t, "yesterday at noon"))
    for f in measured:
        if _writer_kind(avro, f)[0] == "string":
            out.setdefault(f"invalid_{f}", (f, "12,50 EUR"))
    for f in measured:
        scale = precision_scale(shape.fields[f])[1]
        written = _scale(avro.reader_schema.fields[f])
        if _writer_kind(avro, f)[0] == "string" or (written or 0) > scale:
            out.setdefault(f"{f}_too_precise", (f, Decimal("0." + "0" * scale + "7")))
    out.setdefault("event_time_in_future", (t, FUTURE))
    out.setdefault("event_time_before_start", (t, BEFORE_START))
    return out


def avro_body(parsed, record: dict) -> bytes:
    """`record` in Avro's binary encoding by the parsed writer schema (no framing)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, record)
    return out.getvalue()


def confluent_frame(sid: int, body: bytes) -> bytes:
    """An Avro body in Confluent's wire format: magic byte 0, the schema id (4 bytes, big-endian)."""
    return b"\x00" + struct.pack(">I", sid) + body


class AvroCodec:
    """Encodes generated events as the spec's Avro records."""

    def __init__(self, shape: EventShape):
        self.shape, self.avro = shape, shape.avro
        self.parsed = {sid: fastavro.parse_schema(s.parsed) for sid, s in self.avro.schemas.items()}
        self.reader = fastavro.parse_schema(self.avro.reader_schema.parsed)

    def _body(self, sid: int, record: dict) -> bytes:
        return avro_body(self.parsed[sid], record)

    def _frame(self, sid: int, body: bytes) -> bytes:
        return body if self.avro.wire_format == "plain" else confluent_frame(sid, body)

    def _time_value(self, field_type, t: datetime) -> object:
        ms = (t - EPOCH) // timedelta(milliseconds=1)
        k = kind(branches(field_type)[0][0])
        if k in ("timestamp-millis", "long"):
            return ms if "epoch_millis" in self.shape.event_time.formats or k != "long" \
                else ms // 1000
        if k == "int":
            return ms // 1000
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def record(self, sid: int, event: dict, t: datetime) -> dict:
        """The generated (JSON-typed) event as writer `sid`'s record at event time `t`."""
        out = {}
        for name, field_type in self.avro.schemas[sid].fields.items():
            if name == self.shape.event_time.field:
                out[name] = self._time_value(field_type, t)
                continue
            if name not in event:
                continue  # a field the spec does not read: its default, if any
            (b, *_), _ = branches(field_type)
            k, v = kind(b), event[name]
            out[name] = (Decimal(str(v)) if k == "decimal" else int(v) if k in ("int", "long")
                         else date.fromisoformat(v) if k == "date" else str(v))
        return out

    def encode(self, event: dict, t: datetime, rnd: random.Random) -> tuple[bytes, dict]:
        """(record bytes, the record as written) in one of the writer schemas."""
        sid = rnd.choice(sorted(self.avro.schemas))
        record = self.record(sid, event, t)
        return self._frame(sid, self._body(sid, record)), record

    def malformed(self, kind_: str, event: dict, t: datetime, rnd: random.Random,
                  n: int) -> bytes:
        """A record of malformed kind `kind_` (the n-th malformed record)."""
        sid = rnd.choice(sorted(self.avro.schemas))
        field, replacement = plan(self.shape)[kind_]
        if kind_ == "unknown_schema_id":
            body = self._body(sid, self.record(sid, event, t))
            return confluent_frame(max(self.avro.schemas) + UNKNOWN_ID_OFFSET, body)
        if kind_ == "invalid_avro":
            good = self._frame(sid, self._body(sid, self.record(sid, event, t)))
            form = INVALID_FORMS[n % len(INVALID_FORMS)]
            if self.avro.wire_format == "plain" or form == "truncated":
                # A strict prefix of a record never decodes: the decoder reads past its end.
                head = 0 if self.avro.wire_format == "plain" else 5
                return good[: head + (len(good) - head) // 2]
            if form == "json":
                return b'{"' + self.shape.event_id.encode() + b'": "not avro"}'
            if form == "short":
                return good[:3]
            return b"\x01" + good[1:]
        record = self.record(sid, event, t)
        if replacement == DROP:
            record[field] = None
        elif replacement == FUTURE:
            record[field] = self._time_value(self.avro.schemas[sid].fields[field],
                                             t + timedelta(days=3650))
        elif replacement == BEFORE_START:  # seconds where milliseconds are due, or 1970-01-02
            ms = self._time_value(self.avro.schemas[sid].fields[field], t)
            record[field] = (ms // 1000 if isinstance(ms, int) and ms > 10**12 else
                             86_400 if isinstance(ms, int) else "1970-01-02T00:00:00Z")
        else:
            record[field] = replacement if not isinstance(replacement, Decimal) else (
                str(replacement) if _writer_kind(self.avro, field)[0] == "string"
                else replacement)
        return self._frame(sid, self._body(sid, record))


@lru_cache(maxsize=64)
def _parsed(text: str) -> dict:
    return fastavro.parse_schema(json.loads(text))


def decode(shape: EventShape, value: bytes) -> dict:
    """A record's fields as the reader schema sees them (fastavro's schema resolution): decimals
    as Decimal, timestamp-millis as aware datetimes, dates as dates."""
    avro = shape.avro
    if avro.wire_format == "confluent":
        (sid,) = struct.unpack(">I", value[1:5])
        body = value[5:]
    else:
        (sid,), body = avro.schemas, value
    return fastavro.schemaless_reader(io.BytesIO(body), _parsed(avro.schemas[sid].text),
                                      _parsed(avro.reader_schema.text))


def register_schema(url: str, subject: str, schema: dict | str) -> int:
    """Register a writer schema under `subject` of the registry at `url` (its Confluent API's
    base); the id the registry gives it."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    request = urllib.request.Request(
        f"{url}/subjects/{subject}/versions", data=json.dumps({"schema": text}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["id"]
