"""Table maintenance: compact the small files the stream and the daily runs leave, and VACUUM.

The stream appends one file per partition per micro-batch (8,640 a day at a 10 s trigger) and
MERGEs rewrite a few more; without compaction every read of a date pays for opening them all.
`maintain_tables` bin-packs (Delta OPTIMIZE) each partition holding at least `min_files` files,
only where no writer can be racing it:

- append-only stream tables (bronze, quarantine, late events, progress): dates before today
  (blind appends never conflict with a compaction; today is still growing);
- `streaming_aggregates`: dates before the stream's watermark date (each batch rewrites only the
  open partitions, windows ending after the watermark);
- the daily tables: dates before today, each under the date's lock.

On an object store Delta's log store is safe for one writing driver per table only, so the
stream's tables are maintained only under the stream's lock (`lakehouse.tables.locks`): while the
stream runs they are skipped and the run says so (stop the service for a maintenance window).
The output says when it took and released that lock (`writer lock:` lines, epoch ms), and the
locks' fences are checked before each commit (OPTIMIZE, VACUUM), as the writer does for every
writer (`spark_jobs.writer`).

A compaction changes no row (`dataChange=false`): the streaming source, the change feed, the
corrections' foreign-commit check and the metrics all skip it; its commits carry the pipeline's
tag. VACUUM then deletes files no longer referenced for longer than the table's Delta log
retention (`delta.logRetentionDuration`, 30 days by default): every version still in the log
stays readable, so a verification pinned to the position its gold rows were published from,
the late lane and the corrections' change-feed reads all work as long as Delta can time-travel
there at all.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import SparkSession

from lakehouse.config.settings import Settings
from lakehouse.config.storage import local_path
from lakehouse.kafka.feed import unsent
from lakehouse.tables.catalog import (
    ALL_TABLES,
    BRONZE,
    INGEST_QUERY,
    LATE,
    PROGRESS,
    QUARANTINE,
    RECONCILED,
    SKIPPED,
    STREAMING,
    Table,
)
from lakehouse.tables.commit_tags import stream_watermark
from lakehouse.tables.delta_log import open_table
from lakehouse.tables.locks import CheckpointBusy, Fences, checkpoint_lock, date_lock
from lakehouse.tables.stats import add_actions
from spark_jobs.writer import Writer, tagged_commits

# A partition is compacted once it holds this many files (bounded, not one per micro-batch).
MIN_FILES = 10
DEFAULT_LOG_RETENTION = timedelta(days=30)  # Delta's default delta.logRetentionDuration
APPEND_ONLY = (BRONZE, QUARANTINE, LATE, PROGRESS)
# Written by the stream's runner: on an object store only the holder of its lock commits to them.
STREAM_WRITTEN = (BRONZE, QUARANTINE, LATE, PROGRESS, STREAMING, SKIPPED)


@dataclass(frozen=True)
class Maintained:
    table: str
    dates_compacted: list[date]
    files_before: int
    files_removed: int
    files_added: int
    retention_hours: float
    files_vacuumed: int
    skipped: str = ""  # why nothing was done (the table's writer holds its lock)

    @property
    def files_after(self) -> int:
        return self.files_before - self.files_removed + self.files_added


def parse_interval(text: str) -> timedelta:
    """A Delta table property interval ("interval 30 days", "interval 1 weeks", "30 days")."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s+(week|day|hour|minute)s?\s*", text.lower())
    if not m:
        raise ValueError(f"cannot read the Delta interval {text!r} (expected e.g. 'interval 30 days')")
    return timedelta(**{f"{m.group(2)}s": int(m.group(1))})


def log_retention(log) -> timedelta:
    """The table's `delta.logRetentionDuration` (its opened delta-rs log), or Delta's default."""
    value = log.metadata().configuration.get("delta.logRetentionDuration")
    return parse_interval(value) if value else DEFAULT_LOG_RETENTION


