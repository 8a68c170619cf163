"""The reconciled partition's freshness check: which date is due when (fixed clocks, any hour of
the test run), and the check's verdict through Dagster's `check_freshness` job on a real
instance: nothing due for a date without events, overdue without the due partition, fresh with
it, and the `fresh_until` time Dagster's freshness sensor waits for."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from assets.observe.freshness import FRESH_UNTIL, deadline, due_date
from lakehouse.config.settings import Settings


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(("now", "due"), [
    (at(2026, 11, 27, 1, 22), date(2026, 11, 25)),   # before today's 03:00: the day before yesterday
    (at(2026, 11, 27, 3, 0), date(2026, 11, 26)),    # at the tick: yesterday
    (at(2026, 11, 27, 12, 0), date(2026, 11, 26)),   # never today's own date (not complete)
    (at(2026, 11, 27, 23, 59), date(2026, 11, 26)),
])
def test_a_date_is_due_at_the_first_deadline_tick_after_it_ends(now, due):
    s = Settings.from_env({"RECONCILED_DEADLINE_CRON": "0 3 * * *"})
    assert due_date(s, now) == due
    assert deadline(s, due) <= now < deadline(s, due + timedelta(days=1))


def test_a_weekly_deadline_makes_the_whole_week_due_at_once():
    s = Settings.from_env({"RECONCILED_DEADLINE_CRON": "0 6 * * 1"})  # Mondays 06:00
    assert due_date(s, at(2026, 11, 30, 5, 0)) == date(2026, 11, 22)   # Sunday before last
    assert due_date(s, at(2026, 11, 30, 6, 0)) == date(2026, 11, 29)   # the week's Sunday
    assert deadline(s, date(2026, 11, 24)) == at(2026, 11, 30, 6, 0)


def test_the_check_through_dagster(tmp_path, monkeypatch):
    import pyarrow as pa
    from dagster import AssetMaterialization, DagsterInstance
    from deltalake import write_deltalake

    from assets.pipelines import Pipeline
    from assets.resources import LakehouseResource
    from orchestration.definitions import definitions_for
    from testkit.runs import run_in

    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    settings = Settings.from_env()
    defs = definitions_for([Pipeline.of(settings)], LakehouseResource())
    key = Pipeline.of(settings).key("reconciled_aggregates")

    def verdict(instance):
        result, checks = run_in(defs, "check_freshness", instance)
        assert result.success
        (check,) = [c for c in checks if c.asset_key == key]
        return check

    def bronze_holds(d: date) -> None:  # what bronze_dates reads: the partition values in the log
        write_deltalake(settings.table_path("bronze_events"),
                        pa.table({"event_id": ["e"], "event_date": [d.isoformat()]}),
                        partition_by=["event_date"], mode="append")

    with DagsterInstance.ephemeral() as instance:
        due = due_date(settings, datetime.now(UTC))
        # No event of the due date (even with partitions since 2025-01-01): nothing is due.
        bronze_holds(due + timedelta(days=1))
        check = verdict(instance)
        assert check.passed, check.description
        assert f"no event of {due}" in check.description
        assert check.metadata[FRESH_UNTIL].value == deadline(settings, due + timedelta(days=1)).timestamp()

        # Events of the due date and no reconciled partition of it: overdue.
        bronze_holds(due)
        check = verdict(instance)
        assert not check.passed
        assert f"overdue: {due}" in check.description
        assert FRESH_UNTIL not in check.metadata

        # Another date's partition does not count; the due date's does.
        instance.report_runless_asset_event(
            AssetMaterialization(key, partition=(due + timedelta(days=1)).isoformat()))
        assert not verdict(instance).passed
        instance.report_runless_asset_event(AssetMaterialization(key, partition=due.isoformat()))
        check = verdict(instance)
        assert check.passed, check.description
        assert check.metadata["due_date"].value == due.isoformat()
