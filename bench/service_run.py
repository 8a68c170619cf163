"""`make bench-service` (part of `make bench`): the service (`make stream`) under a producer at a
fixed rate for BENCH_SERVICE_SECONDS (600), on a fresh lakehouse and topic.

Measured, written to bench/results/service-<rate>-<date>.json:
- sustained rate: records produced vs. records in bronze, and the Kafka lag over time (the
  ingest query's `kafka_lag` in stream_progress) minute 2 vs. the last minute;
- freshness: once a second the producer sends a probe event with a key of its own; the bench
  polls the Delta log of `streaming_aggregates` (delta-rs, every 0.2 s) and takes the commit
  time of the first version holding the probe's window, minus the time it was produced
  (p50/p95/p99/max; probes never seen are counted);
- driver RSS (the service's Python process and its JVM, from /proc): minute 2 vs. the last
  minute (the one-pass ingest keeps no Spark state store);
- with BENCH_SERVICE_REPLAY_EVENTS=N (the hot tail during a backfill): N events of today's date
  produced before the service starts (it ingests them first), then, BENCH_SERVICE_REPLAY_AFTER
  (20) seconds into the measurement, a replay of today's date through `dagster asset
  materialize` in a fresh process (as a schedule runs it; RUN_NICENESS applies), beside the
  service under load: the freshness of the probes sent while it ran, its duration, and after the
  load a `reconcile_dates` run of the date (its blocking proof must pass);
- with BENCH_SERVICE_BREAKDOWN=1 (the UI on, which slows the service): where a steady batch's
  time goes, the service's Spark jobs from minute 2 on, from its UI's REST API, grouped by
  ingest step, per batch.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc

from bench import spark_ui, write_result
from lakehouse.delta_log import open_table
from lakehouse.kafka_admin import ensure_topic
from lakehouse.settings import Settings
from lakehouse.table_reads import read

KEYS = 1000


def produce_at_rate(settings: Settings, rate: int, seconds: int, probes) -> None:
    """`rate` events/s in 10 slices a second, event_time = now; one probe a second, its send
    time put on `probes`."""
    from confluent_kafka import Producer

    producer = Producer({**settings.client_config, "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 2_000_000})
    per_slice, sent, start = rate // 10, 0, time.time()
    for tick in range(seconds * 10):
        now = time.time()
        stamp = datetime.fromtimestamp(now, tz=UTC).isoformat(timespec="milliseconds")
        for i in range(sent, sent + per_slice):
            producer.produce(settings.events_topic, key=f"k{i % KEYS}", value=(
                f'{{"event_id":"e-{i}","key":"k{i % KEYS}","event_time":"{stamp}",'
                f'"value":"{i % 997}.25"}}'))
        sent += per_slice
        if tick % 10 == 0:
            probe = f"probe-{tick // 10}"
            probes.put((probe, time.time()))
            producer.produce(settings.events_topic, key=probe, value=(
                f'{{"event_id":"{probe}","key":"{probe}","event_time":"{stamp}","value":"1"}}'))
        producer.poll(0)
        time.sleep(max(0.0, start + (tick + 1) / 10 - time.time()))
    producer.flush(60)
    probes.put(("done", sent + seconds, time.time() - start))


def preload(settings: Settings, events: int) -> None:
    """`events` events of today's date (event times spread over the hour before the last two
    minutes, within today), produced as fast as the producer goes."""
    from confluent_kafka import Producer

    now = time.time()
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    first = max(midnight, now - 3720)
    span = max(1.0, now - 120 - first)
    producer = Producer({**settings.client_config, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 2_000_000})
    for i in range(events):
        stamp = datetime.fromtimestamp(first + span * i / events, tz=UTC).isoformat(
            timespec="milliseconds")
        while True:
            try:
                producer.produce(settings.events_topic, key=f"k{i % KEYS}", value=(
                    f'{{"event_id":"pre-{i}","key":"k{i % KEYS}","event_time":"{stamp}",'
                    f'"value":"{i % 997}.25"}}'))
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def dagster_run(settings: Settings, env: dict[str, str], select: str, log: Path,
                ) -> subprocess.Popen:
    """`dagster asset materialize` of today's partition in a fresh process, as a schedule runs it."""
    from bench.run_path import DAGSTER, REPO

    home = Path(f"{settings.lakehouse_root}-dagster")
    home.mkdir(exist_ok=True)
    day = datetime.now(UTC).date().isoformat()
    return subprocess.Popen(
        [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions", "--select", select,
         "--partition", day], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**env, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)})


