"""End to end on the real broker, through Dagster: records produced in chunks with a stream
catch-up after each, corrections published mid-way, then every date reconciled and proven equal
to the replay; every table asserted against the independent reference model. The scenario is
the session fixture `scenario` (conftest.py); test_reconciliation.py tampers with an instance
of its own."""

from collections import Counter
from datetime import UTC, timedelta
from decimal import Decimal

from lakehouse.tables.reads import compare_tables, read


def naive_utc(t):
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


def window_rows(table):
    """Rows keyed by (window_start as naive UTC, key), like the reference model."""
    return {(naive_utc(r["window_start"]), r["key"]): r for r in table.to_pylist()}


def measures(r):
    return (r["event_count"], r["value_sum"], r["value_min"], r["value_max"])


def test_scenario_covers_two_dates_late_duplicates_and_malformed(scenario):
    _, expected, dates, _, _ = scenario
    assert len(dates) == 2
    assert len(expected.late) > 5
    assert sum(expected.malformed.values()) > 10
    assert len(expected.rows) > len(expected.reconciled())  # duplicates present


def passed(outcome):
    success, checks = outcome
    return success, {name: c.passed for name, c in checks.items()}


BOTH_PASS = (True, {"reconciled_equals_replay": True, "fast_path_vs_replay": True})


def test_late_events_hours_late_cross_midnight_into_the_next_date(scenario):
    settings, _, dates, _, _ = scenario
    bronze = read(settings, "bronze_events").to_pylist()
    first_of_next_date = {}
    for r in bronze:
        if r["event_date"] == dates[1]:
            p = r["partition"]
            first_of_next_date[p] = min(first_of_next_date.get(p, r["offset"]), r["offset"])
    late = read(settings, "late_events").to_pylist()
    crossing = [r for r in late if r["event_date"] == dates[0]
                and r["offset"] > first_of_next_date.get(r["partition"], r["offset"])]
    assert crossing, "some events of the first date must arrive after events of the next date"
    assert max(r["lateness_ms"] for r in crossing) > 3600 * 1000  # hours late


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
    dropped = sum(p["rows_dropped_by_watermark"] for p in progress if p["query"] == "ingest")
    assert dropped == late.num_rows  # the batches' own counts agree with the lane


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
    # Finalized exactly when the watermark passed them: never early.
    assert all(got[k]["status"] == "open" for k in set(want) - closed)
    assert set(got) == set(want)


def test_reconciled_equals_reference_and_replay_and_the_gx_check_passed(scenario):
    settings, expected, dates, outcomes, _ = scenario
    want = expected.reconciled()
    got = window_rows(read(settings, "reconciled_aggregates"))
    assert {k: measures(r) for k, r in got.items()} == want
    for d in dates:
        assert passed(outcomes[d]) == BOTH_PASS, d
        assert compare_tables(settings, d) == 0
    replay = window_rows(read(settings, "replay_aggregates"))
    assert {k: measures(r) for k, r in replay.items()} == want


def test_mid_way_publication_was_corrected_with_revisions_and_changelog(scenario):
    settings, expected, dates, outcomes, _ = scenario
    assert passed(outcomes["mid"]) == BOTH_PASS
    # Windows of the first date that were final when first published (after the first chunk)
    # and whose counted events changed with the second.
    wm2 = max(r.time for r in expected.rows if r.chunk == 0) - timedelta(seconds=30)
    before, after = expected.reconciled(upto_chunk=0), expected.reconciled()
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


def test_fast_path_check_reports_what_the_watermark_cost(scenario):
    settings, expected, dates, outcomes, _ = scenario
    reconciled, streaming = expected.reconciled(), expected.streaming()
    for d in dates:
        gap = outcomes[d][1]["fast_path_vs_replay"].metadata
        want_missed = (sum(v[0] for k, v in reconciled.items() if k[0].date() == d)
                       - sum(v[0] for k, v in streaming.items() if k[0].date() == d))
        assert gap["events_missed"].value == want_missed, d
        value_missed = (sum(v[1] for k, v in reconciled.items() if k[0].date() == d)
                        - sum(v[1] for k, v in streaming.items() if k[0].date() == d))
        assert Decimal(gap["value_missed"].value) == value_missed
        assert gap["windows_unexplained"].value == 0
    assert any(outcomes[d][1]["fast_path_vs_replay"].metadata["events_missed"].value > 0
               for d in dates)


