"""An independent reference model of the pipeline's semantics, in plain Python (no Spark):
the expected tables for records produced in chunks with one catch-up after each chunk. The
row, dedup and window rules are `testkit.reference` (one copy, shared with the drills)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from testkit.reference import (  # noqa: F401 - re-exported for the tests
    DELAY,
    VALID_KINDS,
    WINDOW,
    Row,
    aggregate,
    dedup,
    event_time,
    rows_of,
    window_start,
)


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
