"""The proof and its failure modes, on instances of their own and the real broker: tampering
with gold or bronze is caught by the blocking GX check (naming the window) and repaired by
corrections or a reprocess; reruns change nothing; corrections are read incrementally through
the Change Data Feed; a replay of a log that retention has cut fails loudly, and a fresh
instance on a cut topic is reported incomplete, never proven.

Each test starts from a reconciled, proven date (the `published` fixture reconciles it again
after a test that changed it), so the tests pass in any order."""

import time as clock
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import pipeline_env, publish_instance, run_job
from dagster import DagsterInstance
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from assets.reconcile.checks import prove_dates
from lakehouse.config.settings import utc
from lakehouse.kafka.admin import admin, topic_offsets
from lakehouse.tables.reads import compare_tables, read


@pytest.fixture(scope="module")
def instance_of_module(tmp_path_factory, kafka_bootstrap, spark):
    """A published instance of this module's own: one date, duplicates and malformed records
    in one catch-up (the tests add late events of their own)."""
    from testkit.generator import GeneratorConfig, end_within_one_date

    with pipeline_env(tmp_path_factory.mktemp("recon"), kafka_bootstrap, "recon") as settings:
        # One date (yesterday's last hours in the first of today's), all past.
        end = end_within_one_date(datetime.now(UTC).replace(second=0, microsecond=0),
                                  timedelta(hours=2))
        cfg = GeneratorConfig(count=1500, seed=23, end=end, span=timedelta(hours=2), keys=6,
                              late_fraction=0.05, duplicate_fraction=0.04,
                              malformed_fraction=0.02)
        instance = DagsterInstance.ephemeral()
        _, dates = publish_instance(settings, cfg, 1, instance)
        yield settings, instance, dates[-1]


class Published:
    """The module's instance, its date reconciled and proven. A test that leaves it so says
    `proven()`; otherwise its own teardown reconciles the date again (a repair that fails is
    that test's error, not the next one's)."""

    def __init__(self, settings, instance, d):
        self.settings, self.instance, self.d = settings, instance, d
        self.left_proven = False

    def __iter__(self):
        return iter((self.settings, self.instance, self.d))

    def proven(self) -> None:
        self.left_proven = True


@pytest.fixture()
def published(instance_of_module):
    state = Published(*instance_of_module)
    yield state
    if not state.left_proven:
        result, checks = run_job("reconcile_dates", state.instance,
                                 partition_key=state.d.isoformat())
        assert result.success and reconciliation_check(checks).passed, \
            "the date could not be reconciled and proven again after this test"


def past_time_of(d, at):
    """`at` on date `d`, or two minutes ago if that is earlier (future event times are
    quarantined, and the module's date may be today)."""
    return min(datetime.combine(d, at, tzinfo=UTC),
               datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2))


def gold_version(spark, settings) -> int:
    return DeltaTable.forPath(spark, settings.table_path("reconciled_aggregates")).history(1) \
        .first().version


def gold_metadata(result):
    return next(m.metadata for m in result.asset_materializations_for_node("corrections")
                if m.asset_key.to_user_string() == "reconciled_aggregates")


def reconciliation_check(checks):
    return next(c for c in checks if c.check_name == "reconciled_equals_replay")


def one_window(spark, settings, d):
    """A gold window of `d` without late events: a correction of a window with late events is
    attributed to them (`late_event`), whichever test of the module put them there."""
    late = spark.read.format("delta").load(settings.table_path("late_events"))
    return (spark.read.format("delta").load(settings.table_path("reconciled_aggregates"))
            .where(F.col("event_date") == F.lit(d))
            .join(late.select("window_start", "key"), ["window_start", "key"], "left_anti")
            .orderBy("window_start", "key").first())


