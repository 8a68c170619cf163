"""Run metadata for the stream assets, without a Spark job and at a cost that does not grow with
history: totals from the Delta log's statistics (`lakehouse.tables.stats`), and what this run did
(its batches' quarantine reasons and late rows, the open windows, the newest closed window)
through delta-rs' query engine, which skips files by their statistics as Spark does (on
`batch_id`/`bronze_batch_id`, the `status` partition, `window_end` from a floor the log gives).
No query here reads the whole of a table.

Spark ran three queries here before (each a snapshot update, a file-filtering job and the query's
own job: ~3 s of a warm catch-up of 750 records, 2026-11-28); delta-rs answers the same in
milliseconds on these few files. The module stays beside the stream it describes because it
reads the stream's checkpoint (`lakehouse.tables.checkpoints`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import QueryBuilder

from lakehouse.config.settings import Settings
from lakehouse.tables import checkpoints as ckpt
from lakehouse.tables.catalog import (
    BRONZE,
    FINAL,
    INGEST_QUERY,
    LATE,
    OPEN,
    QUARANTINE,
    STREAMING,
)
from lakehouse.tables.commit_tags import stream_watermark
from lakehouse.tables.delta_log import open_table
from lakehouse.tables.stats import largest_file_max_at_most, log_stats


def _in_run(column: str, batch_ids: list[int]) -> str:
    """SQL: rows written by this run's batches; the range lets delta-rs skip every older file."""
    if not batch_ids:
        return "FALSE"
    ids = ", ".join(str(int(b)) for b in batch_ids)
    return f"({column} >= {min(batch_ids)} AND {column} IN ({ids}))"


def _query(settings: Settings, name: str, sql: str) -> list[dict] | None:
    """`sql` over table `name` (as `t`) at its newest version; None when it does not exist."""
    table = open_table(settings, name)
    if table is None:
        return None
    return pa.table(QueryBuilder().register("t", table).execute(sql).read_all()).to_pylist()


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def bronze_summary(settings: Settings, batch_ids: list[int]) -> dict:
    """Totals from the log, and the quarantine reasons of this run's batches (`batch_ids`)."""
    bronze = log_stats(settings, BRONZE.name, max_of=("event_time",))
    quarantine = log_stats(settings, QUARANTINE.name)
    reasons = {}
    if batch_ids:
        rows = _query(settings, QUARANTINE.name,
                      f"SELECT reason, count(*) AS n FROM t "
                      f"WHERE {_in_run('bronze_batch_id', batch_ids)} GROUP BY reason") or []
        reasons = {r["reason"]: r["n"] for r in sorted(rows, key=lambda r: -r["n"])}
    return {
        "pipeline": settings.pipeline,
        "bronze_rows": bronze.rows,
        # From the files' statistics: to the millisecond.
        "newest_event_time": _iso(bronze.max["event_time"]),
        "quarantined_rows": quarantine.rows,
        "quarantined_rows_in_run": sum(reasons.values()),
        "quarantine_reasons_in_run": reasons,
    }


def seconds_since(when: datetime | None, now: datetime) -> float | None:
    return round((now - when).total_seconds(), 1) if when else None


@dataclass(frozen=True)
class RecentWindows:
    open: int
    touched: int  # rows written by this run's batches
    closed: int  # of those, final
    newest_closed_end: datetime | None


def recent_windows(settings: Settings, batch_ids: list[int],
                   watermark: datetime | None) -> RecentWindows:
    """One query over the files that can hold an open window, a row of this run's batches, or a
    closed window newer than every file lying wholly below the watermark (the log's floor).
    The stream finalizes every window ending at or before the watermark, so the floor is itself
    a closed window's end when the query finds none newer."""
    floor = (largest_file_max_at_most(settings, STREAMING.name, "window_end", watermark)
             if watermark else None)
    in_run = _in_run("batch_id", batch_ids)
    # Window ends lie on the window grid, so "after the floor" is ">= floor + one window". Not
    # "> floor": Delta widens timestamp maxima by 1 ms (its stats are in milliseconds), so that
    # would still read every file whose maximum is the floor.
    is_open, is_final = f"status = '{OPEN}'", f"status = '{FINAL}'"
    newer_closed = is_final + (
        f" AND window_end >= TIMESTAMP '{_iso(floor + settings.window_size)}'" if floor else "")
    rows = _query(
        settings, STREAMING.name,
        f"SELECT count(CASE WHEN {is_open} THEN 1 END) AS open, "
        f"count(CASE WHEN {in_run} THEN 1 END) AS touched, "
        f"count(CASE WHEN {in_run} AND {is_final} THEN 1 END) AS closed, "
        f"max(CASE WHEN {newer_closed} THEN window_end END) AS newest_closed "
        f"FROM t WHERE {is_open} OR {in_run} OR ({newer_closed})")
    if rows is None:
        return RecentWindows(0, 0, 0, floor)
    row = rows[0]
    newest = row["newest_closed"]
    return RecentWindows(row["open"], row["touched"], row["closed"],
                         newest.astimezone(UTC) if newest is not None else floor)


def late_in_run(settings: Settings, batch_ids: list[int]) -> tuple[int, int]:
    """(late rows this run's batches recorded, of which beyond their date's correction horizon:
    a broker time after `Settings.applicable_cutoff` of their date, the cut the corrections and
    the replay apply). Compared in epoch microseconds (the table's unit), whatever the host's
    zone: the date's end is (days since the epoch + 1) whole days."""
    if not batch_ids:
        return 0, 0
    horizon_us = int(settings.correction_horizon.total_seconds() * 1_000_000)
    cutoff = (f"(CAST(arrow_cast(event_date, 'Int32') AS BIGINT) + 1) * 86400000000 "
              f"+ {horizon_us}")
    rows = _query(settings, LATE.name,
                  f"SELECT count(*) AS n, sum(CASE WHEN arrow_cast(kafka_timestamp, 'Int64') > "
                  f"{cutoff} THEN 1 ELSE 0 END) AS beyond "
                  f"FROM t WHERE {_in_run('batch_id', batch_ids)}")
    if not rows:
        return 0, 0
    return rows[0]["n"], rows[0]["beyond"] or 0


def streaming_summary(settings: Settings, batch_ids: list[int]) -> dict:
    """Totals, plus what this run's batches (`batch_ids`) did, and freshness: now minus the
    newest event time, and now minus the end of the newest closed window."""
    now = datetime.now(UTC)
    wm = stream_watermark(settings)
    windows = log_stats(settings, STREAMING.name)
    late = log_stats(settings, LATE.name)
    newest_event = log_stats(settings, BRONZE.name, max_of=("event_time",)).max["event_time"]
    recent = recent_windows(settings, batch_ids, wm)
    late_n, late_beyond = late_in_run(settings, batch_ids)
    committed = ckpt.last_commit_time(settings.checkpoint_path(INGEST_QUERY))
    return {
        "windows": windows.rows,
        "windows_open": recent.open,
        "windows_final": windows.rows - recent.open if windows.rows is not None else None,
        "windows_updated_in_run": recent.touched,
        "windows_closed_in_run": recent.closed,
        "watermark": wm.isoformat() if wm else None,
        "late_events": late.rows,
        "late_events_in_run": late_n,
        # Arrived after their date's correction horizon: kept and reported, never applied.
        "late_events_beyond_horizon_in_run": late_beyond,
        "freshness_newest_event_s": seconds_since(newest_event, now),
        "freshness_newest_closed_window_s": seconds_since(recent.newest_closed_end, now),
        "checkpoint_age_s": round(now.timestamp() - committed, 1) if committed else None,
    }
