"""A one-run process's JVM options follow the run's size (`SparkResource._small_run`): a daily
run's input is bronze's rows of its dates, read from the Delta log's statistics."""

from datetime import date

import pyarrow as pa
import pytest
from dagster import DagsterRun
from deltalake import write_deltalake

from assets.resources import LakehouseResource, SparkResource, _pipeline_of
from lakehouse.config.settings import Settings
from lakehouse.tables.stats import rows_of_dates


@pytest.fixture
def root(tmp_path, monkeypatch) -> str:
    root = str(tmp_path / "lakehouse")
    monkeypatch.setenv("LAKEHOUSE_ROOT", root)
    monkeypatch.setenv("SHORT_RUN_MAX_RECORDS", "100")
    days = [date(2026, 11, 25)] * 30 + [date(2026, 11, 26)] * 150
    write_deltalake(f"{root}/bronze_events", pa.table({"event_date": days, "x": range(len(days))}),
                    partition_by=["event_date"])
    return root


def test_rows_of_dates_come_from_the_log(root):
    settings = Settings(lakehouse_root=root)
    assert rows_of_dates(settings, "bronze_events", "event_date", [date(2026, 11, 25)]) == 30
    assert rows_of_dates(settings, "bronze_events", "event_date", None) == 180
    assert rows_of_dates(settings, "bronze_events", "event_date", [date(2026, 1, 1)]) == 0
    assert rows_of_dates(settings, "late_events", "event_date", None) == 0  # no table


@pytest.mark.parametrize(("tags", "small"), [
    ({"dagster/partition": "2026-11-25"}, True),
    ({"dagster/partition": "2026-11-26"}, False),
    ({"dagster/asset_partition_range_start": "2026-11-24",
      "dagster/asset_partition_range_end": "2026-11-25"}, True),
    ({}, False),  # every date: 180 rows
])
def test_a_daily_runs_size_is_its_dates_bronze_rows(root, tags, small):
    resource = SparkResource(lakehouse=LakehouseResource())
    run = DagsterRun(job_name="reconcile_dates", run_id="r", tags=tags)
    assert resource._small_run(run) is small


def test_the_pipeline_of_a_run():
    assert _pipeline_of(DagsterRun(job_name="orders__reconcile_dates", run_id="r")) == "orders"
    assert _pipeline_of(DagsterRun(job_name="reconcile_dates", run_id="r")) == "default"