def test_rerunning_corrections_or_reprocessing_a_correct_date_changes_nothing(published, spark):
    settings, instance, d = published
    version = gold_version(spark, settings)
    changelog = read(settings, "late_corrections").num_rows
    for job in ("reconcile_dates", "reprocess_dates"):
        result, checks = run_job(job, instance, partition_key=d.isoformat())
        assert result.success and reconciliation_check(checks).passed, job
        meta = gold_metadata(result)
        assert meta["windows_corrected"].value == 0 and meta["windows_inserted"].value == 0
        if job == "reconcile_dates":  # no new data, the same watermark: nothing read again
            assert meta["windows_recomputed"].value == 0
            stages = meta["seconds_by_stage"].value[d.isoformat()]
            assert {"plan", "scope", "recompute", "state", "totals"} <= set(stages)
            assert meta["duration_s"].value >= sum(stages.values()) - 0.1
    assert gold_version(spark, settings) == version  # not one commit to gold
    assert read(settings, "late_corrections").num_rows == changelog
    published.proven()  # left reconciled and proven


def test_tampered_gold_row_fails_the_check_naming_the_window_and_corrections_repair_it(
        published, spark):
    settings, instance, d = published
    target = one_window(spark, settings, d)
    path = settings.table_path("reconciled_aggregates")
    DeltaTable.forPath(spark, path).update(
        condition=(F.col("window_start") == F.lit(target.window_start))
        & (F.col("key") == F.lit(target.key)),
        set={"value_sum": F.col("value_sum") + F.lit(1)},
    )
    result, checks = run_job("verify_dates", instance, partition_key=d.isoformat())
    check = reconciliation_check(checks)
    assert not check.passed and not result.success  # blocking
    evidence = check.metadata["differing_windows"].value[d.isoformat()]
    assert [(w["key"], w["reconciled_value_sum"], w["replay_value_sum"]) for w in evidence] == [
        (target.key, str(target.value_sum + 1), str(target.value_sum))]
    assert check.metadata["failed_expectations"].value[d.isoformat()] == [
        "reconciled_value_sum == replay_value_sum", "totals: reconciled_value_sum == replay_value_sum"]
    # GX's Data Docs page of the failing validation, linked from the check, names the window.
    page = check.metadata["data_docs"].value
    assert page.startswith("file://") and "/reports/quality/" in page
    html = Path(page.removeprefix("file://")).read_text()
    assert "reconciled_value_sum" in html and target.key in html
    assert utc(target.window_start).strftime("%Y-%m-%dT%H:%M:%SZ") in html  # in UTC
    before = gold_version(spark, settings)

    result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
    assert result.success and reconciliation_check(checks).passed
    assert compare_tables(settings, d) == 0
    meta = gold_metadata(result)
    assert "changed outside the pipeline" in meta["modes"].value[d.isoformat()]
    # Downstream consumers see the repair incrementally in the Change Data Feed.
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", before + 1).load(path)
               .where(F.col("key") == target.key)
               .where(F.col("window_start") == F.lit(target.window_start)).collect())
    by_type = {c._change_type: c for c in changes}
    assert set(by_type) == {"update_preimage", "update_postimage"}
    assert by_type["update_postimage"].revision == by_type["update_preimage"].revision + 1
    assert by_type["update_postimage"].value_sum == target.value_sum
    assert by_type["update_postimage"].status == "corrected"
    log = [c for c in read(settings, "late_corrections").to_pylist() if c["key"] == target.key
           and c["window_start"] == utc(target.window_start)
           and c["revision"] == by_type["update_postimage"].revision]
    assert len(log) == 1 and log[0]["cause"] == "reprocess"
    assert log[0]["before_value_sum"] == target.value_sum + 1
    assert log[0]["after_value_sum"] == target.value_sum
    published.proven()  # left reconciled and proven


