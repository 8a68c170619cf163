"""Which Kafka records can hold the events of a date (with LogAppendTime the broker time is
monotonic per partition, so a date is an offset range per partition), and what a replay of them
found or could not prove. Kafka offsets only: the replay itself is `spark_jobs.replay`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from lakehouse.config.settings import Settings, day_bounds
from lakehouse.kafka.admin import PartitionOffsets, offsets_for_time, topic_offsets
from lakehouse.tables.commit_tags import LogPosition


class ReplayIncomplete(RuntimeError):
    """The retained log may no longer hold every record of the date: the date cannot be proven.

    `missing`: partition -> (first offset that may be missing, log start offset), with `why` per
    partition: records the pipeline ingested were deleted by retention, or retention cut the log
    after the date's first possible append time (a fresh instance on a cut topic sees the same
    truncated log on both sides, which proves nothing), or the stream never read the partition.
    """

    def __init__(self, d: date, missing: dict[int, tuple[int, int]],
                 why: dict[int, str] | None = None, since: datetime | None = None):
        self.event_date = d
        self.missing = missing
        self.why = why or {p: "deleted by retention after ingestion" for p in missing}
        self.since = since
        ranges = ", ".join(f"partition {p}: offsets {lo}..{hi - 1} ({self.why[p]})"
                           for p, (lo, hi) in sorted(missing.items()))
        span = f" records appended since {since.isoformat()} may be missing;" if since else ""
        super().__init__(
            f"replay of {d} is incomplete:{span} {ranges}; the date cannot be proven against "
            "the log"
        )

    def as_metadata(self) -> dict:
        return {
            "event_date": self.event_date.isoformat(),
            "missing_offsets": {str(p): {"first_missing": lo, "log_start": hi, "why": self.why[p]}
                                for p, (lo, hi) in sorted(self.missing.items())},
            "missing_since": self.since.isoformat() if self.since else None,
        }


@dataclass
class ReplayResult:
    event_date: date
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    records_read: int = 0
    events: int = 0
    quarantined: int = 0
    windows: int = 0
    read_until: datetime | None = None
    bronze_version: int | None = None  # the bronze version whose log position capped the read
    # What the replay cost: Kafka records and bytes fetched, bytes and files written, the
    # storage operations and CPU seconds measured around it (spark_jobs.costs).
    cost: dict = field(default_factory=dict)
    # What the replay cost: Kafka records and bytes fetched, bytes and files written, the
    # storage operations and CPU seconds measured around it (spark_jobs.costs).
    cost: dict = field(default_factory=dict)

    def as_metadata(self) -> dict:
        return {
            "event_date": self.event_date.isoformat(),
            "offset_ranges": {str(p): f"[{lo}, {hi})" for p, (lo, hi) in self.ranges.items()},
            "records_read": self.records_read,
            "events": self.events,
            "quarantined_in_range": self.quarantined,
            "windows": self.windows,
            "read_until": self.read_until.isoformat() if self.read_until else None,
            "as_of_bronze_version": self.bronze_version,
            "cost": self.cost,
        }


def offset_ranges(settings: Settings, d: date, position: LogPosition | None = None,
                  offsets: list[PartitionOffsets] | None = None
                  ) -> tuple[dict[int, tuple[int, int]], datetime]:
    """[lo, hi) per partition holding the records of `d`, capped at `position` if given.
    `offsets`: the topic's offsets if just read."""
    start, _ = day_bounds(d)
    now = datetime.now(UTC)
    until = min(settings.applicable_cutoff(d), now)
    offsets = offsets if offsets is not None else topic_offsets(settings)
    lo = offsets_for_time(settings, int((start - settings.future_skew).timestamp() * 1000),
                          known=offsets)
    if until >= now:
        hi = {p.partition: p.latest for p in offsets}
    else:
        # First offset appended after `until` (exclusive end).
        hi = offsets_for_time(settings, int(until.timestamp() * 1000) + 1, known=offsets)
    if position is not None:  # partitions the stream had not seen yet: nothing read
        hi = {p: max(lo[p], min(h, position.end_offsets.get(p, lo[p]))) for p, h in hi.items()}
    return {p: (lo[p], hi[p]) for p in sorted(hi)}, until
