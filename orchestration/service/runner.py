"""`make stream`: the fast path as a long-running service (processing-time trigger), for the
default pipeline and every spec of PIPELINES (or the one PIPELINE names) in one Spark
application: a `PipelineStream` per pipeline, each with its own query, checkpoint, writer lock
and metrics, stopped alone when it fails (`serve`).

Runs the same query, on the same checkpoint, as the Dagster catch-up assets; holds the
checkpoint lock while running, so a catch-up started meanwhile fails with a clear error instead
of corrupting the checkpoint. SIGTERM or SIGINT stops the query and exits 0; since every
write of a batch is idempotent, a stop (or a crash) mid-batch is repaired by the next start, and
a query that fails on an outage (the broker, the registry, storage) is restarted from its
checkpoint by the service itself, with backoff (`orchestration.service.retries`).
While it runs, Prometheus metrics are served on 127.0.0.1:$METRICS_PORT/metrics
(`orchestration.service.metrics`).

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

from lakehouse.config.settings import Settings, SettingsError, spark_interval
from lakehouse.kafka.admin import PartitionOffsets, ensure_topic, topic_offsets
from lakehouse.kafka.topic_checks import retention_shortfall
from lakehouse.kafka.topic_status import retention_ms
from lakehouse.specs.pipeline import service_pipelines
from lakehouse.tables.catalog import INGEST_QUERY
from lakehouse.tables.locks import (
    SERVICE_ROLE,
    CheckpointBusy,
    Fence,
    WriterLockLost,
    checkpoint_lock,
    set_role,
)
from lakehouse.tables.progress_reports import BatchReport, as_dict
from orchestration.service.metrics import exposing, serving
from orchestration.service.retries import Failure, Retries, classify, first_line
from spark_jobs.progress import record_progress
from spark_jobs.recent_ids import RecentIds
from spark_jobs.session import get_spark
from spark_jobs.stream import DataLost, TopicReplaced, Trigger, start_ingest
from spark_jobs.writer import Writer

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
    StackOverflowError in the Kafka source's progress metrics after a restart, Spark 4.1.1;
    not seen with 4.2.0) ends the thread without failing the query. Its batch had committed;
    a restart resumes from the checkpoint."""
    return query.exception() is None and not query.isActive


