"""`make stream`: the fast path as a long-running service (processing-time trigger).

Runs the same query, on the same checkpoint, as the Dagster catch-up assets; holds the
checkpoint lock while running, so a catch-up started meanwhile fails with a clear error instead
of corrupting the checkpoint. SIGTERM or SIGINT stops the query and exits 0; since every
write of a batch is idempotent, a stop (or a crash) mid-batch is repaired by the next start.
While it runs, Prometheus metrics are served on 127.0.0.1:$METRICS_PORT/metrics
(`service.metrics`).

The output says when the service took, released or lost the writer lock (`writer lock: ...`
lines with the epoch milliseconds), so its commits can be matched to the time it held it. On an
object store a lock whose PostgreSQL session is gone is lost: the service checks it at every
poll and before each bookkeeping commit (the query checks it before each of its commits), stops
the query without committing again and exits 3.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import ExitStack

from confluent_kafka import KafkaException

from lakehouse.catalog import INGEST_QUERY
from lakehouse.kafka_admin import PartitionOffsets, ensure_topic, topic_offsets
from lakehouse.locks import CheckpointBusy, Fence, WriterLockLost, checkpoint_lock
from lakehouse.progress_reports import BatchReport, as_dict
from lakehouse.settings import Settings, SettingsError, spark_interval
from lakehouse.topic_checks import retention_shortfall
from lakehouse.topic_status import retention_ms
from service.metrics import serving
from spark_jobs.progress import record_progress
from spark_jobs.recent_ids import RecentIds
from spark_jobs.session import get_spark
from spark_jobs.stream import (
    MAX_RESTARTS,
    DataLost,
    TopicReplaced,
    Trigger,
    is_known_restart_bug,
    start_ingest,
)
from specs.pipeline import selected_pipeline

PROGRESS_EVERY_S = 30.0  # stream_progress bookkeeping: at most one commit per this long
LOCK_LOST = 3  # exit status of a service that lost its writer lock
# After losing the lock the metrics stay up this long (lakehouse_writer_lock_held 0), so that
# Prometheus scrapes the loss before the process exits (SIGTERM cuts it short).
LOCK_LOST_LINGER_S = 30.0


def say_lock(event: str, settings: Settings) -> None:
    """A `writer lock:` line: what happened to the stream's lock, when (epoch ms), who."""
    now = time.time()
    print(f"writer lock: {event} (the stream checkpoint {INGEST_QUERY!r} under {settings.root}) "
          f"pid {os.getpid()} at {int(now * 1000)} "
          f"({time.strftime('%H:%M:%S', time.gmtime(now))}.{int(now * 1000) % 1000:03d}Z)",
          flush=True)


def lost_lock(exc: BaseException | None) -> bool:
    """Whether a query failed because its writer lock was lost (raised in its batch)."""
    return exc is not None and WriterLockLost.__name__ in str(exc)


def died_silently(query) -> bool:
    """The query's thread is gone with no exception recorded: a JVM error (seen: a
    StackOverflowError in the Kafka source's progress metrics after a restart, Spark 4.1.1)
    ends the thread without failing the query. Its batch had committed; a restart resumes
    from the checkpoint."""
    return query.exception() is None and not query.isActive


