"""`make drills`: fault drills on the real stack (Kafka, Spark, Delta, Dagster in-process).

    python -m bench.drills [--only crash,auth] [--seed 7]

Drills (each prints what it did and what it verified):
  crash        SIGKILLs of the service and of corrections runs at points read from the
               checkpoint and the Delta logs; restarts; then the proof
  broker       a broker of the drill's own stopped 3 minutes under 10,000 events/s: the
               service rides it out, its lag flat within 2 minutes, each offset once, proven
  registry     the drill's own schema registry stopped 2 minutes under an Avro pipeline at
               10,000 events/s, the producer switching to a schema version the service has not
               seen: retried with backoff, lag flat within 2 minutes, each offset once, proven
  concurrency  two corrections of one date at once, and a reprocess while the service streams
  bad_input    1,000,000 records, 10% malformed (every reason, giant, binary, deeply nested,
               wrong types): every bad record quarantined with its reason; throughput vs clean
  retention    a topic cut under an ingested date, and a fresh instance on the cut topic
  transactions a transactional producer aborting 10% of its transactions: only committed
               records land; a replay reading uncommitted records fails the proof
  auth         a SASL/SCRAM-SHA-512 broker: right credentials work end to end; wrong ones fail
               fast, naming authentication, without a retry storm or the secret in any output
  lifecycle    kills inside a batch then a deleted checkpoint (each offset once, quarantine
               included); a position 100+ bronze commits back; a re-created topic refused
  old_dates    late events for a date 3 days old: the late-data sensor requests its run, whose
               blocking proof passes; the late events in gold; the cursor asks no more
  object_store on S3Proxy with the PostgreSQL writer locks: the service SIGSTOPped 90 s, a
               second one started, the first resumed, table_maintenance looping beside them:
               one writer at a time, contiguous Delta logs, each batch once, each offset once

DRILLS_SCALE (default 1) scales the record counts (e.g. 0.05 for a quick run; the number of
faults does not scale). The summary list goes to bench/results/drills-<YYYY-MM-DDTHHMMSS>.json (one
file per run); the exit status is non-zero when any drill fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TQDM_DISABLE", "1")
# One process runs the jobs of many instances: the definitions load once, with the first
# instance's data, so their daily partitions start at a fixed date, not at that data's first
# event date (old_dates needs a date 3 days back).
os.environ.setdefault("PARTITIONS_START", "2025-01-01")

from bench.drills.common import Context, DrillResult, say  # noqa: E402

DRILLS = {
    "crash": "bench.drills.crash",
    "broker": "bench.drills.broker_restart",
    "registry": "bench.drills.registry_outage",
    "concurrency": "bench.drills.concurrency",
    "bad_input": "bench.drills.bad_input",
    "retention": "bench.drills.retention",
    "auth": "bench.drills.auth",
    "transactions": "bench.drills.transactions",
    "lifecycle": "bench.drills.lifecycle",
    "old_dates": "bench.drills.old_dates",
    "object_store": "bench.drills.object_store",
}
RESULTS = Path(__file__).resolve().parents[1] / "results"


def _machine() -> str:
    mem = ""
    try:
        kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
        mem = f", {round(kb / 1024 / 1024)} GiB"
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.system()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated drills (default: all)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("DRILLS_SEED", "7")))
    parser.add_argument("--keep", action="store_true", help="keep the drills' work folder")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(DRILLS)
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        parser.error(f"unknown drill(s) {unknown}; choose from {list(DRILLS)}")
    scale = float(os.environ.get("DRILLS_SCALE", "1"))
    if not 0 < scale <= 10:
        parser.error(f"DRILLS_SCALE={scale} must be in (0, 10]")

    from lakehouse.config.settings import Settings

    bootstrap = Settings.from_env().kafka_bootstrap_servers
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-drills-"))
    ctx = Context(scale=scale, seed=args.seed, bootstrap=bootstrap, workdir=workdir)
    started = datetime.now(UTC)
    print(f"drills {names} on {bootstrap}, DRILLS_SCALE={scale}, seed {args.seed}, "
          f"work folder {workdir} ({_machine()})", flush=True)
    results: list[DrillResult] = []
    try:
        for name in names:
            module = importlib.import_module(DRILLS[name])
            say(module.NAME, "start")
            t0 = time.monotonic()
            result = DrillResult(module.NAME)  # filled in as the drill goes
            try:
                module.run(ctx, result)
            except Exception as exc:  # noqa: BLE001 - a failed drill is a result, not a crash
                traceback.print_exc()
                result.passed = False
                result.error = f"{type(exc).__name__}: {exc}"[:2000]
            result.seconds = round(time.monotonic() - t0, 1)
            results.append(result)
            say(result.drill, f"{'PASSED' if result.passed else 'FAILED'} in {result.seconds}s: "
                              f"runs {result.runs}, faults {result.faults_injected}, records "
                              f"checked {result.records_checked}, lost {result.lost}, "
                              f"duplicated {result.duplicated}, wrong {result.wrong}"
                              + (f"; error: {result.error}" if result.error else ""))
    finally:
        ctx.stop()
        if not args.keep and all(r.passed for r in results):
            shutil.rmtree(workdir, ignore_errors=True)

    run_facts = {"date": started.isoformat(timespec="seconds"), "machine": _machine(),
                 "scale": scale, "seed": args.seed}
    summary = [{**r.summary(), **run_facts} for r in results]
    RESULTS.mkdir(exist_ok=True)
    # One file per run, never overwritten (the docs cite these by name).
    out = RESULTS / f"drills-{started.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print("\nsummary:")
    header = ("drill", "runs", "faults_injected", "records_checked", "lost", "duplicated",
              "wrong", "seconds", "passed")
    print("  ".join(f"{h:>16}" if i else f"{h:<22}" for i, h in enumerate(header)))
    for r in summary:
        print("  ".join(f"{str(r[h]):>16}" if i else f"{str(r[h]):<22}"
                        for i, h in enumerate(header)))
    print(f"written to {out}" + ("" if all(r.passed for r in results) else
                                f"; work folder kept: {workdir}"))
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