class PipelineStream:
    """One pipeline's ingest query in the service: its writer lock (taken at `start`, released
    at `close`), its dedup index, bookkeeping and metrics, its restarts. Its jobs run in a
    scheduler pool of its own (named after the pipeline), so the service's pipelines share the
    cores fairly. A failure stops this pipeline only (`check` says so; the caller `close`s it)."""

    def __init__(self, spark, settings: Settings):
        # A session of its own on the service's SparkContext: its query is `ingest` like every
        # pipeline's (a name is unique per session), and its batches' SQL settings its own.
        self.spark, self.settings, self.name = spark.newSession(), settings, settings.pipeline
        self.interval = spark_interval(settings.stream_trigger_interval)
        self.recent = RecentIds()  # the dedup's in-memory index, kept across restarts of the query
        self.held = ExitStack()
        self.fence: Fence | None = None
        self.metrics = None
        self.query = None
        self.book: _Bookkeeping | None = None
        self.retries = Retries()
        self.retries_seen = 0  # restarts scheduled in the current series, for the log
        self.batch_at_restart = -1
        self.lost: WriterLockLost | None = None
        self.failed = None  # the error it stopped on, once it did
        self.failure: Failure | None = None

    def start(self) -> None:
        """Take the lock, start the metrics and the query; on any error release what was taken."""
        settings = self.settings
        try:
            ensure_topic(settings)
            if warning := retention_shortfall(settings, retention_ms(settings)):
                print(f"warning: {self.name}: {warning}", file=sys.stderr, flush=True)
            self.fence = self.held.enter_context(checkpoint_lock(settings, INGEST_QUERY))
            say_lock("took", settings)
            # Runs before the lock is released (after the query stopped and the last bookkeeping).
            self.held.callback(lambda: self.lost is None and say_lock("releasing", settings))
            # Before the query starts: the metrics count every record it commits.
            self.metrics = self.held.enter_context(serving(settings, self.spark, serve=False))
            if self.metrics is not None:
                self.metrics.lock_held(True)
            self.query = self._start_query()
        except BaseException:
            self.held.close()
            raise
        self.book = _Bookkeeping(self.spark, settings, self.metrics, self.fence)
        print(f"streaming pipeline {self.name!r}: {settings.events_topic} -> {settings.root} "
              f"every {self.interval}, from {_position(self.metrics)}", flush=True)

    def _start_query(self):
        context = self.spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", self.name)  # the query thread inherits it
        try:
            return start_ingest(self.spark, self.settings,
                                Trigger(available_now=False, interval=self.interval),
                                self.recent, self.fence)
        finally:
            context.setLocalProperty("spark.scheduler.pool", None)

    def check(self) -> bool:
        """One poll: bookkeeping, the query's health, a failed query's restart when its backoff
        is over (`orchestration.service.retries`). False once the pipeline must stop: its lock
        lost, a failure a restart cannot help, or one that restarts did not mend."""
        try:
            self.fence.check()  # a lock lost while paused: stop before the query commits again
        except WriterLockLost as exc:
            self.lost = exc
            return False
        if not self.retries.waiting and not self._poll():
            return False
        if self.retries.waiting:
            return self._restart()
        exc = self.query.exception()
        if exc is None and self.query.isActive:
            if self.retries.ran(progressed=self.book.printed > self.batch_at_restart):
                print(f"{self.name}: ingest: running again after {self.retries_seen} "
                      "restart(s)", flush=True)
                self.retries_seen = 0
            self._report()
            return True
        if lost_lock(exc):
            self.lost = WriterLockLost(next(line.strip() for line in str(exc).splitlines()
                                            if WriterLockLost.__name__ in line)[:500])
            return False
        failure = classify(exc, died_silently(self.query))
        if self.metrics is not None and failure.reason != "schemas_changed":  # not a fault
            self.metrics.query_failed(INGEST_QUERY)
        if not self._poll(record=True):  # the batches the query completed before it failed
            return False
        return self._failed(failure, exc)

    def _poll(self, record: bool = False) -> bool:
        """The bookkeeping's poll; False when it found the lock lost. A commit of it that met
        the outage the query is riding out is made at a later poll."""
        try:
            self.book.poll(self.query, record=record)
        except WriterLockLost as exc:
            self.lost = exc
            return False
        except Exception as exc:
            if classify(exc).kind != "transient":
                raise
            print(f"warning: {self.name}: progress not recorded this poll: {first_line(exc)}",
                  file=sys.stderr, flush=True)
        return True

    def _failed(self, failure: Failure, exc) -> bool:
        """Schedule the restart after `failure`, or stop (False) when it cannot help."""
        delay = self.retries.failed(failure)
        if self.metrics is not None:
            self.metrics.restart_scheduled(failure.reason, delay is not None)
        if delay is None:
            self.failed = exc if exc is not None else failure.message
            self.failure = failure
            return False
        self.retries_seen += 1
        if failure.reason == "schemas_changed":  # not a fault: new ids registered
            print(f"{self.name}: ingest: restarting with the registry's new schemas (the batch "
                  "had written nothing)", flush=True)
        else:
            print(f"{self.name}: ingest: {failure.kind} failure ({failure.reason}): "
                  f"{failure.message}; restarting from the checkpoint in {delay:.0f} s "
                  f"(failure {self.retries.attempts}, retrying for "
                  f"{self.retries.retrying_s():.0f} s)", flush=True)
        self._report()
        return self._restart() if delay == 0 else True

    def _restart(self) -> bool:
        if not self.retries.due():
            self._report()
            return True
        try:
            self.fence.check()
            query = self._start_query()
        except WriterLockLost as lost:
            self.lost = lost
            return False
        except Exception as exc:  # noqa: BLE001 - classified: retried, or the pipeline stops
            return self._failed(classify(exc), exc)
        self.query = query
        self.book.recorded = -1
        self.batch_at_restart = self.book.printed
        self.retries.restarted()
        return True

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.retrying(self.retries.retrying_s())

    def close(self) -> int:
        """Stop the query, record its last progress (unless the lock is lost), release the lock.
        Returns this pipeline's exit status (0, 1 failed, LOCK_LOST)."""
        if self.metrics is not None:
            self.metrics.query_active = False
        if self.lost is not None:
            say_lock(f"LOST ({self.lost}); stopping the query, committing nothing more",
                     self.settings)
        with self.held:
            self.query.stop()
            if self.lost is None:
                try:
                    self.book.poll(self.query, record=True)
                except WriterLockLost as exc:
                    self.lost = exc
                    say_lock(f"LOST ({exc}); the last progress rows are not recorded",
                             self.settings)
            if self.lost is not None and self.metrics is not None:
                self.metrics.lock_held(False)
        if self.lost is not None:
            print(f"error: {self.name}: the writer lock was lost: {self.lost}", file=sys.stderr,
                  flush=True)
            return LOCK_LOST
        if self.failed is not None:
            print(f"error: {self.name}: query {INGEST_QUERY} failed: {self.failed}",
                  file=sys.stderr, flush=True)
            if self.failure is not None:
                print(f"error: {self.name}: {_WHAT_TO_DO.get(self.failure.kind, '')}",
                      file=sys.stderr, flush=True)
            return 1
        return 0


