"""`make bench-service`: the service (`make stream`) side by side with the two live window
queries a user would write by hand (`handwritten.live_job`), on the same producer settings,
freshness measured the same way from outside (bench/service_run.py's `Feed`: a probe event a
second, in a key and window of its own, looked up in the system's window table through
delta-rs; freshness = commit time of the first version holding it - its send time).

The systems under test (`SYSTEMS`), each a Spark application in a process of its own (its own
JVM), on a fresh topic and lakehouse root per run:
- `service`: `python -m orchestration.service.runner`, 1 s trigger (BENCH_SERVICE_TRIGGER);
- `naive`: Kafka -> `from_json` -> 30 s watermark -> 1-minute windows by key -> Delta sink in
  complete mode, 1 s trigger; Spark's defaults (`handwritten.live_conf`);
- `tuned`: the same with RocksDB state and changelog checkpointing, 2 shuffle partitions,
  adaptive execution off (`handwritten.LIVE_TUNED_CONF`);
- `medallion`: the tuned application landing every typed record in bronze as well and counting
  the first copy of each `event_id` (`handwritten.medallion_job`): the same guarantees as the
  service but the quarantine, the late lane and the proof.

Freshness: for each rate of BENCH_SERVICE_RATES (default "20000,5000"), BENCH_SERVICE_ROUNDS
(3) rounds of the systems, interleaved; each run a warm-up of BENCH_SERVICE_WARMUP
(90) s at the rate, then BENCH_SERVICE_SECONDS (180) s whose probes are counted (every one:
`missing` = never seen within BENCH_SERVICE_DRAIN (120) s after the producer stopped).
Reported: each run, the medians of the rounds per system and rate, and the ratio service p95 /
the better peer's p95 (<= 1: the service is at least as fresh).

Knee (BENCH_KNEE=1 after the freshness runs, BENCH_KNEE=only alone): for each rate of
BENCH_KNEE_RATES (default "5000,10000,15000,20000,30000,40000"), each system still flat runs
BENCH_KNEE_SECONDS (180) at the rate (after BENCH_KNEE_WARMUP, default 0, s at the rate; the
first third of the run is left out of the trend anyway), its consumer lag sampled every
BENCH_KNEE_EVERY (5) s: the topic's end offsets minus the system's processed position (the
service: the end offsets stamped on bronze's newest stream commit, as `topic_status` reads them;
a peer: the end offsets of its newest committed batch in its checkpoint's offsets folder).
"Flat": the lag's least-squares slope over the last two thirds of the run is below
BENCH_KNEE_FLAT (0.01) x the rate per second. A system's knee: the highest rate of the sweep
below its first rate that is not flat (the sweep of that system stops there).

BENCH_SERVICE_SYSTEMS (default "service,naive,tuned,medallion") picks the systems. BENCH_SERVICE_ALONE=1,
or any of service_run's own options (BENCH_SERVICE_PIPELINES, _REPLAY_EVENTS, _BREAKDOWN), runs
bench/service_run.py instead: the service alone, BENCH_SERVICE_RATE, no warm-up.
Results: bench/results/<kind>-<date>.json, kind "service-peers" ("service-knee" for
BENCH_KNEE=only; BENCH_SERVICE_KIND to name it otherwise, e.g. a smoke run's).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import handwritten, write_result  # noqa: E402
from bench.service_run import Feed  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from lakehouse.kafka.admin import consumer_lag, ensure_topic, topic_offsets  # noqa: E402
from lakehouse.kafka.topic_status import processed_offsets  # noqa: E402
from testkit.ports import free_port  # noqa: E402

SYSTEMS = ("service", "naive", "tuned", "medallion")
# Any of these set: the service alone (bench/service_run.py and its options).
ALONE = ("BENCH_SERVICE_ALONE", "BENCH_SERVICE_PIPELINES", "BENCH_SERVICE_REPLAY_EVENTS",
         "BENCH_SERVICE_BREAKDOWN")
READY = {"service": "SIGTERM to stop", "naive": "peer query started",
         "tuned": "peer query started", "medallion": "peer query started"}


def checkpoint_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """End offsets of a streaming query's newest committed batch, from its checkpoint: the
    highest batch in `commits/`, its planned offsets in `offsets/<batch>` (a header line, the
    batch's metadata, then one JSON line per source)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")
               if p.name.isdigit()]
    if not commits:
        return {}
    try:
        lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    except OSError:
        return {}
    for line in lines[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict) and topic in source:
            return {int(p): int(o) for p, o in source[topic].items()}
    return {}