def test_tampered_bronze_record_fails_the_check_and_reprocessing_the_date_repairs_it(
        published, spark):
    settings, instance, d = published
    bronze = DeltaTable.forPath(spark, settings.table_path("bronze_events"))
    rows = bronze.toDF().where(F.col("event_date") == F.lit(d))
    single = rows.groupBy("event_id").count().where("count = 1").select("event_id")
    victim = rows.join(single, "event_id").orderBy("partition", "offset").first()  # counted
    bronze.update(condition=(F.col("partition") == victim.partition)
                  & (F.col("offset") == victim.offset),
                  set={"value": F.col("value") + F.lit(100)})
    try:
        result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
        check = reconciliation_check(checks)
        assert not check.passed and not result.success
        evidence = check.metadata["differing_windows"].value[d.isoformat()]
        assert len(evidence) == 1 and evidence[0]["key"] == victim.key
        assert evidence[0]["window_start"].startswith(
            str(utc(victim.event_time).replace(second=0, microsecond=0)))

        result, checks = run_job("reprocess_dates", instance, partition_key=d.isoformat())
        assert result.success and reconciliation_check(checks).passed
        assert compare_tables(settings, d) == 0
        last = max(read(settings, "late_corrections").to_pylist(), key=lambda c: c["corrected_at"])
        assert last["cause"] == "reprocess" and last["key"] == victim.key
    finally:
        bronze.update(condition=(F.col("partition") == victim.partition)
                      & (F.col("offset") == victim.offset),
                      set={"value": F.lit(victim.value)})


def test_records_arriving_after_a_corrections_run_wait_for_the_next_one_and_two_at_once_serialize(
        published, spark):
    """The replay reads the log prefix the gold rows were computed from (a bronze version's
    stamped Kafka offsets), so new records of the date never race the blocking check; a replay
    of another prefix than gold's fails the check naming both. Two corrections of the date
    started together then (a sensor run and a schedule run, say): the per-date lock makes one
    wait for the other, no revision is logged twice, and gold equals the replay afterwards."""
    import threading
    from collections import Counter
    from datetime import time, timedelta

    from lakehouse.tables import delta_log
    from lakehouse.tables.catalog import BRONZE
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from testkit.generator import GeneratorConfig, generate, produce

    settings, instance, d = published
    events_before = sum(read(settings, "reconciled_aggregates", d)["event_count"].to_pylist())
    gold_state = max(read(settings, "corrections_state", d).to_pylist(),
                     key=lambda r: r["updated_at"])["bronze_version"]
    quiet = {"malformed_fraction": 0, "duplicate_fraction": 0, "late_fraction": 0}
    new = generate(GeneratorConfig(count=30, seed=404, end=past_time_of(d, time(23, 0)),
                                   span=timedelta(minutes=20), **quiet)).records
    first = min(read(settings, "reconciled_aggregates", d)["window_start"].to_pylist())
    late = generate(GeneratorConfig(  # behind the watermark: late, into published windows
        count=40, seed=88, end=first.astimezone(UTC) + timedelta(minutes=30), keys=6,
        span=timedelta(minutes=30), **quiet)).records
    produce(settings, new + late)

    def verify():
        result, checks = run_job("verify_dates", instance, partition_key=d.isoformat())
        replay = next(m.metadata for m in result.asset_materializations_for_node(
            "replay_aggregates"))["per_date"].value[0]
        return result, reconciliation_check(checks), replay

    # Not ingested yet: before this fix the replay read them and the proof failed.
    result, check, replay = verify()
    assert result.success and check.passed, check.metadata["differing_windows"].value
    assert replay["as_of_bronze_version"] == gold_state
    # A change commit on bronze (a repair that rewrites a row): the stream skips it, not dies.
    bronze = DeltaTable.forPath(spark, settings.table_path("bronze_events"))
    row = bronze.toDF().orderBy("partition", "offset").select("partition", "offset").first()
    bronze.update(condition=(F.col("partition") == row.partition) & (F.col("offset") == row.offset),
                  set={"value": F.col("value")})
    assert bronze.history(1).first().operation == "UPDATE"
    # Ingested into bronze, not yet corrected: gold's position still decides.
    result, _ = run_job("stream_catch_up", instance)
    assert result.success
    result, check, replay = verify()
    assert result.success and check.passed and replay["as_of_bronze_version"] == gold_state

    # A replay of a newer log prefix than gold's (by hand, outside a run): the proof compares
    # gold and a replay of the same prefix, or fails naming both positions.
    newest = delta_log.version(settings, BRONZE.name)
    run_replay(spark, settings, d, as_of=newest, run_id="by-hand")
    check = prove_dates(spark, settings, [d])
    positions = check.metadata["log_positions"].value[d.isoformat()]
    assert not check.passed and "different log positions" in check.description
    assert positions["replay_up_to_bronze_version"] == newest
    assert positions["reconciled_from_bronze_version"] == gold_state < newest
    assert positions["replayed_by_run"] == "by-hand"

    # Two corrections runs of the date at once: one waits, and finds the work done.
    results, errors = {}, []

    def correct(name):
        try:
            results[name] = run_corrections(spark, settings, d, run_id=name)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=correct, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors and len(results) == 2
    changed = sorted(r.corrected + r.inserted for r in results.values())
    assert changed[0] == 0 and changed[1] > 0
    log = read(settings, "late_corrections", d).to_pylist()
    revisions = Counter((c["window_start"], c["key"], c["revision"]) for c in log)
    assert max(revisions.values()) == 1  # no revision logged twice

    result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
    check = reconciliation_check(checks)
    assert result.success and check.passed
    assert gold_metadata(result)["windows_corrected"].value == 0  # nothing left to correct
    positions = check.metadata["log_positions"].value[d.isoformat()]
    assert positions["reconciled_from_bronze_version"] == positions["replay_up_to_bronze_version"]
    assert positions["reconciled_from_bronze_version"] > gold_state
    events_after = sum(read(settings, "reconciled_aggregates", d)["event_count"].to_pylist())
    assert events_after - events_before == len(new) + len(late)  # every new event applied, once
    assert compare_tables(settings, d) == 0
    assert_the_feed_folds_to_gold(settings, result)
    published.proven()  # left reconciled and proven