def serve(settings: Settings, stop: threading.Event) -> int:
    interval = spark_interval(settings.stream_trigger_interval)
    ensure_topic(settings)
    if warning := retention_shortfall(settings, retention_ms(settings)):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    spark = get_spark(settings)
    recent = RecentIds()  # the dedup's in-memory index, kept across restarts of the query

    def start():
        return start_ingest(spark, settings, Trigger(available_now=False, interval=interval),
                            recent, fence)

    lost: WriterLockLost | None = None
    with ExitStack() as held:
        fence = held.enter_context(checkpoint_lock(settings, INGEST_QUERY))
        say_lock("took", settings)
        # Runs before the lock is released (after the query stopped and the last bookkeeping).
        held.callback(lambda: lost is None and say_lock("releasing", settings))
        # Before the query starts: the metrics count every record it commits.
        metrics = held.enter_context(serving(settings, spark))
        if metrics is not None:
            metrics.lock_held(True)
        query = start()
        print(f"streaming {settings.events_topic} -> {settings.root} every {interval}; "
              "SIGTERM to stop", flush=True)
        book = _Bookkeeping(spark, settings, metrics, fence)
        restarts = 0
        failed = None
        while not stop.wait(min(settings.stream_trigger_interval.total_seconds(), 5.0)):
            try:
                fence.check()  # a lock lost while paused: stop before the query commits again
                book.poll(query)
            except WriterLockLost as exc:
                lost = exc
                break
            exc = query.exception()
            if exc is None and query.isActive:
                restarts = 0
            elif lost_lock(exc):
                lost = WriterLockLost(next(line.strip() for line in str(exc).splitlines()
                                           if WriterLockLost.__name__ in line)[:500])
                break
            elif (is_known_restart_bug(exc) or died_silently(query)) and restarts < MAX_RESTARTS:
                restarts += 1
                if metrics is not None:
                    metrics.query_failed(INGEST_QUERY)
                print("ingest: restarting after Spark's known post-recovery error "
                      "(SPARK-55271, or its query thread dying in the Kafka source's progress "
                      "metrics; the batch had committed)", flush=True)
                try:
                    book.poll(query, record=True)
                    fence.check()
                except WriterLockLost as exc:
                    lost = exc
                    break
                query = start()
                book.recorded = -1
            else:
                failed = query
                if metrics is not None:
                    metrics.query_failed(INGEST_QUERY)
                break
        if lost is not None:
            say_lock(f"LOST ({lost}); stopping the query, committing nothing more", settings)
        query.stop()
        if lost is None:
            try:
                book.poll(query, record=True)
            except WriterLockLost as exc:
                lost = exc
                say_lock(f"LOST ({exc}); the last progress rows are not recorded", settings)
        if lost is not None and metrics is not None:
            metrics.lock_held(False)
            stop.wait(LOCK_LOST_LINGER_S)
    if lost is not None:
        print(f"error: the writer lock was lost: {lost}", file=sys.stderr, flush=True)
        return LOCK_LOST
    if failed is not None:
        why = failed.exception() or "its thread ended with no exception (a JVM error, above)"
        print(f"error: query {failed.name} failed: {why}", file=sys.stderr)
        return 1
    print("stopped cleanly", flush=True)
    return 0


class _Bookkeeping:
    """The service's view of its query's progress: metrics at every poll, a line per new batch,
    and `stream_progress` rows at most every PROGRESS_EVERY_S (one Delta commit for all the
    batches since the last), so the bookkeeping costs no commit per micro-batch. Its commits
    are the runner's too: the writer lock's `fence` is checked before each (`WriterLockLost`)."""

    def __init__(self, spark, settings, metrics=None, fence: Fence | None = None):
        self.spark, self.settings, self.metrics = spark, settings, metrics
        self.fence = fence or Fence()
        self.recorded = -1  # newest batch id in stream_progress
        self.printed = -1
        self.last_record = time.monotonic()

    def poll(self, query, record: bool = False) -> None:
        reports = [as_dict(p) for p in query.recentProgress]
        if self.metrics is not None:
            self.metrics.observe_progress(INGEST_QUERY, reports)
        fresh = [r for r in map(BatchReport.of, reports)
                 if r.batch_id > self.printed and r.executed]
        if fresh:
            last = fresh[-1]
            self.printed = last.batch_id
            print(f"ingest: batch {last.batch_id} rows {last.input_rows} in {last.trigger_ms} ms",
                  flush=True)
        new = [p for p in reports if p["batchId"] > self.recorded]
        due = record or time.monotonic() - self.last_record >= PROGRESS_EVERY_S
        if not new or not due:
            return
        self.fence.check()
        record_progress(self.spark, self.settings, INGEST_QUERY, new, _topic_ends(self.settings))
        self.recorded = max(p["batchId"] for p in new)
        self.last_record = time.monotonic()


def _topic_ends(settings) -> list[PartitionOffsets] | None:
    """The topic's offsets for the progress rows (the lag), or None while no broker answers:
    the queries ride out a broker outage (the Kafka source retries), so the bookkeeping must not
    be what stops the service."""
    try:
        return topic_offsets(settings)
    except KafkaException as exc:
        print(f"warning: topic end offsets unavailable, progress recorded without lag: {exc}",
              file=sys.stderr, flush=True)
        return None


def main() -> int:
    try:  # PIPELINE=<spec.yaml>: that spec's pipeline (its topic, folder and event shape)
        _, settings = selected_pipeline()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return serve(settings, stop)
    except (CheckpointBusy, DataLost, TopicReplaced) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except WriterLockLost as exc:  # lost before the query ran (a restart's own commits)
        say_lock(f"LOST ({exc}); committing nothing more", settings)
        print(f"error: the writer lock was lost: {exc}", file=sys.stderr)
        return LOCK_LOST


if __name__ == "__main__":
    sys.exit(main())