class System:
    """One system under test on a topic and lakehouse root of its own: started, probed through
    its `feed`, its lag read, stopped."""

    def __init__(self, name: str, rate: int, produce_seconds: int):
        self.name = name
        self.root = Path(f"/tmp/lakehouse-service-peers-{name}-{uuid.uuid4().hex[:6]}")
        self.root.mkdir(parents=True)
        self.env = {**os.environ, "LAKEHOUSE_ROOT": str(self.root / "lake"),
                    "EVENTS_TOPIC": f"svcpeer-{name}-{uuid.uuid4().hex[:8]}",
                    "STREAM_TRIGGER_INTERVAL": os.environ.get("BENCH_SERVICE_TRIGGER",
                                                              "1 second"),
                    "METRICS_PORT": str(free_port()), "PIPELINES": ""}
        self.env.pop("PIPELINE", None)
        self.settings = Settings.from_env(self.env)
        self.out, self.checkpoint = self.root / "peer" / "windows", self.root / "peer" / "checkpoint"
        self.feed = Feed(self.settings, rate, produce_seconds,
                         table=None if name == "service" else str(self.out))
        self.proc = None

    def start(self, timeout: float = 300) -> float:
        """The system started and ready for events (the service's "SIGTERM to stop", the
        peer's query started and its first batch committed): seconds it took."""
        from testkit.faults import _spawn, output, start_service

        ensure_topic(self.settings)
        t0 = time.time()
        log = self.root / f"{self.name}.log"
        if self.name == "service":
            # As `make stream` runs it: C2 (testkit's children otherwise compile with C1 only).
            self.proc = start_service(self.env, log_path=log, short_run=False)
        else:
            self.proc = _spawn([sys.executable, "-m", "bench.service_peers", "peer", self.name,
                                str(self.out), str(self.checkpoint)], self.env, log,
                               short_run=False)
        # A peer is ready once its first (empty) batch is committed: its start-up (the JVM's
        # first Delta write, codegen: ~50 s here) stays out of the warm-up too.
        while READY[self.name] not in output(self.proc, 100_000) or (
                self.name != "service" and not (self.checkpoint / "commits" / "0").exists()):
            if self.proc.poll() is not None or time.time() - t0 > timeout:
                raise RuntimeError(f"{self.name} did not start:\n{output(self.proc)}")
            time.sleep(0.5)
        return round(time.time() - t0, 1)

    def lag(self) -> int | None:
        """Records behind: the topic's end offsets minus the processed position."""
        offsets = topic_offsets(self.settings)
        if not offsets:
            return None
        processed = (processed_offsets(self.settings)[0] if self.name == "service"
                     else checkpoint_offsets(self.checkpoint, self.settings.events_topic))
        return sum(consumer_lag(offsets, processed).values())

    def alive(self) -> None:
        from testkit.faults import output

        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} died:\n{output(self.proc)}")

    def stop(self) -> None:
        from testkit.faults import crash

        if self.proc is None or self.proc.poll() is not None:
            return
        if self.name == "service":
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
                return
            except Exception:  # noqa: BLE001 - a service that does not stop is killed
                pass
        crash(self.proc)


