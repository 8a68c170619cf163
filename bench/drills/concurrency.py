"""Drill 3, concurrent writers: two corrections runs of one date at once (threads calling
`run_corrections`, as a sensor run and a schedule run would), and a `reprocess_dates` run
(Dagster, in-process), each while the service streams new records into the same date.

Verified: the per-date lock serializes the two corrections (their commits to the changelog
and gold do not interleave; the second finds only what streamed in meanwhile), no revision is
logged twice, the reprocess run passes its blocking check, and at the end, for every date,
gold == replay == the plain-Python count of every record produced.
"""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime, timedelta

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    Feeder,
    check_landing,
    instance,
    landed_rows,
    produce_acked,
    prove,
    run_job,
    say,
    service_env,
    step_failures,
    unique_changelog,
)
from testkit import faults

NAME = "concurrency"
SERIALIZED_TABLES = ("late_corrections", "reconciled_aggregates")


def commit_spans(settings, run_ids: list[str]) -> dict[str, tuple[int, int]]:
    """For each run, the (first, last) commit time in ms of its tagged commits to the changelog
    and gold. Serialized runs have spans that do not overlap (the second run's work, if it
    found any, e.g. records streamed in meanwhile, starts after the first run's last commit)."""
    from lakehouse.tables.delta_log import commits

    times: dict[str, list[int]] = {}
    for name in SERIALIZED_TABLES:
        for commit in commits(settings, name):
            meta = commit.get("userMetadata") or ""
            for run_id in run_ids:
                if meta.endswith(f":{run_id}"):
                    times.setdefault(run_id, []).append(int(commit["timestamp"]))
    return {run_id: (min(t), max(t)) for run_id, t in times.items()}


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from lakehouse.tables.reads import read
    from spark_jobs import stream
    from spark_jobs.corrections import run_corrections
    from testkit.generator import GeneratorConfig, generate

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    spark = ctx.spark()
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    if end.hour < 3:  # one date: yesterday's last hours
        end = (end - timedelta(days=1)).replace(hour=23, minute=50)
    d = end.date()

    def batch(count: int, seed: int, end_at: datetime, span: timedelta, **kw):
        cfg = dict(keys=6, late_fraction=0.05, duplicate_fraction=0.04, malformed_fraction=0.02)
        cfg.update(kw)
        return generate(GeneratorConfig(count=count, seed=seed, end=end_at, span=span,
                                        **cfg)).records

    base = batch(ctx.n(40_000, 2_000), ctx.seed + 3, end, timedelta(hours=2))
    records = list(base)
    problems: list[str] = []
    dagster_instance = DagsterInstance.ephemeral()
    with instance(ctx, "concurrency") as settings:
        produce_acked(settings, base)
        svc = faults.start_service(service_env(), folder / "service.log")
        result.runs += 1
        try:
            faults.wait_for(lambda: landed_rows(settings) >= len(records), svc, timeout=900,
                            what="the first records ingested")
            run_result, checks = run_job("reconcile_dates", dagster_instance,
                                         partition_key=d.isoformat())
            result.runs += 1
            if not run_result.success or not all(c.passed for c in checks):
                raise DrillFailed(f"publishing {d} failed: {step_failures(run_result)}")
            first = min(read(settings, "reconciled_aggregates", d)["window_start"].to_pylist())
            say(NAME, f"{len(base)} records ingested by the service; {d} published")

            # Late events into published windows, then two corrections of the date at once while
            # the service streams new records of the date.
            late = batch(ctx.n(4_000, 200), ctx.seed + 4, first.astimezone(UTC)
                         + timedelta(minutes=30), timedelta(minutes=30), late_fraction=0,
                         duplicate_fraction=0, malformed_fraction=0)
            produce_acked(settings, late, start=len(records))
            records += late
            faults.wait_for(lambda: landed_rows(settings) >= len(records), svc, timeout=900,
                            what="the late events ingested")
            new = batch(ctx.n(8_000, 400), ctx.seed + 5, end, timedelta(minutes=40))
            feeder = Feeder(settings, new, rate=max(20.0, len(new) / 40), start=len(records))
            records += new
            feeder.begin()
            outcome, errors = {}, []

            def correct(name: str) -> None:
                try:
                    outcome[name] = run_corrections(spark, settings, d, run_id=name)
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(f"{name}: {type(exc).__name__}: {exc}"[:500])

            threads = [threading.Thread(target=correct, args=(f"drill-concurrent-{i}",))
                       for i in (1, 2)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(1200)
            result.runs += 2
            result.faults_injected += 1
            changed = sorted(r.corrected + r.inserted for r in outcome.values())
            twice = unique_changelog(settings)
            say(NAME, f"two corrections of {d} at once (while the service streamed): done in "
                      f"{time.monotonic() - t0:.0f}s; windows changed by each: {changed} "
                      f"(one waits on the date lock, then finds the work done); revisions "
                      f"logged twice: {twice}; errors: {errors or 'none'}")
            spans = commit_spans(settings, list(outcome))
            overlap = len(spans) == 2 and max(a for a, _ in spans.values()) <= min(
                b for _, b in spans.values())
            say(NAME, f"gold/changelog commits of each run (versions by run): {spans}; "
                      f"interleaved: {overlap}")
            if errors or len(outcome) != 2:
                problems.append(f"concurrent corrections failed: {errors}")
            elif overlap:
                problems.append(f"concurrent corrections were not serialized: {spans}")
            feeder.join()

            # A reprocess of the date while the service streams more records of it.
            more = batch(ctx.n(8_000, 400), ctx.seed + 6, end, timedelta(minutes=40))
            feeder = Feeder(settings, more, rate=max(20.0, len(more) / 40), start=len(records))
            records += more
            feeder.begin()
            t0 = time.monotonic()
            run_result, checks = run_job("reprocess_dates", dagster_instance,
                                         partition_key=d.isoformat())
            result.runs += 1
            result.faults_injected += 1
            passed = run_result.success and all(c.passed for c in checks)
            say(NAME, f"reprocess_dates of {d} while the service streamed: "
                      f"{'passed' if passed else 'FAILED'} in {time.monotonic() - t0:.0f}s "
                      f"({feeder.sent} of {len(more)} new records sent meanwhile)")
            if not passed:
                problems.append(f"reprocess during streaming failed: {step_failures(run_result)}"
                                f" {[c.check_name for c in checks if not c.passed]}")
            feeder.join()
            faults.wait_for(lambda: landed_rows(settings) >= len(records), svc, timeout=900,
                            what="every record ingested")
            time.sleep(3)
            svc.send_signal(signal.SIGTERM)
            svc.wait(180)
        finally:
            if svc.poll() is None:
                faults.crash(svc)
        stream.catch_up(spark, settings)
        result.runs += 1
        landing = check_landing(settings)
        say(NAME, f"landing: {landing.describe()}")
        proof = prove(settings, dagster_instance, records, NAME)
        result.runs += len(proof.dates)
        twice = unique_changelog(settings)
        say(NAME, f"late_corrections revisions logged twice: {twice}")
    result.records_checked = landing.checked
    result.lost = landing.lost
    result.duplicated = landing.duplicated + twice
    result.wrong = proof.wrong + len(proof.failed_checks) + len(problems)
    result.details = {"date": d.isoformat(), "problems": problems,
                      "proof_failures": proof.failed_checks, "notes": proof.notes,
                      "windows_checked": proof.windows_checked}
    result.passed = (not problems and proof.ok and landing.lost == 0 and result.duplicated == 0)
    return result
