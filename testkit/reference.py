"""An independent count of what the pipeline must publish, in plain Python (no Spark, no
Delta): the valid rows of generated records, deduplicated and aggregated per window and key.

Shared by the drills and the tests (`tests/reference.py` builds its chunk model on these), so
there is one copy of the reference semantics (docs/design.md §4):
- a record is valid when the generator made it as an event (`VALID_KINDS`);
- the first copy of an event_id within its event date counts (arrival order);
- tumbling 1-minute windows by event time, UTC; exact decimals (6 fractional digits).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
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
    """Valid rows of records produced in `chunks` (lists of generator Records, in arrival
    order), and the count of the other records by kind."""
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
    """{(window_start naive UTC, key): (event_count, value_sum, value_min, value_max)}"""
    out: dict = {}
    for r in rows:
        k = (window_start(r.time).replace(tzinfo=None), r.key)
        n, s, lo, hi = out.get(k, (0, Decimal(0), r.value, r.value))
        out[k] = (n + 1, s + r.value, min(lo, r.value), max(hi, r.value))
    return out


def expected_windows(records) -> dict:
    """What gold and the replay must hold for `records` (one arrival-ordered list): every date."""
    rows, _ = rows_of([records])
    return aggregate(dedup(rows))


def table_windows(table) -> dict:
    """A delta-rs/pyarrow aggregates table in `aggregate`'s shape."""
    return {(r["window_start"].astimezone(UTC).replace(tzinfo=None), r["key"]):
            (r["event_count"], r["value_sum"], r["value_min"], r["value_max"])
            for r in table.to_pylist()}
