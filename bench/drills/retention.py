"""Drill 5, retention: the topic is cut (retention.ms=1 s) under a date that was ingested and
proven; then a fresh instance starts on the cut topic.

Verified: before the cut the date is proven; after it `verify_dates` fails and the proof
(`assets.reconcile.checks.prove_dates`) reports the date incomplete with the missing offset ranges per
partition (from 0 to the new log start); `correct_dates` still works from bronze and gold still
equals the plain-Python count; the fresh instance (which sees the same truncated log on both
sides) is reported incomplete ("retention cut the log"), never proven.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    check_landing,
    instance,
    produce_acked,
    prove,
    run_job,
    say,
    step_failures,
)
from testkit.reference import expected_windows, table_windows

NAME = "retention"


def _set_retention(settings, retention_ms: int, segment_ms: int | None = None) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from lakehouse.kafka.admin import admin

    entries = [ConfigEntry("retention.ms", str(retention_ms),
                           incremental_operation=AlterConfigOpType.SET)]
    if segment_ms is not None:
        entries.append(ConfigEntry("segment.ms", str(segment_ms),
                                   incremental_operation=AlterConfigOpType.SET))
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic,
                              incremental_configs=entries)
    admin(settings).incremental_alter_configs([resource])[resource].result(30)


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from assets.reconcile.checks import prove_dates
    from lakehouse.kafka.admin import topic_offsets
    from lakehouse.tables.reads import read
    from testkit.generator import GeneratorConfig, generate

    spark = ctx.spark()
    problems: list[str] = []
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=ctx.n(20_000, 600), seed=ctx.seed + 7, end=end,
                                       span=timedelta(minutes=30), keys=4, late_fraction=0,
                                       duplicate_fraction=0.02, malformed_fraction=0.01)).records
    with instance(ctx, "retention") as settings:
        dagster_instance = DagsterInstance.ephemeral()
        produce_acked(settings, records)
        run_result, _ = run_job("stream_catch_up", dagster_instance)
        result.runs += 1
        if not run_result.success:
            raise DrillFailed(f"catch-up failed: {step_failures(run_result)}")
        landing = check_landing(settings)
        proof = prove(settings, dagster_instance, records, NAME)
        result.runs += len(proof.dates)
        if not proof.ok:
            problems.append(f"not proven before the cut: {proof.failed_checks} {proof.notes}")
        d = proof.dates[-1]
        say(NAME, f"{len(records)} records ingested ({landing.describe()}); {d} proven")

        _set_retention(settings, 1000, 500)
        result.faults_injected += 1
        t0 = time.monotonic()
        deadline = t0 + 120
        while time.monotonic() < deadline:
            offsets = topic_offsets(settings)
            if all(p.earliest > 0 for p in offsets if p.latest > 0):
                break
            time.sleep(2)
        else:
            raise DrillFailed("retention did not delete the topic's records within 120 s")
        cut = {p.partition: (p.earliest, p.latest) for p in offsets}
        say(NAME, f"retention.ms=1000: log start per partition now {cut} after "
                  f"{time.monotonic() - t0:.0f}s")

        run_result, _ = run_job("verify_dates", dagster_instance, partition_key=d.isoformat())
        result.runs += 1
        why = step_failures(run_result)
        check = prove_dates(spark, settings, [d])
        missing = (check.metadata.get("incomplete").value.get(d.isoformat(), {})
                   .get("missing_offsets", {}) if check.metadata.get("incomplete") else {})
        want_missing = {p: (0, lo) for p, (lo, hi) in cut.items() if hi > 0 and lo > 0}
        got_missing = {int(p): (m["first_missing"], m["log_start"]) for p, m in missing.items()}
        outcome = "FAILED as it must" if not run_result.success else "PASSED (wrong)"
        say(NAME, f"verify_dates after the cut: {outcome} ({why[:200]!r}); the check reports "
                  f"missing offsets {got_missing} (expected {want_missing}); check passed: "
                  f"{check.passed}")
        if run_result.success or "incomplete" not in why:
            problems.append(f"verify_dates on a cut log did not fail as incomplete: {why[:300]}")
        if check.passed or got_missing != want_missing:
            problems.append(f"the check's missing ranges {got_missing} != {want_missing}")

        run_result, _ = run_job("correct_dates", dagster_instance, partition_key=d.isoformat())
        result.runs += 1
        want = expected_windows(records)
        got = table_windows(read(settings, "reconciled_aggregates"))
        differing = sum(1 for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        say(NAME, f"correct_dates after the cut (from bronze): "
                  f"{'succeeded' if run_result.success else 'FAILED'}; gold vs reference: "
                  f"{differing} windows differ")
        if not run_result.success:
            problems.append(f"corrections failed after the cut: {step_failures(run_result)}")
        _set_retention(settings, 14 * 86400 * 1000)
        topic = settings.events_topic

    with instance(ctx, "retention-fresh", topic=topic) as fresh:
        more = generate(GeneratorConfig(count=50, seed=ctx.seed + 8,
                                        end=datetime.now(UTC) - timedelta(minutes=2),
                                        span=timedelta(minutes=5), keys=2, late_fraction=0,
                                        duplicate_fraction=0, malformed_fraction=0)).records
        produce_acked(fresh, more)
        dagster_instance = DagsterInstance.ephemeral()
        run_result, _ = run_job("stream_catch_up", dagster_instance)
        result.runs += 1
        today = max(d, datetime.now(UTC).date())
        run_result, _ = run_job("reconcile_dates", dagster_instance,
                                partition_key=today.isoformat())
        result.runs += 1
        result.faults_injected += 1
        why = step_failures(run_result)
        say(NAME, f"fresh instance on the cut topic: reconcile_dates {today} "
                  f"{'FAILED as it must' if not run_result.success else 'PASSED (wrong)'}: "
                  f"{why[:200]!r}")
        if run_result.success or "retention cut the log" not in why:
            problems.append(f"a fresh instance on a cut topic was not reported incomplete: "
                            f"{why[:300]}")

    result.records_checked = landing.checked
    result.lost = landing.lost
    result.duplicated = landing.duplicated
    result.wrong = differing + len(problems)
    result.details = {"cut": {str(p): v for p, v in cut.items()}, "problems": problems,
                      "missing_reported": {str(p): v for p, v in got_missing.items()}}
    result.passed = not problems and differing == 0 and landing.lost == 0 \
        and landing.duplicated == 0
    return result