def run(name: str, rate: int, warmup: int, seconds: int, drain: float = 120,
        lag_every: float | None = None) -> dict:
    """One run of system `name`: started, the producer at `rate` for warmup + seconds, the
    probes sent after the warm-up looked up until all are seen or `drain` s after the
    producer stopped (no drain when sampling the lag: the run ends with the producer)."""
    system = System(name, rate, warmup + seconds)
    load = [round(v, 2) for v in os.getloadavg()]
    started_in = system.start()
    feed, lags = system.feed, []
    print(f"  {name} at {rate}/s: started in {started_in} s", flush=True)
    try:
        t0 = time.time()
        feed.producer.start()
        since, deadline, last_lag = t0 + warmup, None, 0.0
        while True:
            feed.take_probes()
            now = time.time()
            if feed.done and deadline is None:
                deadline = now + (0 if lag_every else drain)
            if lag_every and now - last_lag >= lag_every and not feed.done:
                last_lag = now
                lags.append((round(now - t0, 1), system.lag()))
            if not lag_every:
                feed.look()
            if deadline is not None and (now >= deadline or feed.drained(since)):
                break
            system.alive()
            time.sleep(0.2)
        feed.producer.join(30)
    finally:
        if feed.producer.is_alive():
            feed.producer.terminate()
        system.stop()
    out = {"system": name, "rate": rate, "root": str(system.root), "load_average_before": load,
           "started_in_s": started_in,
           "produced": feed.done[1] if feed.done else None,
           "produced_per_s": round(feed.done[1] / feed.done[2]) if feed.done else None}
    if lag_every:
        out["lag"] = lags
    else:
        out["freshness_s"] = feed.freshness(since)
    return out


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def freshness(systems: list[str], rates: list[int], rounds: int, warmup: int, seconds: int,
              drain: float) -> dict:
    runs = []
    for rate in rates:
        for r in range(rounds):
            for name in systems:
                print(f"freshness: {rate}/s, round {r + 1}/{rounds}, {name}", flush=True)
                run_ = run(name, rate, warmup, seconds, drain)
                run_["round"] = r + 1
                runs.append(run_)
                print(f"    {run_['freshness_s']}", flush=True)
    summary = {}
    for rate in rates:
        per = {}
        for name in systems:
            mine = [x["freshness_s"] for x in runs if x["rate"] == rate and x["system"] == name]
            per[name] = {**{q: median([f[q] for f in mine]) for q in ("p50", "p95", "max")},
                         "rounds": len(mine), "probes": sum(f["probes"] for f in mine),
                         "missing": sum(f["missing"] for f in mine)}
        peers = [n for n in systems if n != "service" and per[n]["p95"] is not None]
        if "service" in per and per["service"]["p95"] is not None and peers:
            better = min(peers, key=lambda n: per[n]["p95"])
            per["ratio"] = {"better_peer": better,
                            "service_p95_over_better_peer_p95": round(
                                per["service"]["p95"] / per[better]["p95"], 2),
                            **{f"service_p95_over_{n}_p95": round(
                                per["service"]["p95"] / per[n]["p95"], 2) for n in peers}}
        summary[str(rate)] = per
    return {"runs": runs, "medians": summary}


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of lag over time (records/s)."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 1) if den else None


