"""The daily-side exporter (orchestration/daily_metrics.py) over the end-to-end scenario's real
tables and Dagster instance (tests/conftest.py `scenario`): both dates proven from the log
position gold is at, deadlines from RECONCILED_DEADLINE_CRON, the corrections the scenario
applied, nothing waiting; then served over HTTP and scraped."""

from __future__ import annotations

import urllib.request
from datetime import UTC, date, datetime

from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

from assets.pipelines import Pipeline
from lakehouse.config.settings import Settings
from lakehouse.tables.reads import read
from lakehouse.tables.state_rows import latest_row
from orchestration.daily_metrics import DailyCollector, deadline


def samples(collector) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in collector.collect() for s in fam.samples}


def test_deadline_follows_the_cron():
    s = Settings.from_env({"RECONCILED_DEADLINE_CRON": "30 4 * * *"})
    assert deadline(s, date(2026, 11, 24)) == datetime(2026, 11, 25, 4, 30, tzinfo=UTC)


def test_the_scenario_as_daily_metrics(scenario):
    settings, _expected, dates, outcomes, _chunks = scenario
    p = Pipeline.of(settings)
    got = samples(DailyCollector([p], outcomes["instance"]))

    def at(name, d, **more):
        return got.get((name, tuple(sorted({"pipeline": "default", "event_date": d.isoformat(),
                                            **more}.items()))))

    corrections = read(settings, "late_corrections")
    for d in dates:
        gold_v = latest_row(settings, "corrections_state", d, ("updated_at",)).bronze_version
        assert at("lakehouse_daily_proven", d) == 1.0, d
        assert at("lakehouse_daily_gold_bronze_version", d) == gold_v
        assert at("lakehouse_daily_proven_bronze_version", d) == gold_v
        assert at("lakehouse_daily_deadline_timestamp_seconds", d) == deadline(settings, d).timestamp()
        assert at("lakehouse_daily_gold_updated_timestamp_seconds", d) <= datetime.now(UTC).timestamp()
        want = sum(1 for v in corrections["event_date"].to_pylist() if v == d)
        assert at("lakehouse_daily_corrections", d) == want
        assert at("lakehouse_daily_late_events_waiting", d) == 0
        assert at("lakehouse_daily_late_events_beyond_horizon", d) == 0
    assert sum(at("lakehouse_daily_corrections", d) for d in dates) > 0  # the first date's
    jobs = {dict(k[1])["job"] for k in got if k[0] == "lakehouse_daily_last_success_timestamp_seconds"}
    assert {"stream_catch_up", "reconcile_dates"} <= jobs
    assert got[("lakehouse_daily_scrape_errors", (("pipeline", "default"),))] == 0
    # The scenario's last reconcile published every gold version to the downstream feed.
    assert got[("lakehouse_feed_unsent_versions", (("pipeline", "default"),))] == 0

    # Without the proof's record (no Dagster instance), nothing is proven.
    bare = samples(DailyCollector([p], None))
    assert {v for k, v in bare.items() if k[0] == "lakehouse_daily_proven"} == {0.0}


def test_the_exporter_serves_over_http(scenario):
    from prometheus_client import CollectorRegistry, start_http_server

    settings, _expected, dates, outcomes, _chunks = scenario
    registry = CollectorRegistry()
    registry.register(DailyCollector([Pipeline.of(settings)], outcomes["instance"]))
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"lakehouse_daily_proven", "lakehouse_daily_deadline_timestamp_seconds"} <= names
    assert f'event_date="{dates[0].isoformat()}"' in text