def test_timeline_report_shows_the_scenario_on_one_time_axis(scenario):
    import json
    import re

    from conftest import run_job
    from dagster import DagsterInstance

    settings, expected, _, _, _ = scenario
    result, _ = run_job("report_timeline", DagsterInstance.ephemeral())
    assert result.success
    meta = result.asset_materializations_for_node("timeline_report")[0].metadata
    html = open(meta["path"].value, encoding="utf-8").read()
    data = json.loads(re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>',
                                html, re.S).group(1))
    series = data["series"]
    figure = json.loads(re.search(r'<script type="application/json" id="timeline-figure">(.*?)</script>',
                                  html, re.S).group(1))
    drawn = {t.get("meta"): t for t in figure["data"]}
    for name in ("lateness_p50", "lateness_p99", "lateness_max", "watermark", "consumer_lag",
                 "batch_duration", "aggregate_freshness"):
        assert series[name]["points"], name
        assert len(drawn[name]["x"]) == len(series[name]["points"]), name  # plotted, every point
    assert max(v for _, v in series["lateness_max"]["points"]) > 3600  # hours-late events
    assert data["late_events_rows"] == len(expected.late)
    what_if = [c for _, c in series["what_if_late_records"]["points"]]
    assert what_if == sorted(what_if, reverse=True) and what_if[0] > what_if[-1]
    assert sum(c for _, c in series["lateness_histogram"]["points"]) == data["bronze_rows"]


def test_catch_up_metadata_agrees_with_the_tables(scenario):
    """The catch-ups' metadata (from the Delta log and each run's own rows, never a full scan)
    says what the tables hold: totals after the last run, and per run what that run added."""
    settings, expected, _, outcomes, _ = scenario
    runs = outcomes["catch_ups"]
    bronze, aggregates = runs[-1]["bronze_events"], runs[-1]["streaming_aggregates"]
    streaming = read(settings, "streaming_aggregates")
    assert bronze["bronze_rows"] == read(settings, "bronze_events").num_rows
    assert bronze["quarantined_rows"] == sum(expected.malformed.values())
    in_runs = Counter()
    for run in runs:
        in_runs.update(run["bronze_events"]["quarantine_reasons_in_run"])
    assert in_runs == expected.malformed  # each run's own reasons add up to the table
    assert aggregates["windows"] == streaming.num_rows
    assert aggregates["windows_open"] == streaming["status"].to_pylist().count("open")
    assert aggregates["windows_final"] == streaming["status"].to_pylist().count("final")
    assert aggregates["late_events"] == read(settings, "late_events").num_rows
    assert sum(r["streaming_aggregates"]["late_events_in_run"] for r in runs) == len(expected.late)
    assert aggregates["freshness_newest_closed_window_s"] is not None


def test_a_replay_run_records_what_it_cost(scenario):
    """Each date's replay metadata carries its cost drivers: the Kafka records and bytes it
    fetched, the bytes and files its commit wrote, the storage operations and the JVM's CPU
    seconds around it (a local master: the executors are in that JVM)."""
    from lakehouse.tables import delta_log

    settings, _, dates, outcomes, _ = scenario
    commit = delta_log.read_commit(settings.table_path("replay_aggregates"),
                                   delta_log.version(settings, "replay_aggregates"))
    for d in dates:
        meta = outcomes["replay", d]
        cost = meta["per_date"][0]["cost"]
        assert cost["kafka_records_fetched"] == meta["records_read"] > 0
        # Every record fetched has its bytes counted: at least an id, a key, a time and a value.
        assert cost["kafka_bytes_fetched"] > 40 * meta["records_read"]
        assert cost["files_written"] >= 1 and cost["bytes_written"] > 0
        assert cost["measured_in"] == "local" and cost["jvm_cpu_s"] > 0
        # The replay's tasks' CPU (Spark's count per stage): threads of that same JVM here.
        assert 0 < cost["executors_cpu_s"] <= cost["jvm_cpu_s"] + 0.05, cost
        # The Hadoop file systems' counters that moved: none here (Kafka is read over the
        # network and a small date's rows are written with delta-rs); s3a:// roots count requests.
        assert all(k.split(".", 1)[0] in ("file", "s3a") for k in cost["storage"])
        assert meta["cost"]["kafka_bytes_fetched"] == cost["kafka_bytes_fetched"]
    # The last date's figures are its commit's: the table's newest commit is that replay's.
    last = outcomes["replay", dates[-1]]["per_date"][0]["cost"]
    assert last["bytes_written"] == sum(a["size"] for a in commit.adds)
