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
  materialize` in a fresh process (as a schedule runs it), beside the
  service under load: the freshness of the probes sent while it ran and of those sent before
  it started, its duration, and after the
  load a `reconcile_dates` run of the date (its blocking proof must pass);
- with BENCH_SERVICE_PIPELINES=spec.yaml=rate,... (one service for many pipelines): the default
  pipeline at BENCH_SERVICE_RATE and each spec's (a copy with a topic of its own) at its rate,
  in one service (`make stream PIPELINES=...`), each with its own producer and probes (the
  probe in its first dimension): the same figures per pipeline (`other_pipelines`);
- with BENCH_SERVICE_BREAKDOWN=1 (the UI on, which slows the service): where a steady batch's
  time goes, the service's Spark jobs from minute 2 on, from its UI's REST API, grouped by
  ingest step, per batch.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc

from bench import spark_ui, write_result
from lakehouse.config.settings import Settings
from lakehouse.events.shape import EventShape
from lakehouse.kafka.admin import ensure_topic
from lakehouse.tables.delta_log import open_table
from lakehouse.tables.reads import read
from testkit.ports import free_port

KEYS = 1000


def event_maker(shape: EventShape) -> Callable[[int, float, str | None], str]:
    """JSON events of a pipeline's shape (the default's or a spec's): the i-th event at time
    `now`, its first dimension `probe` for a probe (else one of KEYS values)."""
    fmt = shape.event_time.formats[0]
    probe_dim = shape.dimensions[0].source

    def value(name: str, kind: str, i: int, probe: str | None, now: float) -> str:
        if name == shape.event_id:
            return f'"{probe or f"e-{i}"}"' if kind == "string" else str(
                10 ** 12 + int(probe.split("-")[1]) if probe else i)
        if name == shape.event_time.field:
            if fmt == "epoch_millis":
                return str(int(now * 1000))
            if fmt == "epoch_seconds":
                return str(int(now))
        if name == shape.event_time.field or kind == "timestamp":
            return '"' + datetime.fromtimestamp(now, tz=UTC).isoformat(timespec="milliseconds") + '"'
        if name == probe_dim:
            return f'"{probe or f"k{i % KEYS}"}"'
        if kind.startswith("decimal"):
            return "1" if probe else f'"{i % 997}.25"'
        if kind in ("int", "long"):
            return str(i % KEYS)
        return f'"{name}-{i % 7}"'

    def make(i: int, now: float, probe: str | None = None) -> str:
        return "{" + ",".join(f'"{n}":{value(n, k, i, probe, now)}'
                              for n, k in shape.fields.items()) + "}"

    return make


def produce_at_rate(settings: Settings, rate: int, seconds: int, probes) -> None:
    """`rate` events/s in 10 slices a second, event time = now; one probe a second, its send
    time put on `probes`."""
    from confluent_kafka import Producer

    make = event_maker(settings.shape)
    producer = Producer({**settings.client_config, "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 2_000_000})
    per_slice, sent, start = rate // 10, 0, time.time()
    for tick in range(seconds * 10):
        now = time.time()
        for i in range(sent, sent + per_slice):
            producer.produce(settings.events_topic, key=f"k{i % KEYS}", value=make(i, now))
        sent += per_slice
        if tick % 10 == 0:
            probe = f"probe-{tick // 10}"
            probes.put((probe, time.time()))
            producer.produce(settings.events_topic, key=probe, value=make(0, now, probe))
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


class Feed:
    """One pipeline of a system under test: its producer at `rate`, its probes sent and seen.
    The system is the service (its `streaming_aggregates`) or, with `table`, a peer whose
    windows land in the Delta table at that path (bench/service_peers.py); the probe lookup is
    the same for both."""

    def __init__(self, settings: Settings, rate: int, seconds: int, table: str | None = None):
        self.settings, self.rate, self.name = settings, rate, settings.pipeline
        self.table = table
        self.probes = multiprocessing.Queue()
        self.producer = multiprocessing.Process(target=produce_at_rate,
                                                args=(settings, rate, seconds, self.probes))
        self.probe_column = settings.shape.dimension_names[0]
        self.sent: dict[str, float] = {}
        self.seen: dict[str, float] = {}
        self.done = None
        self.version = -1

    def _open(self):
        if self.table is None:
            return open_table(self.settings, "streaming_aggregates")
        from deltalake import DeltaTable

        return DeltaTable(self.table) if DeltaTable.is_deltatable(self.table) else None

    def _keys(self, table):
        if self.table is None:
            return read(self.settings, "streaming_aggregates")[self.probe_column]
        return table.to_pyarrow_table(columns=[self.probe_column])[self.probe_column]

    def take_probes(self) -> None:
        while not self.probes.empty():
            item = self.probes.get()
            if item[0] == "done":
                self.done = item
            else:
                self.sent[item[0]] = item[1]

    def look(self) -> None:
        """The probes in the newest version of `streaming_aggregates`, at its commit time."""
        table = self._open()
        if table is None or table.version() == self.version:
            return
        self.version = table.version()
        committed = table.history(1)[0]["timestamp"] / 1000
        keys = self._keys(table)
        for key in pc.filter(keys, pc.starts_with(keys, "probe-")).to_pylist():
            self.seen.setdefault(key, committed)

    def drained(self, since: float = 0.0) -> bool:
        return self.done is not None and all(p in self.seen for p, t in self.sent.items()
                                             if t >= since)

    def freshness(self, since: float = 0.0) -> dict:
        """Freshness of the probes sent from `since` on: every one counted, the unseen ones
        as `missing`."""
        probes = [p for p, t in self.sent.items() if t >= since]
        lags = [self.seen[p] - self.sent[p] for p in probes if p in self.seen]
        return {"probes": len(probes), "seen": len(lags), "missing": len(probes) - len(lags),
                "p50": percentile(lags, 0.5), "p95": percentile(lags, 0.95),
                "p99": percentile(lags, 0.99), "max": percentile(lags, 1.0)}

    def stats(self, t0: float, seconds: int) -> dict:
        progress = open_table(self.settings, "stream_progress").to_pyarrow_table().to_pylist()
        batches = [r for r in progress if r["query"] == "ingest"]
        last = (max(1, seconds // 60 - 1), seconds // 60)
        produced = self.done[1] if self.done else None
        return {
            "target_rate": self.rate, "produced": produced,
            "produced_per_s": round(produced / self.done[2]) if self.done else None,
            "ingested_in_bronze": open_table(self.settings, "bronze_events")
            .to_pyarrow_dataset().count_rows(),
            "ingested_per_s_while_producing": round(
                sum(r["input_rows"] or 0 for r in batches
                    if r["batch_timestamp"].timestamp() - t0 < seconds) / seconds),
            "kafka_lag_minute_2": window_means(batches, "kafka_lag", t0, (1, 2)),
            "kafka_lag_last_minute": window_means(batches, "kafka_lag", t0, last),
            "freshness_s": self.freshness(),
            "batches": len(batches),
            "batch_duration_s": {
                q: percentile([r["trigger_ms"] / 1000 for r in batches
                               if r["trigger_ms"] is not None], p)
                for q, p in (("p50", 0.5), ("p95", 0.95))},
            "batch_rows_p50": percentile([r["input_rows"] for r in batches], 0.5),
            "_batches_steady": sum(1 for r in batches
                                   if 120 <= r["batch_timestamp"].timestamp() - t0 < seconds),
        }


def spec_feeds(root: Path, text: str) -> list[tuple[Path, int]]:
    """BENCH_SERVICE_PIPELINES=spec.yaml=rate,...: each spec copied with a topic of its own."""
    import yaml

    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        path, rate = item.rsplit("=", 1)
        spec = yaml.safe_load(Path(path).read_text())
        spec["topic"] = f"{spec['name']}-{uuid.uuid4().hex[:8]}"
        copy = root / f"{spec['name']}.yaml"
        copy.write_text(yaml.safe_dump(spec))
        out.append((copy, int(rate)))
    return out


def main() -> int:
    from lakehouse.specs.pipeline import load_spec
    from testkit.faults import output, start_service

    seconds = int(os.environ.get("BENCH_SERVICE_SECONDS", "600"))
    rate = int(os.environ.get("BENCH_SERVICE_RATE", "20000"))
    trigger = os.environ.get("BENCH_SERVICE_TRIGGER", "1 second")
    root = Path(f"/tmp/lakehouse-service-bench-{uuid.uuid4().hex[:6]}")
    root.mkdir(parents=True)
    ui_port = free_port()
    breakdown = os.environ.get("BENCH_SERVICE_BREAKDOWN", "0") == "1"
    specs = spec_feeds(root, os.environ.get("BENCH_SERVICE_PIPELINES", ""))
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root / "lake"),
           "EVENTS_TOPIC": f"svc-{uuid.uuid4().hex[:8]}", "STREAM_TRIGGER_INTERVAL": trigger,
           "METRICS_PORT": str(free_port()), "PIPELINES": ",".join(str(p) for p, _ in specs)}
    env.pop("PIPELINE", None)
    if breakdown:  # the UI's listeners cost the service time: off for the headline figures
        env.update({"SPARK_UI": "true", "SPARK_CONF_spark.ui.port": str(ui_port),
                    "SPARK_CONF_spark.ui.retainedJobs": "100000"})
    replay_events = int(os.environ.get("BENCH_SERVICE_REPLAY_EVENTS", "0"))
    replay_after = float(os.environ.get("BENCH_SERVICE_REPLAY_AFTER", "20"))
    settings = Settings.from_env(env)
    feeds = [Feed(settings, rate, seconds), *(
        Feed(load_spec(path).settings(settings, env), r, seconds) for path, r in specs)]
    for feed in feeds:
        ensure_topic(feed.settings)
    if replay_events:
        preload(settings, replay_events)
    svc = start_service(env, log_path=root / "service.log", short_run=False)
    while "SIGTERM to stop" not in output(svc, 100_000):
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

    t0 = time.time()
    for feed in feeds:
        feed.producer.start()
    rss: list[tuple[float, float]] = []
    last_rss = 0.0
    drain_deadline = None
    while True:
        for feed in feeds:
            feed.take_probes()
        now = time.time()
        if drain_deadline is None and all(f.done for f in feeds):
            drain_deadline = now + 120
        if replay_events and replay is None and now - t0 >= replay_after:
            replay = dagster_run(settings, env, "replay_aggregates", root / "replay.log")
            replay_span[0] = now
        if replay is not None and replay_rc is None and replay.poll() is not None:
            replay_rc, replay_span[1] = replay.returncode, now
        if now - last_rss >= 5:
            rss.append((now - t0, rss_mb(svc.pid)))
            last_rss = now
        for feed in feeds:
            feed.look()
        if (drain_deadline and (all(f.drained() for f in feeds) or now > drain_deadline)
                and (replay is None or replay_rc is not None)):
            break
        if svc.poll() is not None:
            raise RuntimeError(f"the service died:\n{output(svc)}")
        time.sleep(0.2)
    for feed in feeds:
        feed.producer.join(30)
    steady = [j for j in spark_ui.jobs(f"http://127.0.0.1:{ui_port}")
              if 120 <= spark_ui.submitted_at(j) - t0 < seconds] if breakdown else []
    proof_rc = None
    if replay is not None:  # the date's proof, the service still running
        proof = dagster_run(settings, env, "replay_aggregates,late_corrections,reconciled_aggregates",
                            root / "reconcile.log")
        proof_rc = proof.wait()
    svc.send_signal(signal.SIGTERM)
    svc.wait(120)

    last = (max(1, seconds // 60 - 1), seconds // 60)
    rss_minute = {m: [v for t, v in rss if m[0] * 60 <= t < m[1] * 60] for m in ((1, 2), last)}
    stats = {f.name: f.stats(t0, seconds) for f in feeds}
    default = stats.pop("default")
    steady_batches = default.pop("_batches_steady")
    for s in stats.values():
        s.pop("_batches_steady")
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "seconds": seconds, "trigger": trigger,
        **default,
        **({"other_pipelines": stats} if stats else {}),
        **({"replay": {
            "events_preloaded": replay_events,
            "seconds": round(replay_span[1] - replay_span[0], 1), "succeeded": replay_rc == 0,
            "proof_after_passed": proof_rc == 0,
            "freshness_during_s": during(feeds[0].sent, feeds[0].seen, replay_span),
            # The same run's probes sent before the replay started (the target compares
            # the two p95s): BENCH_SERVICE_REPLAY_AFTER seconds of them.
            "freshness_before_s": during(feeds[0].sent, feeds[0].seen, [t0, replay_span[0]])}}
           if replay else {}),
        **({"steady_batch_by_step": spark_ui.by_step(steady, per=max(1, steady_batches))}
           if breakdown else {}),
        "driver_rss_mb": {"minute_2": percentile(rss_minute[(1, 2)], 0.5),
                          "last_minute": percentile(rss_minute[last], 0.5)},
        # No Spark state store any more: the dedup looks up bronze above the watermark. What
        # grows with time is the table files: streaming_aggregates' final files (one per closing batch).
        "streaming_aggregates_files": {"end": len(open_table(settings, "streaming_aggregates")
                                                  .file_uris())},
    }
    print(result)
    kind = (f"service-{rate}" + "".join(f"-{n}-{s['target_rate']}" for n, s in stats.items())
            + (f"-replay-{replay_events}" if replay else ""))
    write_result(kind, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