def rss_mb(pid: int) -> float:
    """RSS of `pid` and its children (the service's JVM, Python workers), MB."""
    def own(p: int) -> int:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return (own(pid) + sum(own(c) for c in children)) / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def during(sent: dict[str, float], seen: dict[str, float], span: list) -> dict:
    """Freshness of the probes sent within `span` (start, end)."""
    probes = [p for p, t in sent.items() if span[0] <= t <= span[1]]
    lags = [seen[p] - sent[p] for p in probes if p in seen]
    return {"probes": len(probes), "seen": len(lags), "p50": percentile(lags, 0.5),
            "p95": percentile(lags, 0.95), "max": percentile(lags, 1.0)}


def window_means(rows: list[dict], column: str, t0: float, minute: tuple[int, int]) -> float | None:
    vals = [r[column] for r in rows if r[column] is not None
            and minute[0] * 60 <= r["batch_timestamp"].timestamp() - t0 < minute[1] * 60]
    return round(statistics.mean(vals), 1) if vals else None


def main() -> int:
    from testkit.faults import output, start_service

    seconds = int(os.environ.get("BENCH_SERVICE_SECONDS", "600"))
    rate = int(os.environ.get("BENCH_SERVICE_RATE", "20000"))
    trigger = os.environ.get("BENCH_SERVICE_TRIGGER", "1 second")
    root = Path(f"/tmp/lakehouse-service-bench-{uuid.uuid4().hex[:6]}")
    ui_port = free_port()
    breakdown = os.environ.get("BENCH_SERVICE_BREAKDOWN", "0") == "1"
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "EVENTS_TOPIC": f"svc-{uuid.uuid4().hex[:8]}",
           "STREAM_TRIGGER_INTERVAL": trigger, "METRICS_PORT": str(free_port())}
    if breakdown:  # the UI's listeners cost the service time: off for the headline figures
        env.update({"SPARK_UI": "true", "SPARK_CONF_spark.ui.port": str(ui_port),
                    "SPARK_CONF_spark.ui.retainedJobs": "100000"})
    replay_events = int(os.environ.get("BENCH_SERVICE_REPLAY_EVENTS", "0"))
    replay_after = float(os.environ.get("BENCH_SERVICE_REPLAY_AFTER", "20"))
    settings = Settings.from_env(env)
    ensure_topic(settings)
    root.mkdir(parents=True)
    if replay_events:
        preload(settings, replay_events)
    svc = start_service(env, log_path=root / "service.log")
    while "streaming" not in output(svc, 100_000):
        if svc.poll() is not None:
            raise RuntimeError(f"the service died:\n{output(svc)}")
        time.sleep(0.5)
    while replay_events:  # the preloaded events ingested before the measurement starts
        bronze = open_table(settings, "bronze_events")
        if bronze is not None and bronze.to_pyarrow_dataset().count_rows() >= replay_events:
            break
        if svc.poll() is not None:
            raise RuntimeError(f"the service died:\n{output(svc)}")
        time.sleep(2)
    replay, replay_span, replay_rc = None, [None, None], None

    probes = multiprocessing.Queue()
    producer = multiprocessing.Process(target=produce_at_rate, args=(settings, rate, seconds, probes))
    t0 = time.time()
    producer.start()
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    rss: list[tuple[float, float]] = []
    done = None
    version = -1
    last_rss = 0.0
    drain_deadline = None
    while True:
        while not probes.empty():
            item = probes.get()
            if item[0] == "done":
                done, drain_deadline = item, time.time() + 120
            else:
                sent[item[0]] = item[1]
        now = time.time()
        if replay_events and replay is None and now - t0 >= replay_after:
            replay = dagster_run(settings, env, "replay_aggregates", root / "replay.log")
            replay_span[0] = now
        if replay is not None and replay_rc is None and replay.poll() is not None:
            replay_rc, replay_span[1] = replay.returncode, now
        if now - last_rss >= 5:
            rss.append((now - t0, rss_mb(svc.pid)))
            last_rss = now
        table = open_table(settings, "streaming_aggregates")
        if table is not None and table.version() != version:
            version = table.version()
            committed = table.history(1)[0]["timestamp"] / 1000
            keys = read(settings, "streaming_aggregates")["key"]
            for key in pc.filter(keys, pc.starts_with(keys, "probe-")).to_pylist():
                seen.setdefault(key, committed)
        if (drain_deadline and (set(sent) <= set(seen) or now > drain_deadline)
                and (replay is None or replay_rc is not None)):
            break
        if svc.poll() is not None:
            raise RuntimeError(f"the service died:\n{output(svc)}")
        time.sleep(0.2)
    producer.join(30)
    steady = [j for j in spark_ui.jobs(f"http://127.0.0.1:{ui_port}")
              if 120 <= spark_ui.submitted_at(j) - t0 < seconds] if breakdown else []
    proof_rc = None
    if replay is not None:  # the date's proof, the service still running
        proof = dagster_run(settings, env, "replay_aggregates,late_corrections,reconciled_aggregates",
                            root / "reconcile.log")
        proof_rc = proof.wait()
    svc.send_signal(signal.SIGTERM)
    svc.wait(120)

    progress = open_table(settings, "stream_progress").to_pyarrow_table().to_pylist()
    batches = [r for r in progress if r["query"] == "ingest"]
    last = (max(1, seconds // 60 - 1), seconds // 60)
    freshness = [seen[p] - sent[p] for p in sent if p in seen]
    produced = done[1] if done else None
    ingested = open_table(settings, "bronze_events").to_pyarrow_dataset().count_rows()
    rss_minute = {m: [v for t, v in rss if m[0] * 60 <= t < m[1] * 60] for m in ((1, 2), last)}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "seconds": seconds, "target_rate": rate, "trigger": trigger,
        "produced": produced,
        "produced_per_s": round(produced / done[2]) if done else None,
        "ingested_in_bronze": ingested,
        "ingested_per_s_while_producing": round(
            sum(r["input_rows"] or 0 for r in batches
                if r["batch_timestamp"].timestamp() - t0 < seconds) / seconds),
        "kafka_lag_minute_2": window_means(batches, "kafka_lag", t0, (1, 2)),
        "kafka_lag_last_minute": window_means(batches, "kafka_lag", t0, last),
        "freshness_s": {"probes": len(sent), "seen": len(freshness),
                        "p50": percentile(freshness, 0.5), "p95": percentile(freshness, 0.95),
                        "p99": percentile(freshness, 0.99), "max": percentile(freshness, 1.0)},
        **({"replay": {
            "events_preloaded": replay_events, "run_niceness": settings.run_niceness,
            "seconds": round(replay_span[1] - replay_span[0], 1), "succeeded": replay_rc == 0,
            "proof_after_passed": proof_rc == 0,
            "freshness_during_s": during(sent, seen, replay_span)}} if replay else {}),
        "batches": len(batches),
        "batch_duration_s": {
            q: percentile([r["trigger_ms"] / 1000 for r in batches if r["trigger_ms"] is not None], p)
            for q, p in (("p50", 0.5), ("p95", 0.95))},
        "batch_rows_p50": percentile([r["input_rows"] for r in batches], 0.5),
        **({"steady_batch_by_step": spark_ui.by_step(steady, per=max(1, sum(
            1 for r in batches if 120 <= r["batch_timestamp"].timestamp() - t0 < seconds)))}
           if breakdown else {}),
        "driver_rss_mb": {"minute_2": percentile(rss_minute[(1, 2)], 0.5),
                          "last_minute": percentile(rss_minute[last], 0.5)},
        # No Spark state store any more: the dedup looks up bronze above the watermark. What
        # grows with time is the table files: streaming_aggregates' final files (one per closing batch).
        "streaming_aggregates_files": {"end": len(open_table(settings, "streaming_aggregates")
                                                  .file_uris())},
    }
    print(result)
    write_result(f"service-{rate}" + (f"-replay-{replay_events}" if replay else ""), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
