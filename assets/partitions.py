"""Daily event-date partitions (UTC) shared by a pipeline's corrections, reconciled and replay
assets (each pipeline has its own: `assets.pipelines.Pipeline`).

They start at the pipeline's first event date (or PARTITIONS_START), read when the definitions
load: the UI lists the dates that can hold data, not every day since LAKEHOUSE_START_DATE. A
backfill of events older than that first date needs a reload of the code location (or
PARTITIONS_START)."""

import warnings
from datetime import UTC, date, datetime

from dagster import DailyPartitionsDefinition

from lakehouse.config.settings import Settings
from lakehouse.tables.reads import bronze_dates

# The run tags Dagster gives a run of one partition and of a range of partitions (a single-run
# backfill): its own names, which its public API does not export (tests/unit/test_schedules.py
# holds them against Dagster's).
PARTITION_NAME_TAG = "dagster/partition"
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


def first_partition(settings: Settings, today: date | None = None) -> date:
    """PARTITIONS_START when set; else bronze's oldest event date (from its Delta log); with no
    data yet, LAKEHOUSE_START_DATE (every date an event may have). Never after today."""
    today = today or datetime.now(UTC).date()
    if settings.partitions_start is not None:
        first = settings.partitions_start
    else:
        try:
            first = min(bronze_dates(settings), default=settings.partitions_start_date)
        except Exception as exc:  # noqa: BLE001 - the definitions must load without the store
            warnings.warn(f"daily partitions from LAKEHOUSE_START_DATE: bronze's first event "
                          f"date could not be read ({type(exc).__name__}: {exc})", stacklevel=2)
            first = settings.partitions_start_date
    return min(max(first, settings.partitions_start_date), today)


def daily_event_dates(first: date) -> DailyPartitionsDefinition:
    """The event dates from `first` on, in UTC."""
    return DailyPartitionsDefinition(
        start_date=first.isoformat(),
        timezone="UTC",
        end_offset=1,  # today's date is a partition too: its windows are published as they close
    )