def assert_the_feed_folds_to_gold(settings, result) -> None:
    """The run's feed step published gold's newest version; a `read_committed` fold of the topic
    (every run of the module so far: corrections, repairs, reprocesses) holds exactly gold's
    closed windows, each window's revisions come in order, once each, and those past 0 are the
    ones its changelog logged."""
    from lakehouse.tables import delta_log
    from testkit.feed import committed_messages, fold, window_of

    feed = next(m.metadata for m in result.asset_materializations_for_node("reconciled_feed"))
    assert feed["published_version"].value == delta_log.version(settings, "reconciled_aggregates")
    messages = committed_messages(settings, settings.feed_topic)

    def iso(t):
        return t.astimezone(UTC).isoformat().replace("+00:00", "Z")

    gold = {window_of({"window_start": iso(r["window_start"]), "key": r["key"]}): r
            for r in read(settings, "reconciled_aggregates").to_pylist() if r["status"] != "open"}
    folded = fold(messages)
    assert set(folded) == set(gold)
    for k, v in folded.items():
        g = gold[k]
        assert (v["event_count"], v["value_sum"], v["revision"], v["status"]) == (
            g["event_count"], str(g["value_sum"]), g["revision"], g["status"]), k
    sent: dict[str, list[int]] = {}
    for key, value in messages:
        if value is not None:
            sent.setdefault(window_of(key), []).append(value["revision"])
    assert all(r == sorted(set(r)) for r in sent.values()), sent  # in order, once each
    logged = {(window_of({"window_start": iso(c["window_start"]), "key": c["key"]}), c["revision"])
              for c in read(settings, "late_corrections").to_pylist()
              if c["after_event_count"] is not None}
    assert {(k, r) for k, rs in sent.items() for r in rs if r > 0} == logged


