"""End to end on the real broker, through Dagster: records produced in chunks with a stream
catch-up after each, corrections published mid-way, then every date reconciled and proven equal
to the replay; every table asserted against the independent reference model."""

from collections import Counter
from datetime import UTC, datetime, time, timedelta

import pytest
from dagster import DagsterInstance
from reference import Expected

from lakehouse.generator import GeneratorConfig, generate, produce
from lakehouse.summary import compare_tables, read
from orchestration.definitions import defs


def run_job(name, instance, **kw):
    result = defs.get_job_def(name).execute_in_process(instance=instance, raise_on_error=False,
                                                       **kw)
    checks = [e.asset_check_evaluation_data for e in result.all_events
              if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return result, checks


def naive_utc(t):
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


def window_rows(table):
    """Rows keyed by (window_start as naive UTC, key), like the reference model."""
    return {(naive_utc(r["window_start"]), r["key"]): r for r in table.to_pylist()}


def measures(r):
    return (r["event_count"], r["value_sum"], r["value_min"], r["value_max"])


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, kafka_bootstrap, spark):
    """Run the scenario once; the tests below assert different tables of it."""
    import os
    import uuid

    from lakehouse.settings import Settings

    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "EVENTS_TOPIC": f"e2e-{uuid.uuid4().hex[:8]}",
        "LAKEHOUSE_ROOT": str(tmp_path_factory.mktemp("e2e") / "lakehouse"),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        settings = Settings.from_env()
        now = datetime.now(UTC).replace(second=0, microsecond=0)
        midnight = datetime.combine(now.date(), time.min, tzinfo=UTC)
        end = min(now - timedelta(minutes=10), midnight + timedelta(hours=2))  # spans midnight
        cfg = GeneratorConfig(count=4000, seed=11, end=end, span=timedelta(hours=6), keys=8,
                              late_fraction=0.05, duplicate_fraction=0.04,
                              malformed_fraction=0.02)
        records = generate(cfg).records
        third = len(records) // 3
        chunks = [records[:third], records[third:2 * third], records[2 * third:]]
        expected = Expected.of(chunks)
        dates = sorted({r.time.date() for r in expected.rows})
        instance = DagsterInstance.ephemeral()
        outcomes = {}
        for i, chunk in enumerate(chunks):
            produce(settings, chunk)
            result, _ = run_job("stream_catch_up", instance)
            assert result.success, f"catch-up {i} failed"
            if i == 1:  # publish the first date before the last chunk: it gets corrected
                result, checks = run_job("reconcile_dates", instance,
                                         partition_key=dates[0].isoformat())
                outcomes["mid"] = (result.success, [c.passed for c in checks])
        for d in dates:
            result, checks = run_job("reconcile_dates", instance, partition_key=d.isoformat())
            outcomes[d] = (result.success, [c.passed for c in checks])
        yield settings, expected, dates, outcomes, chunks
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_scenario_covers_two_dates_late_duplicates_and_malformed(scenario):
    _, expected, dates, _, _ = scenario
    assert len(dates) == 2
    assert len(expected.late) > 5
    assert sum(expected.malformed.values()) > 10
    assert len(expected.rows) > len(expected.reconciled())  # duplicates present


def test_bronze_holds_every_valid_record_once_and_quarantine_the_rest(scenario):
    settings, expected, _, _, chunks = scenario
    bronze = read(settings, "bronze_events")
    positions = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(),
                         strict=True))
    assert bronze.num_rows == len(expected.rows)
    assert len(set(positions)) == len(positions)
    quarantine = read(settings, "quarantined_events")
    assert Counter(quarantine["reason"].to_pylist()) == expected.malformed
    all_positions = positions + list(zip(quarantine["partition"].to_pylist(),
                                         quarantine["offset"].to_pylist(), strict=True))
    assert len(set(all_positions)) == sum(len(c) for c in chunks)  # every record accounted for


def test_late_lane_is_exactly_the_set_the_fast_path_dropped(scenario):
    settings, expected, _, _, _ = scenario
    late = read(settings, "late_events")
    assert Counter(late["event_id"].to_pylist()) == Counter(r.event_id for r in expected.late)
    progress = read(settings, "stream_progress").to_pylist()
    dropped = sum(p["rows_dropped_by_watermark"] for p in progress if p["query"] == "aggregates")
    assert dropped == late.num_rows  # Spark's own count agrees with the lane


def test_streaming_aggregates_equal_expected_minus_late_for_closed_windows(scenario):
    settings, expected, _, _, _ = scenario
    got = window_rows(read(settings, "streaming_aggregates"))
    want = expected.streaming()
    final_wm = expected.final_watermark.replace(tzinfo=None)
    closed = {k for k in want if k[0] + timedelta(minutes=1) <= final_wm}
    assert closed
    for k in closed:
        assert measures(got[k]) == want[k], k
        assert got[k]["status"] == "final"
    assert set(got) == set(want)


def test_reconciled_equals_reference_and_replay_and_the_gx_check_passed(scenario):
    settings, expected, dates, outcomes, _ = scenario
    want = expected.reconciled()
    got = window_rows(read(settings, "reconciled_aggregates"))
    assert {k: measures(r) for k, r in got.items()} == want
    for d in dates:
        assert outcomes[d] == (True, [True]), d
        assert compare_tables(settings, d) == 0
    replay = window_rows(read(settings, "replay_aggregates"))
    assert {k: measures(r) for k, r in replay.items()} == want


def test_mid_way_publication_was_corrected_with_revisions_and_changelog(scenario):
    settings, expected, dates, outcomes, _ = scenario
    assert outcomes["mid"] == (True, [True])
    # Windows of the first date that were final when first published (after chunk 2) and
    # whose counted events changed with chunk 3.
    wm2 = max(r.time for r in expected.rows if r.chunk <= 1) - timedelta(seconds=30)
    before, after = expected.reconciled(upto_chunk=1), expected.reconciled()
    corrected = {
        k for k in after
        if k[0].date() == dates[0] and k[0] + timedelta(minutes=1) <= wm2.replace(tzinfo=None)
        and before.get(k) != after[k] and k in before
    }
    assert corrected, "the scenario should correct some published windows"
    changelog = read(settings, "late_corrections").to_pylist()
    assert {(naive_utc(c["window_start"]), c["key"]) for c in changelog} == corrected
    gold = window_rows(read(settings, "reconciled_aggregates"))
    late_windows = {(r.time.replace(tzinfo=None, second=0, microsecond=0), r.key)
                    for r in expected.late}
    for c in changelog:
        k = (naive_utc(c["window_start"]), c["key"])
        assert c["revision"] == 1 and gold[k]["revision"] == 1
        assert gold[k]["status"] == "corrected"
        assert (c["before_event_count"], c["before_value_sum"]) == before[k][:2]
        assert (c["after_event_count"], c["after_value_sum"]) == after[k][:2]
        assert c["cause"] == ("late_event" if k in late_windows else "reprocess")
        assert c["run_id"]
    untouched = [r for k, r in gold.items() if k not in corrected]
    assert all(r["revision"] == 0 for r in untouched)
