"""Drill: late events for a date 3 days old, through the sensor path.

An instance whose correction horizon (CORRECTION_HORIZON=7 days) covers the date D-3. Records
with event times from D-3 to today are ingested (one checkpointed catch-up) and D-3 is
reconciled by a `reconcile_dates` run. Then late events of D-3 (new events, and re-sent copies
of D-3 events already counted) are produced, far behind the stream's watermark, and the
service (a process of its own) lands them in `late_events`. The late-data sensor
(`orchestration.sensors.late_data_sensor`, from the code location's definitions, evaluated
against a real Dagster instance) must then request a run for D-3 and nothing else; exactly what
it requests (job, partition key, tags, run config) is launched in-process.

Verified: the late records land in `late_events` (and bronze) once each and leave the fast
path's aggregates of D-3 untouched; before the sensor's run, gold for D-3 does not hold them;
the run succeeds, its blocking asset check `reconciled_equals_replay` ran for D-3 and passed
(read from the instance's event log); gold for D-3 then equals the plain-Python count of every
record (the late events counted, the re-sent copies not); the sensor, on its new cursor, does
not request D-3 again; and every date is proven (gold == replay == the reference).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from datetime import time as clock

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    bronze_dates,
    check_landing,
    instance,
    produce_acked,
    prove,
    run_job,
    say,
    service_env,
    step_failures,
    table_or_empty,
    unique_changelog,
    wait_until,
)
from testkit import faults, runs

NAME = "old_dates"
DAYS_BACK = 3


def _positions(settings, table: str) -> Counter:
    t = table_or_empty(settings, table)
    if t is None:
        return Counter()
    return Counter(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


def _windows_of(settings, table: str, d) -> dict:
    """{(window_start, key): (count, sum, min, max)} of `table` for event date `d`."""
    from testkit.reference import table_windows

    t = table_or_empty(settings, table)
    if t is None:
        return {}
    return {k: v for k, v in table_windows(t).items() if k[0].date() == d}


def _reference_of(records, d) -> dict:
    from testkit.reference import expected_windows

    return {k: v for k, v in expected_windows(records).items() if k[0].date() == d}


def _late_records(old, earlier, n_new: int, n_resent: int, rnd: random.Random):
    """New events with event times spread over date `old`, and re-sent copies of `old`'s events
    already produced (`earlier`), shuffled: the late burst."""
    from testkit.generator import Record
    from testkit.reference import event_time

    keys = sorted({r.event["key"] for r in earlier if r.event})
    day = datetime.combine(old, clock(0), UTC)
    out = []
    for i in range(n_new):
        t = day + timedelta(milliseconds=rnd.randrange(86_400_000))
        event = {"event_id": f"late-old-{i}", "key": rnd.choice(keys),
                 "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "value": f"{rnd.randint(1, 500_000) / 100:.2f}"}
        out.append(Record(event["key"].encode(), json.dumps(event).encode(), "late", event))
    ours = [r for r in earlier if r.event and event_time(r.event["event_time"]).date() == old]
    for r in rnd.sample(ours, min(n_resent, len(ours))):
        out.append(Record(r.key, r.value, "late_duplicate", r.event))
    rnd.shuffle(out)
    return out


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, build_sensor_context

    from lakehouse.tables.commit_tags import newest_stream_commit
    from orchestration.definitions import defs
    from spark_jobs import stream
    from testkit.generator import GeneratorConfig, generate

    rnd = random.Random(ctx.seed + 31)
    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    spark = ctx.spark()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    old = now.date() - timedelta(days=DAYS_BACK)
    begin = datetime.combine(old, clock(6), UTC)
    end = now - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=ctx.n(40_000, 3_000), seed=ctx.seed + 31, end=end,
                                       span=end - begin, keys=6, late_fraction=0.0,
                                       duplicate_fraction=0.02, malformed_fraction=0.01)).records

    with instance(ctx, NAME, CORRECTION_HORIZON="7 days") as settings:
        if settings.applicable_cutoff(old) <= now + timedelta(hours=1):
            raise DrillFailed(f"the correction horizon {settings.correction_horizon} does not "
                              f"cover {old}")
        dagster_instance = DagsterInstance.ephemeral()
        sensor = defs.get_sensor_def("late_data_sensor")
        resources = {"lakehouse": defs.resources["lakehouse"]}  # the code location's binding

        def tick(cursor: str | None):
            with build_sensor_context(instance=dagster_instance, cursor=cursor,
                                      resources=resources, definitions=defs) as context:
                return sensor.evaluate_tick(context)

        def launch(request):
            """Exactly what the sensor requested, as its daemon would launch it (plus the quiet
            console logger: logging only)."""
            job = request.job_name or sensor.job_name
            config = dict(request.run_config or {})
            config.setdefault("loggers", runs.QUIET["loggers"])
            tags = {**request.tags, "dagster/sensor_name": sensor.name,
                    "dagster/run_key": request.run_key}
            run_result, _ = runs.run_job(job, dagster_instance, tags=tags, run_config=config,
                                         partition_key=request.partition_key)
            result.runs += 1
            return job, run_result

        # ---- D-3 .. today ingested, D-3 reconciled -----------------------------------------
        acked: set[tuple[int, int]] = set()
        p = produce_acked(settings, records)
        acked.update(p.acked.values())
        stream.catch_up(spark, settings)
        result.runs += 1
        landing = check_landing(settings, acked)
        dates = bronze_dates(settings)
        say(NAME, f"{len(records)} records with event times {begin:%Y-%m-%d %H:%M} .. "
                  f"{end:%Y-%m-%d %H:%M} ingested by a catch-up ({landing.describe()}); event "
                  f"dates {[d.isoformat() for d in dates]}; late rows so far: "
                  f"{sum(_positions(settings, 'late_events').values())}")
        if old not in dates:
            raise DrillFailed(f"no event of {old} in bronze")

        run_result, checks = run_job("reconcile_dates", dagster_instance,
                                     partition_key=old.isoformat())
        result.runs += 1
        before_gold = _windows_of(settings, "reconciled_aggregates", old)
        want_before = _reference_of(records, old)
        failed = [c.check_name for c in checks if not c.passed]
        say(NAME, f"reconcile_dates {old}: {'succeeded' if run_result.success else 'FAILED'}, "
                  f"checks failed {failed}; gold {len(before_gold)} windows == reference "
                  f"{len(want_before)} windows: {before_gold == want_before}")
        if not run_result.success or failed or before_gold != want_before:
            problems.append(f"{old} not reconciled before the late events: "
                            f"{step_failures(run_result)} {failed}")

        # The sensor's state before the late events (what its earlier ticks left). Whatever it
        # requests now is launched too: the daemon would have.
        base = tick(None)
        for request in base.run_requests:
            job, run_result = launch(request)
            say(NAME, f"baseline tick requested {job} {request.partition_key}: "
                      f"{'succeeded' if run_result.success else 'FAILED'}")
            if not run_result.success:
                problems.append(f"baseline sensor run {request.partition_key} failed: "
                                f"{step_failures(run_result)}")
        say(NAME, f"baseline sensor tick: {len(base.run_requests)} request(s), cursor "
                  f"{base.cursor!r}")

        # ---- late events of D-3, landed by the service --------------------------------------
        late = _late_records(old, records, ctx.n(4_000, 200), ctx.n(400, 20), rnd)
        fast_before = _windows_of(settings, "streaming_aggregates", old)
        p = produce_acked(settings, late, start=len(records))
        late_positions = set(p.acked.values())
        acked |= late_positions
        all_records = records + late
        svc = faults.start_service(service_env(), folder / "service.log")
        result.runs += 1
        t0 = time.monotonic()
        ckpt = settings.checkpoint_path(stream.INGEST_QUERY)
        try:
            wait_until(lambda: late_positions <= set(_positions(settings, "late_events")), 900,
                       "the late records in late_events", poll=2, proc=svc)
            wait_until(lambda: faults.in_flight(ckpt) is None, 300, "the batch committed",
                       poll=0.5, proc=svc)
            svc.send_signal(signal.SIGTERM)
            svc.wait(180)
        finally:
            if svc.poll() is None:
                faults.crash(svc)
        if svc.returncode != 0 or "stopped cleanly" not in faults.output(svc, 200_000):
            problems.append(f"the service did not stop cleanly: {faults.output(svc)}")
        late_rows = _positions(settings, "late_events")
        bronze_rows = _positions(settings, "bronze_events")
        missing_late = sum(1 for q in late_positions if late_rows[q] == 0)
        twice_late = sum(1 for q in late_positions if late_rows[q] > 1)
        not_bronze = sum(1 for q in late_positions if bronze_rows[q] != 1)
        fast_after = _windows_of(settings, "streaming_aggregates", old)
        gold_now = _windows_of(settings, "reconciled_aggregates", old)
        watermark = newest_stream_commit(settings).watermark_ms
        say(NAME, f"{len(late)} late records of {old} ({Counter(r.kind for r in late)}) landed "
                  f"by the service in {time.monotonic() - t0:.0f}s, behind its watermark "
                  f"{datetime.fromtimestamp(watermark / 1000, UTC):%Y-%m-%d %H:%M:%S}: "
                  f"late_events missing {missing_late}, twice {twice_late}; not once in "
                  f"bronze {not_bronze}; fast path of {old} unchanged: "
                  f"{fast_after == fast_before}; gold of {old} unchanged: "
                  f"{gold_now == before_gold}")
        if missing_late or twice_late or not_bronze:
            problems.append(f"late records: {missing_late} not in late_events, {twice_late} "
                            f"twice, {not_bronze} not once in bronze")
        if fast_after != fast_before:
            problems.append(f"the fast path counted late events of {old}")
        if gold_now != before_gold:
            problems.append(f"gold of {old} changed before any corrections run")

        # ---- the sensor requests D-3; its run proves it --------------------------------------
        second = tick(base.cursor)
        keys = [r.partition_key for r in second.run_requests]
        say(NAME, f"sensor tick after the late events (cursor {base.cursor!r}): requests "
                  f"{[(r.job_name or sensor.job_name, r.partition_key, r.run_key) for r in second.run_requests]}"
                  f", new cursor {second.cursor!r}")
        if keys != [old.isoformat()]:
            problems.append(f"the sensor requested {keys}, not exactly [{old}]")
        sensor_runs = []
        for request in second.run_requests:
            job, run_result = launch(request)
            run_id = run_result.run_id
            stored = dagster_instance.get_run_by_id(run_id)
            evaluations = [e.dagster_event.event_specific_data for e in
                           dagster_instance.all_logs(
                               run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)]
            materialized = {e.dagster_event.event_specific_data.materialization.partition
                            for e in dagster_instance.all_logs(
                                run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                            if e.dagster_event.event_specific_data.materialization.asset_key
                            .to_user_string() == "reconciled_aggregates"}
            blocking = [e for e in evaluations if e.check_name == "reconciled_equals_replay"]
            ok = [e for e in blocking if e.passed and e.blocking
                  and e.partition in (None, request.partition_key)]
            sensor_runs.append({"job": job, "partition": request.partition_key,
                                "run_id": run_id, "status": stored.status.value,
                                "tags": {k: v for k, v in stored.tags.items()
                                         if k.startswith("dagster/")},
                                "checks": [(e.check_name, e.passed, e.blocking, e.partition)
                                           for e in evaluations],
                                "gold_materialized": sorted(x or "" for x in materialized)})
            say(NAME, f"sensor's run {job} {request.partition_key} ({run_id[:8]}): "
                      f"{stored.status.value}; check evaluations in the instance "
                      f"{sensor_runs[-1]['checks']}; reconciled_aggregates materialized for "
                      f"{sorted(x or '' for x in materialized)}")
            if stored.status != DagsterRunStatus.SUCCESS or not ok:
                problems.append(f"the sensor's run of {request.partition_key} did not pass its "
                                f"blocking check: {stored.status.value}, {blocking}: "
                                f"{step_failures(run_result)}")
            if materialized != {request.partition_key}:
                problems.append(f"the sensor's run materialized gold for {materialized}")

        gold_after = _windows_of(settings, "reconciled_aggregates", old)
        want_after = _reference_of(all_records, old)
        changed = sum(1 for k in want_after.keys() | want_before.keys()
                      if want_after.get(k) != want_before.get(k))
        wrong_old = sum(1 for k in want_after.keys() | gold_after.keys()
                        if want_after.get(k) != gold_after.get(k))
        say(NAME, f"gold of {old} after the sensor's run: {len(gold_after)} windows, "
                  f"{wrong_old} differing from the reference of every record; the late events "
                  f"changed {changed} windows of the reference")
        if wrong_old or not changed:
            problems.append(f"gold of {old}: {wrong_old} windows differ from the reference "
                            f"(late events changed {changed})")

        third = tick(second.cursor)
        say(NAME, f"sensor tick on its new cursor {second.cursor!r}: "
                  f"{[r.partition_key for r in third.run_requests]} requested")
        if any(r.partition_key == old.isoformat() for r in third.run_requests):
            problems.append(f"the sensor requested {old} again on cursor {second.cursor!r}")

        # ---- every date proven ------------------------------------------------------------
        landing = check_landing(settings, acked)
        late_dup = sum(n - 1 for n in _positions(settings, "late_events").values() if n > 1)
        proof = prove(settings, dagster_instance, all_records, NAME)
        result.runs += len(proof.dates)
        twice = unique_changelog(settings)
        say(NAME, f"landing: {landing.describe()}; late_events duplicated: {late_dup}; "
                  f"revisions logged twice: {twice}")

    result.faults_injected = len(late)
    result.records_checked = landing.checked
    result.lost = landing.lost + missing_late
    result.duplicated = landing.duplicated + late_dup + twice
    result.wrong = proof.wrong + wrong_old + len(proof.failed_checks) + len(problems)
    result.details = {"date": old.isoformat(), "late_records": dict(Counter(r.kind for r in late)),
                      "sensor_runs": sensor_runs, "cursors": [base.cursor, second.cursor,
                                                              third.cursor],
                      "dates": [str(d) for d in proof.dates],
                      "windows_checked": proof.windows_checked,
                      "proof_failures": proof.failed_checks, "notes": proof.notes,
                      "problems": problems}
    result.passed = (not problems and proof.ok and result.lost == 0 and result.duplicated == 0
                     and len(sensor_runs) == 1)
    return result
