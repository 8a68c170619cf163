"""Daily event-date partitions (UTC) shared by the corrections, reconciled and replay assets."""

from dagster import DailyPartitionsDefinition

from assets.resources import DEFAULT_LAKEHOUSE

daily_event_dates = DailyPartitionsDefinition(
    start_date=DEFAULT_LAKEHOUSE.settings.partitions_start_date.isoformat(),
    timezone="UTC",
    end_offset=1,  # today's date is a partition too: its windows are published as they close
)
