"""An independent reference model of the pipeline's semantics, in plain Python (no Spark):
the expected tables for records produced in chunks with one catch-up after each chunk."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

WINDOW = timedelta(minutes=1)
DELAY = timedelta(seconds=30)
VALID_KINDS = ("event", "late", "duplicate", "late_duplicate")


def event_time(raw) -> datetime:
    if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()):
        return datetime.fromtimestamp(int(raw) / 1000, UTC)
    return datetime.fromisoformat(raw.replace("Z", "+00:00")).astimezone(UTC)


def window_start(t: datetime) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((t - epoch) // WINDOW) * WINDOW


@dataclass(frozen=True)
class Row:
    event_id: str
    key: str
    time: datetime
    value: Decimal
    chunk: int


def rows_of(chunks) -> tuple[list[Row], Counter]:
    rows, malformed = [], Counter()
    for c, records in enumerate(chunks):
        for r in records:
            if r.kind not in VALID_KINDS:
                malformed[r.kind] += 1
                continue
            e = json.loads(r.value)
            rows.append(Row(e["event_id"], e["key"], event_time(e["event_time"]),
                            Decimal(str(e["value"])).quantize(Decimal("0.000001")), c))
    return rows, malformed


def dedup(rows):
    seen, out = set(), []
    for r in rows:
        k = (r.time.date(), r.event_id)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def aggregate(rows) -> dict:
    out: dict = {}
    for r in rows:
        k = (window_start(r.time).replace(tzinfo=None), r.key)
        n, s, lo, hi = out.get(k, (0, Decimal(0), r.value, r.value))
        out[k] = (n + 1, s + r.value, min(lo, r.value), max(hi, r.value))
    return out


@dataclass
class Expected:
    rows: list[Row]
    malformed: Counter
    watermarks: list[datetime | None] = field(default_factory=list)  # used by each chunk
    late: list[Row] = field(default_factory=list)

    @classmethod
    def of(cls, chunks) -> Expected:
        rows, malformed = rows_of(chunks)
        exp = cls(rows, malformed)
        seen_max = None
        for c in range(len(chunks)):
            wm = seen_max - DELAY if seen_max else None
            exp.watermarks.append(wm)
            mine = [r for r in rows if r.chunk == c]
            exp.late += [r for r in mine if wm is not None and r.time <= wm]
            if mine:
                top = max(r.time for r in mine)
                seen_max = top if seen_max is None else max(seen_max, top)
        exp.final_watermark = seen_max - DELAY if seen_max else None
        return exp

    def reconciled(self, upto_chunk: int | None = None) -> dict:
        rows = [r for r in self.rows if upto_chunk is None or r.chunk <= upto_chunk]
        return aggregate(dedup(rows))

    def streaming(self) -> dict:
        late = {id(r) for r in self.late}
        return aggregate(dedup([r for r in self.rows if id(r) not in late]))
