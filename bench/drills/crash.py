"""Drill 1, crash anywhere: seeded SIGKILLs of the streaming service and of corrections runs,
each at a point read from the pipeline's durable state, a restart after each; then the proof.

At least KILLS kills, each placed by a seed of its own (`seed * 1000 + i`: the kill point's
order, and the batch it waits for). Every kill point is guaranteed, not drawn:
- `ingest_in_flight`: the ingest query's `offsets/N` is written, `commits/N` is not;
- after each Delta commit inside the ingest foreachBatch of batch N (`faults.INGEST_KILL_POINTS`,
  each at least twice): `quarantine_before_bronze` (quarantine appended, late lane and bronze
  not), `late_before_bronze` (the late lane appended, bronze not), `bronze_before_aggregates`
  (bronze appended, the aggregates commit not), `aggregates_before_checkpoint` (the aggregates
  committed, Spark's `commits/N` not);
- `corrections@<hook>` (`faults.CORRECTIONS_HOOKS`, each at least once): a corrections run of a
  date (`python -m testkit.faults corrections`) killed while a MERGE has written files it has
  not committed (`merge_files_written`), when gold is committed and its changelog is not
  (`gold_committed`), or when the changelog is committed and `corrections_state` is not
  (`changelog_committed`). Before the last two, late events are sent into published windows of
  the date and ingested, so the killed run has corrections to log. After each corrections kill
  the date's corrections run again to completion (the restart).
After every kill (and every restart of corrections): each changelog revision agrees with gold
(no revision above gold's; where the revisions are equal, the same measures; a window gone from
gold was last logged as removed).
Verified at the end: every offset of the topic in bronze or quarantine exactly once (bronze
and quarantine unique on (partition, offset)), late_events unique on (partition, offset), no
revision logged twice, and for every date: reconcile_dates passes its blocking check, gold ==
replay, and gold == the plain-Python count of the produced records.
"""

from __future__ import annotations

import json
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
from testkit import faults

NAME = "crash_anywhere"
SERVICE_POINTS = ("ingest_in_flight", *faults.INGEST_KILL_POINTS)
KILLS = 20
CHUNK = 1_000  # records produced before each service kill: two batches of the service's 500


def plan(rnd: random.Random, kills: int = KILLS) -> list[str]:
    """`kills` kill points: every service point twice and every corrections hook once, the rest
    drawn, in a seeded order that starts with two service kills (corrections need bronze) and
    keeps the corrections hooks in the order that gives each its state (a first run of a date
    writes gold files; a run after published gold has corrections to log)."""
    service = [*SERVICE_POINTS, *SERVICE_POINTS]
    service += [rnd.choice(SERVICE_POINTS)
                for _ in range(kills - len(faults.CORRECTIONS_HOOKS) - len(service))]
    rnd.shuffle(service)
    points = list(service)
    at = sorted(rnd.sample(range(2, len(service) + 1), len(faults.CORRECTIONS_HOOKS)))
    for k, hook in enumerate(faults.CORRECTIONS_HOOKS):
        points.insert(at[k] + k, f"corrections@{hook}")
    return points


def changelog_disagreements(settings) -> list[str]:
    """Where the changelog says more than gold: a revision above gold's, other measures at
    gold's revision, or a window gone from gold whose last revision was not a removal."""
    from lakehouse.events.shape import DEFAULT_SHAPE

    log = table_or_empty(settings, "late_corrections")
    if log is None or log.num_rows == 0:
        return []
    gold_t = table_or_empty(settings, "reconciled_aggregates")
    gold = {(r["window_start"], r["key"]): r for r in (gold_t.to_pylist() if gold_t else [])}
    newest: dict = {}
    for r in log.to_pylist():
        k = (r["window_start"], r["key"])
        if k not in newest or r["revision"] > newest[k]["revision"]:
            newest[k] = r
    out = []
    for k, r in newest.items():
        g = gold.get(k)
        if g is None:
            if r["after_event_count"] is not None:
                out.append(f"{k}: gone from gold, changelog revision {r['revision']} is not a "
                           "removal")
        elif r["revision"] > g["revision"]:
            out.append(f"{k}: changelog revision {r['revision']} > gold's {g['revision']}")
        elif r["revision"] == g["revision"] and any(
                r[f"after_{m}"] != g[m] for m in DEFAULT_SHAPE.measure_columns):
            out.append(f"{k}: revision {r['revision']} logged with other measures than gold's")
    return out


