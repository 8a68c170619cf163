"""`make stream`: the fast path as a long-running service (processing-time trigger).

Runs the same two queries, on the same checkpoints, as the Dagster catch-up assets; holds the
checkpoint locks while running, so a catch-up started meanwhile fails with a clear error instead
of corrupting the checkpoint. SIGTERM or SIGINT stops both queries and exits 0; since every
write of a batch is idempotent, a stop (or a crash) mid-batch is repaired by the next start.
While it runs, Prometheus metrics are served on 127.0.0.1:$METRICS_PORT/metrics
(`spark_jobs.metrics`).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from contextlib import ExitStack

from confluent_kafka import KafkaException

from lakehouse.kafka_admin import ensure_topic, topic_offsets
from lakehouse.settings import Settings, spark_interval
from spark_jobs.lock import CheckpointBusy, checkpoint_lock
from spark_jobs.metrics import serving
from spark_jobs.progress import record_progress
from spark_jobs.session import get_spark
from spark_jobs.stream import (
    AGG_QUERY,
    BRONZE_QUERY,
    MAX_RESTARTS,
    STARTERS,
    Trigger,
    is_known_restart_bug,
)


def serve(settings: Settings, stop: threading.Event) -> int:
    interval = spark_interval(settings.stream_trigger_interval)
    ensure_topic(settings)
    spark = get_spark(settings)
    with ExitStack() as locks:
        for name in (BRONZE_QUERY, AGG_QUERY):
            locks.enter_context(checkpoint_lock(settings.root, name, spark))
        # Before the queries start: the metrics count every record they commit.
        metrics = locks.enter_context(serving(settings, spark))
        queries = {
            name: STARTERS[name](spark, settings, Trigger(available_now=False, interval=interval))
            for name in (BRONZE_QUERY, AGG_QUERY)
        }
        print(f"streaming {settings.events_topic} -> {settings.root} every {interval}; "
              "SIGTERM to stop", flush=True)
        recorded: dict[str, int] = {name: -1 for name in queries}
        restarts = {name: 0 for name in queries}
        failed = None
        while not stop.wait(settings.stream_trigger_interval.total_seconds()):
            _record_new(spark, settings, queries, recorded, metrics)
            for name, q in list(queries.items()):
                exc = q.exception()
                if exc is None:
                    restarts[name] = 0
                elif is_known_restart_bug(exc) and restarts[name] < MAX_RESTARTS:
                    restarts[name] += 1
                    print(f"{name}: restarting after Spark's known post-recovery error "
                          "(SPARK-55271; the batch had committed)", flush=True)
                    queries[name] = STARTERS[name](
                        spark, settings, Trigger(available_now=False, interval=interval))
                    recorded[name] = -1
                else:
                    failed = q
            if failed is not None:
                break
        for q in queries.values():
            q.stop()
        _record_new(spark, settings, queries, recorded, metrics)
    if failed is not None:
        print(f"error: query {failed.name} failed: {failed.exception()}", file=sys.stderr)
        return 1
    print("stopped cleanly", flush=True)
    return 0


def _record_new(spark, settings, queries, recorded, metrics=None) -> None:
    ends = None
    for name, q in queries.items():
        reports = [json.loads(p.json) for p in q.recentProgress]
        if metrics is not None:
            metrics.observe_progress(name, reports)
        new = [p for p in reports if p["batchId"] > recorded[name]]
        if not new:
            continue
        if name == BRONZE_QUERY:
            ends = _topic_ends(settings)
        record_progress(spark, settings, name, new, ends if name == BRONZE_QUERY else None)
        recorded[name] = max(p["batchId"] for p in new)
        last = new[-1]
        print(f"{name}: batch {last['batchId']} rows {last.get('numInputRows')} "
              f"watermark {(last.get('eventTime') or {}).get('watermark')}", flush=True)


def _topic_ends(settings) -> dict[int, int] | None:
    """The topic's end offsets for the progress rows (the lag), or None while no broker answers:
    the queries ride out a broker outage (the Kafka source retries), so the bookkeeping must not
    be what stops the service."""
    try:
        return {p.partition: p.latest for p in topic_offsets(settings)}
    except KafkaException as exc:
        print(f"warning: topic end offsets unavailable, progress recorded without lag: {exc}",
              file=sys.stderr, flush=True)
        return None


def main() -> int:
    settings = Settings.from_env()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return serve(settings, stop)
    except CheckpointBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