def crowded_partitions(settings: Settings, table: Table, before: date, min_files: int) -> tuple[list[date], int]:
    """Partition dates before `before` with at least `min_files` files (from the Delta log), and
    the table's file count."""
    actions = add_actions(settings, table.name)
    if actions is None or actions.num_rows == 0:
        return [], 0
    counts = Counter(actions[f"partition.{table.partition_by}"].to_pylist())
    return sorted(d for d, n in counts.items() if d is not None and d < before and n >= min_files), \
        actions.num_rows


def compact_before(spark: SparkSession, settings: Settings, table: Table, today: date) -> date:
    """The first date a compaction of `table` must not touch (see the module docstring)."""
    if table == STREAMING:
        watermark = stream_watermark(settings)
        return min(today, watermark.date()) if watermark else date.min
    return today


def _say_lock(event: str, table: Table, settings: Settings) -> None:
    now = time.time()
    print(f"writer lock: maintenance of {table.name} {event} the stream checkpoint "
          f"{INGEST_QUERY!r}'s lock under {settings.root}, pid {os.getpid()} at "
          f"{int(now * 1000)}", flush=True)


def maintain_table(spark: SparkSession, settings: Settings, table: Table, today: date,
                   min_files: int = MIN_FILES) -> Maintained:
    log = open_table(settings, table.name)
    if log is None:  # not created yet (no run has been made): nothing to maintain
        return Maintained(table.name, dates_compacted=[], files_before=0, files_removed=0,
                          files_added=0, retention_hours=DEFAULT_LOG_RETENTION.total_seconds() / 3600,
                          files_vacuumed=0)
    dates, files = crowded_partitions(settings, table, compact_before(spark, settings, table, today),
                                      min_files)
    removed = added = 0
    retention = log_retention(log)
    fences = Fences()
    writer = Writer(spark, settings, fences)
    with ExitStack() as locks, tagged_commits(spark, f"maintenance:{table.name}"):
        if table in STREAM_WRITTEN and local_path(str(settings.root)) is None:
            # Delta's S3 log store takes one writing driver: the stream's lock, or no commit.
            try:
                fences.add(locks.enter_context(checkpoint_lock(settings, INGEST_QUERY)))
            except CheckpointBusy as busy:
                return Maintained(table.name, [], files, 0, 0,
                                  retention.total_seconds() / 3600, 0, skipped=str(busy))
            _say_lock("took", table, settings)
            # Runs before the lock is released, after the last commit.
            locks.callback(_say_lock, "releasing", table, settings)
        if dates:
            if table not in APPEND_ONLY and table != STREAMING:
                for d in dates:  # sorted: two maintainers cannot deadlock
                    fences.add(locks.enter_context(date_lock(settings, d)))
            where = "{} IN ({})".format(table.partition_by,
                                        ",".join(f"DATE'{d.isoformat()}'" for d in dates))
            metrics = writer.optimize(table, where).metrics
            removed, added = metrics.numFilesRemoved, metrics.numFilesAdded
        hours = retention.total_seconds() / 3600
        if table == RECONCILED and (kept := unsent(settings)):
            # Gold's change data is the feed's source until it is sent.
            return Maintained(table.name, dates, files, removed, added, hours, 0, skipped=kept)
        # The log says what VACUUM would delete (delta-rs, milliseconds); Spark's VACUUM (seconds
        # of directory listing per table) runs only when there is something.
        # (Data files only: delta-rs also lists the local file system's .crc sidecars.)
        expired = sum(f.endswith(".parquet") for f in open_table(settings, table.name).vacuum(
            int(hours), dry_run=True, enforce_retention_duration=False, full=True))
        if expired:
            writer.vacuum(table, hours)
    return Maintained(table.name, dates, files, removed, added, hours, expired)


def maintain_tables(spark: SparkSession, settings: Settings, today: date | None = None,
                    min_files: int = MIN_FILES) -> list[Maintained]:
    """Compact and vacuum every table of the lakehouse (the Dagster job `table_maintenance`)."""
    today = today or datetime.now(UTC).date()
    return [maintain_table(spark, settings, t, today, min_files) for t in ALL_TABLES]