def late_into_published(settings, d, n: int, rnd: random.Random, tag: str):
    """`n` new events in final windows of date `d` that gold has published (their windows
    closed long ago: late, and corrections of published windows)."""
    from testkit.generator import Record

    gold = table_or_empty(settings, "reconciled_aggregates")
    windows = sorted({(r["window_start"], r["key"]) for r in (gold.to_pylist() if gold else [])
                      if r["event_date"] == d and r["status"] != "open"})
    if not windows:
        return []
    out = []
    for i in range(n):
        start, key = rnd.choice(windows)
        t = start.replace(tzinfo=UTC) + timedelta(milliseconds=rnd.randrange(1, 59_000))
        event = {"event_id": f"{tag}-{i}", "key": key,
                 "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "value": f"{rnd.randint(1, 500_000) / 100:.2f}"}
        out.append(Record(key.encode(), json.dumps(event).encode(), "late", event))
    return out


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from spark_jobs import stream
    from spark_jobs.corrections import run_corrections
    from testkit.generator import GeneratorConfig, generate

    points = plan(random.Random(ctx.seed))
    n_service = sum(1 for p in points if not p.startswith("corrections"))
    n_chunks = n_service + 3  # one per service kill, spares for a retried point, the last
    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    records = generate(GeneratorConfig(
        count=ctx.n(60_000, CHUNK * n_chunks), seed=ctx.seed, end=end, span=timedelta(hours=4),
        keys=12, late_fraction=0.05, duplicate_fraction=0.04, malformed_fraction=0.02)).records
    step = -(-len(records) // n_chunks)
    chunks = [records[i * step:(i + 1) * step] for i in range(n_chunks)]
    say(NAME, f"{len(records)} records ({dict(Counter(r.kind for r in records))}) in "
              f"{n_chunks} chunks; plan (seed {ctx.seed}): {', '.join(points)}")
    killed: list[dict] = []
    disagreements: list[str] = []
    produced = 0

    with instance(ctx, "crash") as settings:
        env = service_env()
        ingest_ckpt = settings.checkpoint_path(stream.INGEST_QUERY)

        def produce(batch) -> None:
            nonlocal produced
            produce_acked(settings, batch, start=produced)
            produced += len(batch)

        def check_changelog(after: str) -> None:
            found = changelog_disagreements(settings)
            disagreements.extend(f"after {after}: {x}" for x in found)
            if found:
                say(NAME, f"changelog disagrees with gold after {after}: {found[:3]}")

        def service_kill(point: str, rnd: random.Random) -> dict | None:
            produce(chunks.pop(0))
            # the first or the second batch of the chunk (the service reads 500 per batch)
            min_batch = faults.next_batch(ingest_ckpt) + rnd.randint(0, 1)
            svc = faults.start_service(env, folder / f"service-{len(killed)}.log")
            result.runs += 1
            t0 = time.monotonic()
            try:
                if point in faults.INGEST_KILL_POINTS:
                    batch, landed = faults.kill_inside_batch(svc, settings, point, min_batch,
                                                             timeout=600)
                    if not landed:
                        say(NAME, f"batch {batch} went past {point} as the signal was sent")
                        return None
                    where = point.replace("_", " ")
                else:
                    batch = faults.kill_in_flight(svc, ingest_ckpt, min_batch, timeout=600)
                    where = f"offsets/{batch} written, commits/{batch} not"
            finally:
                if svc.poll() is None:
                    faults.crash(svc)
            return {"point": point, "batch": batch, "state": where,
                    "after_s": round(time.monotonic() - t0, 1)}

        def published_date(rnd: random.Random):
            """A date gold has published (one is corrected first when none is)."""
            gold = table_or_empty(settings, "reconciled_aggregates")
            dates = sorted({r["event_date"] for r in (gold.to_pylist() if gold else [])})
            if not dates:
                d = rnd.choice(bronze_dates(settings))
                run_corrections(ctx.spark(), settings, d, run_id=f"drill-crash-setup-{d}")
                return d
            return rnd.choice(dates)

        def corrections_kill(hook: str, rnd: random.Random, i: int) -> dict | None:
            if hook == "merge_files_written":
                d = rnd.choice(bronze_dates(settings))
            else:  # late events into its published windows: the run has corrections to log
                d = published_date(rnd)
                extra = late_into_published(settings, d, 40, rnd, f"crash-late-{i}")
                records.extend(extra)
                produce(extra)
                stream.catch_up(ctx.spark(), settings)
                result.runs += 1
            run_id = f"drill-crash-{i}"
            proc = faults.corrections_process(env, d, run_id, folder / f"{run_id}.log")
            result.runs += 1
            t0 = time.monotonic()
            try:
                got = faults.kill_corrections(proc, settings, hook, timeout=900)
            finally:
                if proc.poll() is None:
                    faults.crash(proc)
            check_changelog(f"corrections@{hook} of {d}")
            # the restart: the date's corrections run to completion
            run_corrections(ctx.spark(), settings, d, run_id=f"{run_id}-restart")
            result.runs += 1
            check_changelog(f"the restart of corrections of {d}")
            if got is None:
                say(NAME, f"corrections of {d} finished before {hook} (exit {proc.returncode})")
                return None
            return {"point": f"corrections@{hook}", "date": d.isoformat(), "state": got,
                    "after_s": round(time.monotonic() - t0, 1)}

        pending = list(points)
        attempt = 0
        while pending and attempt < len(points) + 8:
            rnd = random.Random(ctx.seed * 1000 + attempt)  # this kill's own seed
            attempt += 1
            point = pending.pop(0)
            if point.startswith("corrections@"):
                done = corrections_kill(point.split("@", 1)[1], rnd, attempt)
            elif chunks:
                done = service_kill(point, rnd)
            else:
                break
            if done is None:  # the point was passed before the signal landed: again later
                pending.append(point)
                continue
            done["seed"] = ctx.seed * 1000 + attempt - 1
            killed.append(done)
            result.faults_injected = len(killed)
            if not point.startswith("corrections@"):
                check_changelog(point)
            say(NAME, f"SIGKILL {len(killed)}/{len(points)} at {done['point']}"
                      + (f" of {done['date']}" if "date" in done else
                         f" (batch {done['batch']})")
                      + f": {done['state']}, {done['after_s']}s after start; restarting")

        while chunks:
            produce(chunks.pop(0))
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
        check_changelog("the proof")
        twice = unique_changelog(settings)
        say(NAME, f"late_corrections revisions logged twice: {twice}; changelog/gold "
                  f"disagreements over all kills: {len(disagreements)}")

    landed = {k["point"] for k in killed}
    wanted = {*SERVICE_POINTS, *(f"corrections@{h}" for h in faults.CORRECTIONS_HOOKS)}
    result.faults_injected = len(killed)
    result.records_checked = landing.checked
    result.lost = landing.lost
    result.duplicated = landing.duplicated + late_dup + twice
    result.wrong = proof.wrong + len(proof.failed_checks) + len(disagreements)
    result.details = {"kills": killed, "produced": produced, "dates": [str(d) for d in
                      proof.dates], "windows_checked": proof.windows_checked,
                      "points_never_landed": sorted(wanted - landed),
                      "changelog_disagreements": disagreements[:20],
                      "proof_failures": proof.failed_checks, "notes": proof.notes}
    result.passed = (len(killed) >= KILLS and wanted <= landed and produced == len(records)
                     and landing.lost == 0 and result.duplicated == 0 and proof.ok
                     and not disagreements)
    if len(killed) < KILLS:
        result.details["notes"].append(f"only {len(killed)} kills landed (want {KILLS})")
    return result
