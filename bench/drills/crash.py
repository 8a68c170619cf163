"""Drill 1, crash anywhere: seeded SIGKILLs of the streaming service and of corrections runs,
each at a point read from the pipeline's durable state, a restart after each; then the proof.

Kill points (seeded order):
- `ingest_in_flight`: the ingest query's `offsets/N` is written, `commits/N` is not;
- inside the ingest foreachBatch of batch N, between two of its commits
  (`faults.INGEST_KILL_POINTS`): `quarantine_before_bronze` (quarantine appended, bronze not),
  `bronze_before_aggregates` (bronze appended, the aggregates MERGE not committed),
  `aggregates_before_checkpoint` (the MERGE committed, Spark's `commits/N` not);
- `corrections@<hook>`: a corrections run of a date (`python -m spark_jobs.faults
  corrections`), killed when a MERGE has written files it has not committed
  (`merge_files_written`), when the changelog is committed and gold is not
  (`changelog_committed`), or when gold is committed and `corrections_state` is not
  (`gold_committed`).
Verified at the end: every offset of the topic in bronze or quarantine exactly once (bronze
and quarantine unique on (partition, offset)), late_events unique on (partition, offset), no
revision logged twice, and for every date: reconcile_dates passes its blocking check, gold ==
replay, and gold == the plain-Python count of the produced records.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    bronze_dates,
    check_landing,
    instance,
    landed_rows,
    produce_acked,
    prove,
    say,
    service_env,
    table_or_empty,
    unique_changelog,
)
from spark_jobs import faults

NAME = "crash_anywhere"
SERVICE_POINTS = ("ingest_in_flight", *faults.INGEST_KILL_POINTS)
KILLS = 10


def plan(rnd: random.Random, kills: int = KILLS) -> list[str]:
    """`kills` kill points: two in corrections, the rest in the service (each point at least
    twice), in a seeded order that starts with two service kills (corrections need bronze)."""
    service = [*SERVICE_POINTS, *SERVICE_POINTS]
    service += [rnd.choice(SERVICE_POINTS) for _ in range(kills - 2 - len(service))]
    rnd.shuffle(service)
    first_hook = rnd.choice(("merge_files_written", "gold_committed"))
    # A changelog commit needs published windows (gold committed by an earlier run) and late
    # data since: only then can the second corrections kill wait for it.
    second_hook = rnd.choice(("changelog_committed", "merge_files_written")
                             if first_hook == "gold_committed"
                             else ("gold_committed", "merge_files_written"))
    points = service[:2] + service[2:]
    points.insert(rnd.randint(2, len(points) - 3), f"corrections@{first_hook}")
    points.insert(rnd.randint(points.index(f"corrections@{first_hook}") + 2, len(points)),
                  f"corrections@{second_hook}")
    return points


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from lakehouse.generator import GeneratorConfig, generate
    from spark_jobs import stream

    rnd = random.Random(ctx.seed)
    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    count = ctx.n(60_000, 5_000)
    records = generate(GeneratorConfig(count=count, seed=ctx.seed, end=end,
                                       span=timedelta(hours=4), keys=12, late_fraction=0.05,
                                       duplicate_fraction=0.04, malformed_fraction=0.02)).records
    points = plan(rnd)
    n_service = sum(1 for p in points if not p.startswith("corrections"))
    n_chunks = n_service + 3  # one per service kill, spares for a missed hook, the last
    step = -(-len(records) // n_chunks)
    chunks = [records[i * step:(i + 1) * step] for i in range(n_chunks)]
    say(NAME, f"{len(records)} records ({dict(Counter(r.kind for r in records))}) in "
              f"{n_chunks} chunks; seeded plan (seed {ctx.seed}): {', '.join(points)}")
    killed: list[dict] = []
    produced = 0

    with instance(ctx, "crash") as settings:
        env = service_env()
        ingest_ckpt = settings.checkpoint_path(stream.INGEST_QUERY)

        def produce_next() -> None:
            nonlocal produced
            chunk = chunks.pop(0)
            produce_acked(settings, chunk, start=produced)
            produced += len(chunk)

        def service_kill(point: str) -> dict:
            produce_next()
            min_batch = faults.next_batch(ingest_ckpt)
            svc = faults.start_service(env, folder / f"service-{len(killed)}.log")
            result.runs += 1
            t0 = time.monotonic()
            try:
                if point in faults.INGEST_KILL_POINTS:
                    batch, landed = faults.kill_inside_batch(svc, settings, point, min_batch,
                                                             timeout=600)
                    where = (f"{point.replace('_', ' ')}" if landed else
                             f"past {point} (the next commit landed as the signal was sent), "
                             "batch not committed")
                else:
                    batch = faults.kill_in_flight(svc, ingest_ckpt, min_batch, timeout=600)
                    where = f"offsets/{batch} written, commits/{batch} not"
            finally:
                if svc.poll() is None:
                    faults.crash(svc)
            return {"point": point, "batch": batch, "state": where,
                    "after_s": round(time.monotonic() - t0, 1)}

        def corrections_kill(hook: str) -> dict | None:
            dates = bronze_dates(settings)
            d = rnd.choice(dates)
            run_id = f"drill-crash-{len(killed)}"
            proc = faults.corrections_process(env, d, run_id, folder / f"{run_id}.log")
            result.runs += 1
            t0 = time.monotonic()
            try:
                got = faults.kill_corrections(proc, settings, hook, timeout=900)
            finally:
                if proc.poll() is None:
                    faults.crash(proc)
            if got is None:
                say(NAME, f"corrections of {d} finished before {hook} (exit {proc.returncode}): "
                          "not counted as a fault")
                return None
            return {"point": f"corrections@{hook}", "date": d.isoformat(), "state": got,
                    "after_s": round(time.monotonic() - t0, 1)}

        pending = list(points)
        attempts = 0
        while pending and attempts < len(points) + 4:
            attempts += 1
            point = pending.pop(0)
            if point.startswith("corrections@"):
                done = corrections_kill(point.split("@", 1)[1])
                if done is None:  # retry later with the hook every run with data reaches
                    if len(chunks) > 1:
                        produce_next()
                    pending.append("corrections@merge_files_written")
                    continue
            else:
                done = service_kill(point)
            killed.append(done)
            result.faults_injected = len(killed)
            say(NAME, f"SIGKILL {len(killed)}/{len(points)} at {done['point']}"
                      + (f" of {done['date']}" if "date" in done else
                         f" (batch {done['batch']})")
                      + f": {done['state']}, {done['after_s']}s after start; restarting")

        while chunks:
            produce_next()
        say(NAME, f"{produced} records produced; final service run to the end of the topic")
        svc = faults.start_service(env, folder / "service-final.log")
        result.runs += 1
        try:
            faults.wait_for(lambda: landed_rows(settings) >= produced, svc, timeout=900,
                            what="every record in bronze or quarantine")
            time.sleep(5)
            svc.send_signal(signal.SIGTERM)
            svc.wait(180)
            clean = svc.returncode == 0 and "stopped cleanly" in faults.output(svc, 100_000)
        finally:
            if svc.poll() is None:
                faults.crash(svc)
        if not clean:
            raise DrillFailed(f"service did not stop cleanly on SIGTERM: {faults.output(svc)}")
        stream.catch_up(ctx.spark(), settings)  # same checkpoint: a catch-up finds nothing new
        result.runs += 1

        landing = check_landing(settings)
        late = table_or_empty(settings, "late_events")
        late_dup = 0
        if late is not None:
            pos = Counter(zip(late["partition"].to_pylist(), late["offset"].to_pylist(),
                              strict=True))
            late_dup = sum(n - 1 for n in pos.values() if n > 1)
        say(NAME, f"landing: {landing.describe()}; late_events duplicated: {late_dup}"
                  + (f"; first missing {landing.missing_examples}" if landing.lost else ""))
        proof = prove(settings, DagsterInstance.ephemeral(), records, NAME)
        result.runs += len(proof.dates)
        twice = unique_changelog(settings)
        say(NAME, f"late_corrections revisions logged twice: {twice}")

    result.faults_injected = len(killed)
    result.records_checked = landing.checked
    result.lost = landing.lost
    result.duplicated = landing.duplicated + late_dup + twice
    result.wrong = proof.wrong + len(proof.failed_checks)
    result.details = {"kills": killed, "produced": produced, "dates": [str(d) for d in
                      proof.dates], "windows_checked": proof.windows_checked,
                      "proof_failures": proof.failed_checks, "notes": proof.notes}
    result.passed = (len(killed) >= KILLS and produced == len(records) and landing.lost == 0
                     and result.duplicated == 0 and proof.ok)
    if len(killed) < KILLS:
        result.details["notes"].append(f"only {len(killed)} kills landed (want {KILLS})")
    return result
