"""`make bench-run-path`: what a Dagster run costs from a cold start, the way the schedules and
sensors run it (`dagster asset materialize` in a fresh process: imports, code location, JVM,
the run's own work, Dagster's event log), against the hand-written jobs (`bench/handwritten.py`)
each run in a fresh process of its own (Python, pyspark, the same Spark configuration and JVM).

One topic of RUN_PATH_EVENTS events (default 3,000) on one event date. Each round, interleaved:
- `catch_up`: the stream catch-up of the whole topic into a fresh lakehouse root, through
  Dagster; its peer the naive streaming job (`handwritten.streaming_job`) in a fresh process;
- `empty_catch_up`: the same catch-up again on that root (nothing new);
- `reconcile_first` / `reconcile_again`: `reconcile_dates` for the date (corrections, replay,
  the blocking proof and the fast-path check, one partition), first on that root, then again
  with nothing new (what the hourly schedule mostly does);
- `replay`: `replay_aggregates` alone for the date through Dagster; its peer the hand-written
  batch job (`handwritten.batch_job`) over the same offset range, in a fresh process.
The product's driver JVMs map this machine's class archive (`make class-archive`); the peers'
JVMs start as spark-submit starts one, and once more with the archive (`*_archived`: what the
archive alone would give a hand-written job).
With RUN_PATH_CONNECT=sc://127.0.0.1:15002 (a running Connect server, `make spark-up`), each round
also copies the caught-up root before its first reconcile and runs, with SPARK_REMOTE set:
`reconcile_first_connect` / `reconcile_again_connect` on that copy and `replay_connect`: the same
runs with the server warm, beside the cold classic ones; before the first of them,
RUN_PATH_CONNECT_WARMUP (default 8) unrecorded reconciles over Connect warm the server's JIT as
serving runs does (a fresh server's runs: 44, 19, 17, 16, 20, 17 s, then 12-16 s from the
seventh on, 2026-11-28; recorded: bench/results/connect-warmup-2026-11-28T205700.json).
RUN_PATH_RECONCILE_ONLY=1
leaves out the peers and the replays (the reconcile comparison alone).
Plus the fixed costs of a fresh process, each measured alone: importing the code location,
Great Expectations, pyspark, and starting a SparkSession.
RUN_PATH_ROUNDS rounds (default 3), medians and ratios (peer / product: >= 1 is the product
faster). Written to bench/results/run-path-<date>.json. Compare ratios within one run: this
machine is shared and its speed varies between runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from bench import write_result

REPO = Path(__file__).resolve().parents[1]
WORK = Path("/tmp") / f"lakehouse-run-path-{uuid.uuid4().hex[:6]}"
PY = sys.executable
DAGSTER = str(Path(PY).parent / "dagster")
CATCH_UP = "raw_events,bronze_events,streaming_aggregates"
RECONCILE = "replay_aggregates,late_corrections,reconciled_aggregates"


# Optional: a checkout of earlier code (e.g. `git archive <commit> | tar -x -C dir`, with its
# `.jars` linked): its empty catch-up and reconcile_dates run on the same roots, interleaved,
# reported as `baseline_*` (the before/after of a change, measured back to back).
BASELINE = os.environ.get("RUN_PATH_BASELINE")
CONNECT = os.environ.get("RUN_PATH_CONNECT")
RECONCILE_ONLY = os.environ.get("RUN_PATH_RECONCILE_ONLY") == "1"
# Runs over Connect before the first measured one, on a copy of the first caught-up root (not
# recorded): the server's JIT warmed as one that has been serving runs is. 0: a server as found.
WARMUP = int(os.environ.get("RUN_PATH_CONNECT_WARMUP", "8"))


def env(root: Path, topic: str, code: Path = REPO) -> dict[str, str]:
    plain = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "RUN_PATH_CONNECT")}
    return {**plain, "LAKEHOUSE_ROOT": str(root), "EVENTS_TOPIC": topic,
            "DAGSTER_HOME": str(WORK / "dagster_home"), "PYTHONPATH": str(code),
            "GX_ANALYTICS_ENABLED": "false", "DAGSTER_DISABLE_TELEMETRY": "true",
            "TQDM_DISABLE": "1", "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", PY)}


def timed(cmd: list[str], environ: dict[str, str], what: str) -> float:
    """Wall seconds of `cmd` in a fresh process (it must succeed)."""
    cwd = environ.get("PYTHONPATH", str(REPO))
    log = WORK / "logs" / f"{what}-{uuid.uuid4().hex[:6]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(cmd, env=environ, cwd=cwd, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}): see {log}")
    print(f"  {what}: {seconds:.1f} s", flush=True)
    return seconds


def materialize(select: str, environ: dict[str, str], what: str, day: date | None = None) -> float:
    return timed([DAGSTER, "asset", "materialize", "-m", "orchestration.definitions", "--select",
                  select, *(["--partition", day.isoformat()] if day else [])], environ, what)


def peer(job: str, environ: dict[str, str], *args: str) -> float:
    return timed([PY, "-m", "bench.run_path", job, *args], environ, f"peer_{job}")


# A peer's JVM starts as spark-submit starts one (no class archive: `make class-archive` is the
# product's set-up, spark_jobs.session.class_archive_option); with this variable set in its
# environment it maps the product's archive too (the `*_archived` runs: what the archive alone
# would give a hand-written job).
PEER_ARCHIVE = "RUN_PATH_PEER_ARCHIVE"


def run_peer(job: str, *args: str) -> None:
    """In the fresh process: the session as every entry point builds it, then the peer job."""
    from bench import handwritten
    from lakehouse.config.settings import Settings
    from spark_jobs.session import get_spark

    settings = Settings.from_env()
    spark = get_spark(settings, class_archive=os.environ.get(PEER_ARCHIVE) == "1")
    if job == "stream":
        out = args[0]
        handwritten.streaming_job(spark, settings, out + "/out", out + "/ck", 10_000_000)
    elif job == "batch":
        out, day, ranges = args[0], date.fromisoformat(args[1]), json.loads(args[2])
        handwritten.batch_job(spark, settings, out, day,
                              {int(p): tuple(r) for p, r in ranges.items()})
    spark.stop()


FIXED = {
    "import_code_location": "import orchestration.definitions",
    "import_great_expectations": "import expectations.reconciliation",
    "import_pyspark_sql": "import pyspark.sql",
    "spark_session_start": ("from lakehouse.config.settings import Settings\n"
                            "from spark_jobs.session import get_spark\n"
                            "get_spark(Settings.from_env()).stop()"),
    "spark_session_start_no_class_archive": (
        "from lakehouse.config.settings import Settings\n"
        "from spark_jobs.session import get_spark\n"
        "get_spark(Settings.from_env(), class_archive=False).stop()"),
}


PEER_RUNS = ("naive_peer", "naive_peer_archived", "batch_peer", "batch_peer_archived")


def archived(environ: dict[str, str]) -> dict[str, str]:
    return {**environ, PEER_ARCHIVE: "1"}


def fixed_costs(environ: dict[str, str], rounds: int) -> dict[str, float]:
    """Seconds of each start-up piece in a fresh process (median of `rounds`), the
    interpreter's own start subtracted."""
    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([PY, "-c", code], env=environ, cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    bare = statistics.median(once("pass") for _ in range(rounds))
    return {k: round(statistics.median(once(c) for _ in range(rounds)) - bare, 2)
            for k, c in FIXED.items()} | {"python_start": round(bare, 2)}


def main() -> int:
    if len(sys.argv) > 1:  # a peer, in its own process
        run_peer(sys.argv[1], *sys.argv[2:])
        return 0
    from lakehouse.config.settings import Settings
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.kafka.log_ranges import offset_ranges
    from testkit.generator import GeneratorConfig, generate, produce

    n = int(os.environ.get("RUN_PATH_EVENTS", "3000"))
    rounds = int(os.environ.get("RUN_PATH_ROUNDS", "3"))
    topic = f"run-path-{uuid.uuid4().hex[:8]}"
    home = WORK / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "infra" / "dagster.yaml", home / "dagster.yaml")
    end = (datetime.now(UTC) - timedelta(days=1)).replace(hour=20, minute=0, second=0,
                                                          microsecond=0)
    day = end.date()
    base = Settings.from_env({**env(WORK / "produce", topic)})
    ensure_topic(base)
    produce(base, generate(GeneratorConfig(count=n, seed=7, end=end,
                                           span=timedelta(hours=4))).records)
    print(f"{n} events on {day} in topic {topic}; work in {WORK}", flush=True)

    print("fixed costs of a fresh process", flush=True)
    fixed = fixed_costs(env(WORK / "fixed", topic), rounds)
    print(f"  {fixed}", flush=True)
    runs: dict[str, list[float]] = {k: [] for k in (
        "catch_up", "naive_peer", "naive_peer_archived", "empty_catch_up", "reconcile_first",
        "reconcile_again", "replay", "batch_peer", "batch_peer_archived")
        if not (RECONCILE_ONLY and k in PEER_RUNS + ("replay",))}
    warmup: list[float] = []  # the warm-up runs' seconds, in order (not in the medians)
    for i in range(rounds):
        print(f"round {i + 1}", flush=True)
        product = env(WORK / f"product-{i}", topic)
        runs["catch_up"].append(materialize(CATCH_UP, product, "catch_up"))
        if not RECONCILE_ONLY:
            runs["naive_peer"].append(peer("stream", env(WORK / "peer", topic),
                                           str(WORK / f"peer-{i}")))
            runs["naive_peer_archived"].append(peer("stream", archived(env(WORK / "peer", topic)),
                                                    str(WORK / f"peer-archived-{i}")))
        runs["empty_catch_up"].append(materialize(CATCH_UP, product, "empty_catch_up"))
        if CONNECT:  # the same caught-up root, for the runs over Connect
            shutil.copytree(WORK / f"product-{i}", WORK / f"connect-{i}")
            remote = {**env(WORK / f"connect-{i}", topic), "SPARK_REMOTE": CONNECT}
            if i == 0 and WARMUP:
                shutil.copytree(WORK / "product-0", WORK / "warmup")
                warmup = [round(materialize(RECONCILE, {**env(WORK / "warmup", topic),
                                                        "SPARK_REMOTE": CONNECT},
                                            "connect_warmup", day), 2) for _ in range(WARMUP)]
        if BASELINE:
            before = env(WORK / f"product-{i}", topic, Path(BASELINE))
            runs.setdefault("baseline_empty_catch_up", []).append(
                materialize(CATCH_UP, before, "baseline_empty_catch_up"))
        runs["reconcile_first"].append(materialize(RECONCILE, product, "reconcile_first", day))
        runs["reconcile_again"].append(materialize(RECONCILE, product, "reconcile_again", day))
        if BASELINE:
            runs.setdefault("baseline_reconcile_again", []).append(
                materialize(RECONCILE, before, "baseline_reconcile_again", day))
        if CONNECT:
            for kind in ("reconcile_first", "reconcile_again"):
                runs.setdefault(f"{kind}_connect", []).append(
                    materialize(RECONCILE, remote, f"{kind}_connect", day))
        if RECONCILE_ONLY:
            continue
        runs["replay"].append(materialize("replay_aggregates", product, "replay", day))
        if CONNECT:
            runs.setdefault("replay_connect", []).append(
                materialize("replay_aggregates", remote, "replay_connect", day))
        ranges, _ = offset_ranges(Settings.from_env(product), day)
        for kind, environ in (("batch_peer", env(WORK / "peer", topic)),
                              ("batch_peer_archived", archived(env(WORK / "peer", topic)))):
            runs[kind].append(peer("batch", environ, str(WORK / f"{kind}-{i}"), day.isoformat(),
                                   json.dumps({str(p): r for p, r in ranges.items()})))
    med = {k: round(statistics.median(v), 2) for k, v in runs.items()}
    ratios = {} if RECONCILE_ONLY else {
        "catch_up_ratio_vs_naive_peer": round(med["naive_peer"] / med["catch_up"], 2),
        "replay_ratio_vs_batch_peer": round(med["batch_peer"] / med["replay"], 2),
        "catch_up_ratio_vs_naive_peer_archived": round(med["naive_peer_archived"]
                                                       / med["catch_up"], 2),
        "replay_ratio_vs_batch_peer_archived": round(med["batch_peer_archived"]
                                                     / med["replay"], 2)}
    if CONNECT:  # classic cold / Connect warm: > 1 is Connect faster
        ratios |= {f"{k}_classic_vs_connect": round(med[k] / med[f"{k}_connect"], 2)
                   for k in ("reconcile_first", "reconcile_again", "replay") if k in med}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "events": n, "event_date": day.isoformat(), "rounds": rounds,
        "fixed_costs_s": fixed,
        "runs_s": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "median_s": med,
        **({"connect": CONNECT, "connect_warmup_runs": WARMUP, "connect_warmup_s": warmup}
           if CONNECT else {}),
        **ratios,
        **({"baseline": BASELINE,
            "empty_catch_up_vs_baseline": round(med["empty_catch_up"]
                                                / med["baseline_empty_catch_up"], 2),
            "reconcile_again_vs_baseline": round(med["reconcile_again"]
                                                 / med["baseline_reconcile_again"], 2)}
           if BASELINE else {}),
        "targets": {"empty_catch_up_s": 10, "reconcile_s": 15, "ratios": 0.8},
    }
    print(json.dumps(result, indent=2), flush=True)
    write_result("run-path", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
