"""What a corrections run did for one date (metadata, bench figures)."""

from __future__ import annotations

import time as _time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime


@dataclass
class CorrectionResult:
    event_date: date
    mode: str = "full"
    reason: str = ""
    bronze_version: int = -1
    windows_recomputed: int = 0
    windows: int = 0
    inserted: int = 0
    corrected: int = 0
    removed: int = 0
    finalized: int = 0
    changelog_repaired: int = 0  # corrections of a run that died before logging them
    beyond_horizon: int = 0
    late_events: int = 0
    watermark: datetime | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, stage: str):
        """Wall seconds per stage of the run (metadata: where a slow run spends its time)."""
        t0 = _time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + _time.perf_counter() - t0, 2)

    def as_metadata(self) -> dict:
        return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in vars(self).items()}