def _position(metrics) -> str:
    """Where a pipeline's query resumes, for the start line: its checkpoint's offsets."""
    processed = metrics.position() if metrics is not None else {}
    if not processed:
        return "the start of its topic or bronze's stamped position"
    return "offsets " + ", ".join(f"{p}:{o}" for p, o in sorted(processed.items()))


# The error line's second half, by the kind of failure the pipeline stopped on.
_WHAT_TO_DO = {
    "fatal": "a restart cannot mend this; docs/operations.md says what to do (data lost to "
             "retention, a deleted or re-created topic); its checkpoint is untouched",
    "unknown": "restarts did not mend it; fix the cause and start the service again: it "
               "resumes from its checkpoint, nothing lost or counted twice",
    "restart": "Spark's restarts did not mend it; start the service again: it resumes from "
               "its checkpoint",
}

# Exit statuses, worst first: a pipeline that lost its lock, failed, could not start.
_WORST = (LOCK_LOST, 1, 2)


def serve(pipelines: list[Settings], stop: threading.Event) -> int:
    """Run every pipeline's ingest query in one Spark application until `stop` (SIGTERM) or
    until none is left running. A pipeline that cannot start or fails later is stopped alone
    (said on stderr, `lakehouse_stream_query_active` 0); the others go on. Exit status: 0 when
    every pipeline stopped cleanly, else the worst of LOCK_LOST, 1 (a query failed) and 2 (a
    pipeline could not start)."""
    spark = get_spark(pipelines[0], extra={"spark.scheduler.mode": "FAIR"})
    statuses: list[int] = []
    running: list[PipelineStream] = []
    for settings in pipelines:
        stream = PipelineStream(spark, settings)
        try:
            stream.start()
        except WriterLockLost as exc:  # lost before the query ran (a restart's own commits)
            say_lock(f"LOST ({exc}); committing nothing more", settings)
            statuses.append(LOCK_LOST)
            continue
        except (CheckpointBusy, DataLost, TopicReplaced, KafkaException) as exc:
            print(f"error: pipeline {settings.pipeline!r} not started: {exc}", file=sys.stderr,
                  flush=True)
            statuses.append(2)
            continue
        except Exception as exc:  # noqa: BLE001 - isolation: the others start all the same
            print(f"error: pipeline {settings.pipeline!r} not started: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr, flush=True)
            statuses.append(2)
            continue
        running.append(stream)
    if not running:
        return _worst(statuses)
    streams = list(running)
    poll = min(5.0, *(s.settings.stream_trigger_interval.total_seconds() for s in running))
    with exposing([s.metrics for s in streams], pipelines[0].metrics_port):
        print(f"streaming {len(running)} pipeline(s) in one Spark application: "
              f"{', '.join(s.name for s in running)}; SIGTERM to stop", flush=True)
        try:
            while running and not stop.wait(poll):
                for stream in [s for s in running if not _healthy(s)]:
                    running.remove(stream)
                    statuses.append(stream.close())
                    if running:
                        print(f"pipeline {stream.name!r} stopped; still streaming: "
                              f"{', '.join(s.name for s in running)}", flush=True)
        finally:
            statuses.extend(stream.close() for stream in running)
        if LOCK_LOST in statuses and any(s.metrics is not None for s in streams):
            # Prometheus scrapes the loss before the endpoint goes.
            stop.wait(LOCK_LOST_LINGER_S)
    status = _worst(statuses)
    if status == 0:
        print("stopped cleanly", flush=True)
    return status


def _healthy(stream: PipelineStream) -> bool:
    """`stream.check()`, an unexpected error in its bookkeeping counted as its failure: one
    pipeline's trouble never stops the others."""
    try:
        return stream.check()
    except Exception as exc:  # noqa: BLE001 - isolation: this pipeline stops, the rest go on
        print(f"error: {stream.name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        stream.failed = f"{type(exc).__name__}: {exc}"
        return False


def _worst(statuses: list[int]) -> int:
    return next((s for s in _WORST if s in statuses), 0)


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
        record_progress(Writer(self.spark, self.settings, self.fence), INGEST_QUERY, new,
                        _topic_ends(self.settings))
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
    try:  # PIPELINE=<spec.yaml>: that pipeline; else the default one and every PIPELINES spec
        pipelines = service_pipelines()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    set_role(SERVICE_ROLE)  # the catch-up schedules skip, naming it, while it holds a stream
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return serve(pipelines, stop)


if __name__ == "__main__":
    sys.exit(main())
