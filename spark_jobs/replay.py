"""Replay: recompute a date's aggregates straight from the Kafka log, independently of bronze and
of the stream's state, with the same parsing, dedup and window rules.

With LogAppendTime the broker time is monotonic per partition, so the records that can hold
events of date D are those appended in [D start - future skew, D end + correction horizon]
(capped at now): an event of D appended earlier would be more than the allowed skew in the
future (quarantined), and one appended later is beyond the horizon (not applied).

The replay reads the same log prefix as the gold rows it is compared with: up to the Kafka
position stamped on a bronze version (`tables.bronze_position`): the version the date's last
corrections run used (verification), or the newest one when corrections follow in the same run
(which then compute from that same version). A date never corrected is replayed to the log
end. Records the stream has not ingested yet are left for the next run instead of failing the
proof.

If retention already deleted records the pipeline saw for D (bronze holds offsets of D below a
partition's log start offset), the replay raises `ReplayIncomplete` naming the missing offsets:
it never publishes a partial replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse.kafka_admin import PartitionOffsets, offsets_for_time, topic_offsets
from lakehouse.settings import Settings, day_bounds
from spark_jobs.counting import events_for_date
from spark_jobs.parse import parsed_events
from spark_jobs.tables import (
    BRONZE,
    REPLAY,
    REPLAY_STATE,
    LogPosition,
    bronze_position,
    ensure_tables,
    latest_row,
    read_table,
    table_version,
)
from spark_jobs.windows import aggregate_windows


class ReplayIncomplete(RuntimeError):
    """The retained log no longer holds every record of the date."""

    def __init__(self, d: date, missing: dict[int, tuple[int, int]]):
        self.event_date = d
        self.missing = missing
        ranges = ", ".join(f"partition {p}: offsets {lo}..{hi - 1}" for p, (lo, hi) in missing.items())
        super().__init__(
            f"replay of {d} is incomplete: retention deleted records the pipeline ingested "
            f"({ranges}); the date cannot be proven against the log"
        )


@dataclass
class ReplayResult:
    event_date: date
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    records_read: int = 0
    events: int = 0
    quarantined: int = 0
    windows: int = 0
    read_until: datetime | None = None
    bronze_version: int | None = None  # the position's version; None: read to the log end

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


def missing_offsets(spark: SparkSession, settings: Settings, d: date,
                    offsets: list[PartitionOffsets] | None = None) -> dict[int, tuple[int, int]]:
    """Offsets of `d` seen in bronze that the log no longer retains, per partition."""
    offsets = offsets if offsets is not None else topic_offsets(settings)
    log_start = {p.partition: p.earliest for p in offsets}
    seen = (
        read_table(spark, settings, BRONZE)
        .where((F.col("event_date") == F.lit(d)) & (F.col("topic") == settings.events_topic))
        .groupBy("partition")
        .agg(F.min("offset").alias("lo"))
        .collect()
    )
    return {
        r.partition: (r.lo, log_start[r.partition])
        for r in seen
        if r.partition in log_start and r.lo < log_start[r.partition]
    }


def run_replay(spark: SparkSession, settings: Settings, d: date, as_of: int | None = None,
               run_id: str = "", to_log_end: bool = False) -> ReplayResult:
    """Replay `d` up to the log position of bronze version `as_of` (None: the newest), or
    everything retained (`to_log_end`: nothing to compare with yet)."""
    ensure_tables(spark, settings)
    offsets = topic_offsets(settings)  # one broker round trip for the check and the ranges
    missing = missing_offsets(spark, settings, d, offsets)
    if missing:
        raise ReplayIncomplete(d, missing)
    position = None
    if not to_log_end:
        version = as_of if as_of is not None else table_version(spark, settings, BRONZE)
        position = bronze_position(spark, settings, version)
    ranges, until = offset_ranges(settings, d, position, offsets)
    result = ReplayResult(d, ranges=ranges, read_until=until,
                          bronze_version=position.version if position else None)
    read = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if read:
        topic = settings.events_topic
        raw = (
            spark.read.format("kafka")
            .options(**settings.spark_kafka_options)
            .option("assign", json.dumps({topic: sorted(read)}))  # only non-empty ranges
            .option("startingOffsets", json.dumps({topic: {str(p): lo for p, (lo, _) in read.items()}}))
            .option("endingOffsets", json.dumps({topic: {str(p): hi for p, (_, hi) in read.items()}}))
            .option("failOnDataLoss", "true")
            .load()
        )
        with parsed_events(raw, settings) as (valid, quarantined):
            windows = aggregate_windows(events_for_date(valid, settings, d), settings)
            _write_replay(windows, settings, d)
            result.records_read = sum(hi - lo for lo, hi in read.values())
            result.quarantined = quarantined.count()
    else:
        empty = spark.createDataFrame([], read_table(spark, settings, REPLAY).schema)
        _write_replay(empty.drop("replayed_at"), settings, d)
    written = read_table(spark, settings, REPLAY).where(F.col("event_date") == F.lit(d))
    agg = written.agg(F.count("*").alias("w"), F.sum("event_count").alias("e")).first()
    result.windows, result.events = agg.w, int(agg.e or 0)
    row = (d, result.bronze_version, run_id, datetime.now(UTC))
    # The declared schema, not the table's: a table created by an older release with more
    # (nullable) columns still takes the row.
    spark.createDataFrame([row], REPLAY_STATE.ddl).write.format(
        "delta").mode("append").save(settings.table_path(REPLAY_STATE.name))
    return result


def replayed_in_run(spark: SparkSession, settings: Settings, d: date,
                    run_id: str | None) -> int | None:
    """The bronze version the replay of `d` in run `run_id` (None: the latest replay) read up
    to (None: no such replay, or it read to the log end)."""
    match = {"run_id": run_id} if run_id is not None else {}
    row = latest_row(spark, settings, REPLAY_STATE, d, "replayed_at", **match)
    return row.bronze_version if row else None


def _write_replay(windows, settings: Settings, d: date) -> None:
    (
        windows.withColumn("replayed_at", F.lit(datetime.now(UTC)))
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"event_date = DATE'{d.isoformat()}'")
        .save(settings.table_path(REPLAY.name))
    )