def knee(systems: list[str], rates: list[int], seconds: int, every: float, flat: float,
         warmup: int = 0) -> dict:
    points, stopped = {n: [] for n in systems}, set()
    for rate in rates:
        for name in systems:
            if name in stopped:
                continue
            print(f"knee: {rate}/s, {name}", flush=True)
            run_ = run(name, rate, warmup, seconds, lag_every=every)
            tail = [(t, v) for t, v in run_["lag"]
                    if v is not None and t >= warmup + seconds / 3]
            run_["lag_slope_per_s"] = s = slope(tail)
            run_["flat"] = s is not None and s < flat * rate
            run_["lag_first"] = tail[0][1] if tail else None
            run_["lag_last"] = tail[-1][1] if tail else None
            points[name].append(run_)
            print(f"    slope {s}/s (flat below {flat * rate:.0f}/s): "
                  f"{'flat' if run_['flat'] else 'growing'}, lag {run_['lag_last']}", flush=True)
            if not run_["flat"]:
                stopped.add(name)
    knees = {}
    for name, runs in points.items():
        ok = []
        for r in runs:
            if not r["flat"]:
                break
            ok.append(r["rate"])
        knees[name] = {"knee": max(ok) if ok else None,
                       "first_not_flat": next((r["rate"] for r in runs if not r["flat"]), None)}
    peers = [n for n in systems if n != "service" and knees[n]["knee"]]
    ratio = None
    if "service" in knees and peers:
        better = max(peers, key=lambda n: knees[n]["knee"])
        ratio = {"better_peer": better, "service_knee_over_better_peer_knee": round(
            (knees["service"]["knee"] or 0) / knees[better]["knee"], 2),
            **{f"service_knee_over_{n}_knee": round(
                (knees["service"]["knee"] or 0) / knees[n]["knee"], 2) for n in peers}}
    return {"flat_means": f"lag slope over the last two thirds < {flat} x rate per second",
            "seconds": seconds, "warmup_s": warmup, "sample_every_s": every, "runs": points, "knees": knees,
            "ratio": ratio}


def run_peer(name: str, out: str, checkpoint: str) -> None:
    """In the peer's own process: its Spark application, its query, until killed."""
    from pyspark.sql import SparkSession

    settings = Settings.from_env()
    builder = SparkSession.builder
    for key, value in handwritten.live_conf(settings, name != "naive").items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    job = handwritten.medallion_job if name == "medallion" else handwritten.live_job
    query = job(spark, settings, out, checkpoint)
    print("peer query started", flush=True)
    query.awaitTermination()


def ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",") if v.strip()]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        run_peer(*sys.argv[2:5])
        return 0
    env = os.environ.get
    if any(env(k, "") not in ("", "0") for k in ALONE):
        from bench import service_run

        return service_run.main()
    systems = [s.strip() for s in env("BENCH_SERVICE_SYSTEMS", ",".join(SYSTEMS)).split(",")
               if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"BENCH_SERVICE_SYSTEMS: unknown {sorted(unknown)} (of {SYSTEMS})")
    knee_mode = env("BENCH_KNEE", "0")
    warmup, seconds = int(env("BENCH_SERVICE_WARMUP", "90")), int(env("BENCH_SERVICE_SECONDS", "180"))
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "systems": systems,
        "peer_conf": {"naive": "Spark defaults (jars, Delta, UTC, 4g driver)",
                      "tuned": handwritten.LIVE_TUNED_CONF,
                      "medallion": "tuned, with bronze and dropDuplicatesWithinWatermark"},
        "trigger": env("BENCH_SERVICE_TRIGGER", "1 second"),
    }
    if knee_mode != "only":
        rates, rounds = ints("BENCH_SERVICE_RATES", "20000,5000"), int(env("BENCH_SERVICE_ROUNDS", "3"))
        result["freshness"] = {"rates": rates, "rounds": rounds, "warmup_s": warmup,
                               "seconds": seconds, **freshness(
                                   systems, rates, rounds, warmup, seconds,
                                   float(env("BENCH_SERVICE_DRAIN", "120")))}
    if knee_mode in ("1", "only"):
        result["knee"] = knee(systems, ints("BENCH_KNEE_RATES", "5000,10000,15000,20000,30000,40000"),
                              int(env("BENCH_KNEE_SECONDS", "180")),
                              float(env("BENCH_KNEE_EVERY", "5")),
                              float(env("BENCH_KNEE_FLAT", "0.01")),
                              int(env("BENCH_KNEE_WARMUP", "0")))
    print(json.dumps({k: v for k, v in result.items() if k != "freshness"}, default=str)[:2000])
    if "freshness" in result:
        print(json.dumps(result["freshness"]["medians"], indent=1))
    write_result(env("BENCH_SERVICE_KIND",
                     "service-knee" if knee_mode == "only" else "service-peers"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
