"""Where the daily partitions start: PARTITIONS_START, else the instance's first event date
(bronze's Delta log), else LAKEHOUSE_START_DATE; never after today."""

from datetime import date

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from assets.partitions import first_partition
from lakehouse.config.settings import Settings, SettingsError

TODAY = date(2026, 11, 25)


def settings(tmp_path, **env) -> Settings:
    return Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path), **env})


def bronze(s: Settings, *dates: date) -> None:
    write_deltalake(s.table_path("bronze_events").removeprefix("file://"),
                    pa.table({"event_id": [f"e{i}" for i in range(len(dates))],
                              "event_date": pa.array(dates, pa.date32())}),
                    partition_by=["event_date"])


def test_an_empty_instance_starts_at_lakehouse_start_date(tmp_path):
    assert first_partition(settings(tmp_path), TODAY) == date(2025, 1, 1)
    assert first_partition(settings(tmp_path, LAKEHOUSE_START_DATE="2026-03-01"),
                           TODAY) == date(2026, 3, 1)


def test_data_starts_them_at_the_first_event_date(tmp_path):
    s = settings(tmp_path)
    bronze(s, date(2026, 11, 24), date(2026, 11, 20), date(2026, 11, 25))
    assert first_partition(s, TODAY) == date(2026, 11, 20)
    assert first_partition(s, date(2026, 11, 19)) == date(2026, 11, 19)  # never after today


def test_the_setting_wins_and_is_validated(tmp_path):
    s = settings(tmp_path, PARTITIONS_START="2026-10-01")
    bronze(s, date(2026, 11, 20))
    assert first_partition(s, TODAY) == date(2026, 10, 1)
    with pytest.raises(SettingsError, match="PARTITIONS_START='11/2026' must be YYYY-MM-DD"):
        settings(tmp_path, PARTITIONS_START="11/2026")
    with pytest.raises(SettingsError, match="before LAKEHOUSE_START_DATE"):
        settings(tmp_path, PARTITIONS_START="2024-12-31")