def test_a_topic_cut_by_retention_is_reported_incomplete_never_proven(
        tmp_path, kafka_bootstrap, spark):
    """Retention cuts an ingested date: the replay fails naming the lost offsets, corrections
    still work from bronze, and a fresh instance on the cut topic (which sees the same truncated
    log on both sides) is reported incomplete instead of passing."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from testkit.generator import GeneratorConfig

    with pipeline_env(tmp_path / "a", kafka_bootstrap, "cut") as settings:
        instance = DagsterInstance.ephemeral()
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        cfg = GeneratorConfig(count=300, seed=5, end=end, span=timedelta(minutes=30), keys=3,
                              late_fraction=0, duplicate_fraction=0, malformed_fraction=0)
        _, dates = publish_instance(settings, cfg, 1, instance)
        d = dates[-1]
        client = admin(settings)
        resource = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic,
                                  incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.ms", "500", incremental_operation=AlterConfigOpType.SET),
        ])
        client.incremental_alter_configs([resource])[resource].result(30)
        deadline = clock.monotonic() + 90
        while clock.monotonic() < deadline:
            if all(p.earliest > 0 for p in topic_offsets(settings) if p.latest > 0):
                break
            clock.sleep(2)
        else:
            pytest.fail("retention did not delete the topic's records within 90 s")

        result, _ = run_job("verify_dates", instance, partition_key=d.isoformat())
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert "incomplete" in str(failure.event_specific_data)
        check = prove_dates(spark, settings, [d])  # the check's body; the replay step failed
        assert not check.passed  # the old replay rows still match, but the log cannot prove them
        missing = check.metadata["incomplete"].value[d.isoformat()]["missing_offsets"]
        # Lost from the date's first offset in bronze (0, or later past midnight: the partition
        # starts with the date before).
        assert missing and all(m["log_start"] > m["first_missing"] >= 0
                               for m in missing.values())
        result, _ = run_job("correct_dates", instance, partition_key=d.isoformat())
        assert result.success  # corrections work from bronze
        keep = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic,
                              incremental_configs=[ConfigEntry(
                                  "retention.ms", str(14 * 86400 * 1000),
                                  incremental_operation=AlterConfigOpType.SET)])
        client.incremental_alter_configs([keep])[keep].result(30)

    # Produce a little more, then a fresh instance on the cut topic: it starts at the earliest
    # retained offset and sees only what is left.
    with pipeline_env(tmp_path / "b", kafka_bootstrap, "cut", settings.events_topic) as fresh:
        from testkit.generator import generate, produce

        produce(fresh, generate(GeneratorConfig(
            count=50, seed=6, end=datetime.now(UTC) - timedelta(minutes=2),
            span=timedelta(minutes=5), keys=2, late_fraction=0, duplicate_fraction=0,
            malformed_fraction=0)).records)
        instance = DagsterInstance.ephemeral()
        result, _ = run_job("stream_catch_up", instance)
        assert result.success
        today = max(dates[-1], datetime.now(UTC).date())
        result, checks = run_job("reconcile_dates", instance, partition_key=today.isoformat())
        assert not result.success  # never proven on a cut log
        why = str([e.event_specific_data for e in result.all_events
                   if e.event_type_value == "STEP_FAILURE"])
        assert "retention cut the log" in why


def test_the_scorecard_reports_seven_rows_with_evidence_and_names_what_is_missing(
        published, monkeypatch):
    """`make scorecard`'s job on the module's proven instance: the seven rows, each an asset
    check with its evidence; governance fails until the deployment names an owner, and says so."""
    import json

    from lakehouse.config import storage

    settings, instance, d = published
    published.proven()  # the scorecard writes no table

    def scorecard():
        result, checks = run_job("report_scorecard", instance)
        assert result.success
        return {c.check_name: c for c in checks}

    checks = scorecard()
    assert set(checks) == {"timestamp", "lateness", "replay", "scaling", "cost", "governance",
                           "observability"}
    assert checks["replay"].passed  # the module's date is proven
    assert checks["replay"].metadata["evidence"].value["differing_windows_by_date"] == {
        d.isoformat(): 0}
    assert checks["timestamp"].passed and checks["lateness"].passed
    cost = checks["cost"].metadata["evidence"].value["last_replay_cost"]
    assert checks["cost"].passed and cost["kafka_records_fetched"] > 0 and cost["jvm_cpu_s"] > 0
    assert checks["observability"].passed  # alert rules with runbook sections, the feed at gold
    assert not checks["governance"].passed and "PIPELINE_OWNER" in checks["governance"].description
    report = json.loads(storage.read_text(settings.path("reports", "scorecard.json")))
    assert [r["name"] for r in report["rows"]] == list(checks)
    assert "Readiness scorecard" in storage.read_text(settings.path("reports", "scorecard.html"))

    monkeypatch.setenv("PIPELINE_OWNER", "team-billing")
    checks = scorecard()
    assert checks["governance"].passed
    assert checks["governance"].metadata["evidence"].value["owner"] == "team-billing"
