"""`stream_progress`: one row per micro-batch of each query, from Spark's own progress reports
plus the topic's end offsets at that time (Spark's Kafka source commits no consumer-group
offsets, so lag is the end offsets minus the query's processed end offsets)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from lakehouse.kafka.admin import PartitionOffsets, consumer_lag
from lakehouse.tables.catalog import INGEST_QUERY, PROGRESS
from lakehouse.tables.commit_tags import StreamCommit, stream_commits
from lakehouse.tables.progress_reports import BatchReport, as_dict
from spark_jobs.writer import Writer


def progress_row(query: str, p: dict, kafka_offsets: list[PartitionOffsets] | None,
                 commit: StreamCommit | None = None) -> dict:
    """One `stream_progress` row from a progress report; the watermark and the rows left out as
    late come from the batch's bronze commit (`commit`: the ingest query runs no stateful
    operator, so its reports carry neither)."""
    r = BatchReport.of(p)
    state = r.state_operators
    ts = r.timestamp or datetime.now(UTC)
    dropped = sum(int(s.get("numRowsDroppedByWatermark", 0)) for s in state)
    watermark = r.watermark
    if commit is not None:
        dropped = commit.late
        watermark = datetime.fromtimestamp(commit.next_watermark_ms / 1000, tz=UTC)
    return {
        "query": query,
        "batch_id": r.batch_id,
        "batch_timestamp": ts,
        "input_rows": r.input_rows,
        "input_rows_per_second": r.input_rate,
        "processed_rows_per_second": r.processed_rate,
        "start_offsets": json.dumps(r.start_offsets),
        "end_offsets": json.dumps(r.end_offsets),
        "watermark": watermark,
        "rows_dropped_by_watermark": dropped,
        "state_rows": sum(int(s.get("numRowsTotal", 0)) for s in state),
        "state_memory_bytes": sum(int(s.get("memoryUsedBytes", 0)) for s in state),
        "duration_ms": json.dumps(r.durations),
        "trigger_ms": r.trigger_ms,
        "kafka_end_offsets": json.dumps({str(o.partition): o.latest for o in kafka_offsets})
        if kafka_offsets else None,
        "kafka_lag": sum(consumer_lag(kafka_offsets, r.processed).values())
        if kafka_offsets and query == INGEST_QUERY else None,
        "progress_date": ts.date(),
    }


def record_progress(
    writer: Writer,
    query: str,
    progresses: list,
    kafka_offsets: list[PartitionOffsets] | None = None,
) -> int:
    """Append one row per batch (the last report of a batch id wins), as one idempotent Delta
    append: txnAppId = the query's id (the checkpoint's), txnVersion = the newest batch id, so
    recording the same reports again writes nothing. Callers report each batch once (a catch-up
    its own batches, the service what it has not recorded yet). On a local root delta-rs
    commits it (`Writer.append_rows`: milliseconds, where Spark's append took 4.2 s of a
    cold catch-up); on an object store, Spark."""
    settings = writer.settings
    reports = {r["batchId"]: r for r in map(as_dict, progresses)}
    if not reports:
        return 0
    # The batches' bronze commits are among bronze's newest (one stream commit per batch).
    commits = {(c.query, c.batch_id): c
               for c in stream_commits(settings, len(reports) + 16) if c.query is not None}
    # The topic's end offsets are read now: they give the lag of the newest batch only (the
    # service records the batches of the last 30 s at once; older ones get no lag, not a wrong
    # one).
    newest = max(reports)
    rows = [progress_row(query, r, kafka_offsets if b == newest else None,
                         commits.get((r.get("id"), b)))
            for b, r in sorted(reports.items())]
    app = (f"stream_progress:{query}:{reports[newest]['id']}", newest)
    writer.append_rows(PROGRESS, rows, app)
    return len(rows)
