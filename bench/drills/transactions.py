"""Drill: transactional input. A transactional producer aborts 10% of its transactions.

Verified: bronze holds exactly the committed records (no aborted one, none missing); the dates
are proven (gold == replay == the plain-Python count of the committed records); and the proof
is not blind to them: a verification whose replay reads uncommitted records
(KAFKA_ISOLATION_LEVEL=read_uncommitted) fails.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    instance,
    prove,
    run_job,
    say,
    step_failures,
)

NAME = "transactions"
PER_TRANSACTION = 50


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from confluent_kafka import Producer
    from dagster import DagsterInstance

    from lakehouse.config.env import overridden
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.tables.reads import read
    from testkit.generator import GeneratorConfig, generate

    ctx.spark()
    problems: list[str] = []
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=ctx.n(20_000, 1_000), seed=ctx.seed + 11, end=end,
                                       span=timedelta(minutes=30), keys=4, late_fraction=0,
                                       duplicate_fraction=0, malformed_fraction=0)).records
    with instance(ctx, NAME) as settings:
        ensure_topic(settings)
        producer = Producer({**settings.client_config,
                             "transactional.id": f"drill-{settings.events_topic}"})
        producer.init_transactions(30)
        committed, aborted = [], []
        for n, start in enumerate(range(0, len(records), PER_TRANSACTION)):
            chunk = records[start:start + PER_TRANSACTION]
            producer.begin_transaction()
            for r in chunk:
                producer.produce(settings.events_topic, key=r.key, value=r.value)
            # Delivered before the commit or abort: librdkafka purges an aborted transaction's
            # undelivered records instead of writing them, and then there is nothing to skip.
            producer.flush(30)
            if n % 10 == 9:
                producer.abort_transaction(30)
                aborted += chunk
            else:
                producer.commit_transaction(30)
                committed += chunk
        result.faults_injected = len(aborted) // PER_TRANSACTION
        say(NAME, f"{len(committed)} records committed, {len(aborted)} aborted in "
                  f"{result.faults_injected} transactions")

        dagster_instance = DagsterInstance.ephemeral()
        run_result, _ = run_job("stream_catch_up", dagster_instance)
        result.runs += 1
        if not run_result.success:
            raise DrillFailed(f"catch-up failed: {step_failures(run_result)}")
        ids = read(settings, "bronze_events")["event_id"].to_pylist()
        want = {json.loads(r.value)["event_id"] for r in committed}
        gone = {json.loads(r.value)["event_id"] for r in aborted}
        landed_aborted = len(gone & set(ids))
        missing = len(want - set(ids))
        duplicated = len(ids) - len(set(ids))
        say(NAME, f"bronze: {len(ids)} rows; aborted records in it: {landed_aborted}; committed "
                  f"missing: {missing}; duplicated: {duplicated}")
        if landed_aborted or missing or duplicated:
            problems.append(f"bronze: {landed_aborted} aborted in, {missing} committed missing, "
                            f"{duplicated} duplicated")

        proof = prove(settings, dagster_instance, committed, NAME)
        result.runs += len(proof.dates)
        if not proof.ok:
            problems.append(f"not proven: {proof.failed_checks} {proof.notes}")

        # The proof must see aborted records if a side counted them: a replay reading
        # uncommitted records disagrees with gold.
        d = proof.dates[-1]
        with overridden({"KAFKA_ISOLATION_LEVEL": "read_uncommitted"}):
            blind, checks = run_job("verify_dates", dagster_instance, partition_key=d.isoformat())
        result.runs += 1
        failed = [c.check_name for c in checks if not c.passed]
        say(NAME, f"verify_dates {d} with a replay reading uncommitted records: "
                  f"{'FAILED as it must' if failed or not blind.success else 'PASSED (wrong)'} "
                  f"{failed}")
        if blind.success and not failed:
            problems.append("a replay counting aborted records still proved the date")

    result.records_checked = len(records)
    result.lost = missing
    result.duplicated = duplicated + landed_aborted
    result.wrong = proof.wrong + len(problems)
    result.details = {"committed": len(committed), "aborted": len(aborted), "problems": problems}
    result.passed = not problems and proof.ok
    return result
