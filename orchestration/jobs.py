"""Jobs: the stream catch-up and the per-date reconciliation."""

from dagster import AssetSelection, define_asset_job

from orchestration.partitions import daily_event_dates

stream_catch_up_job = define_asset_job(
    "stream_catch_up",
    selection=AssetSelection.assets("raw_events", "bronze_events", "streaming_aggregates"),
    description="Catch the stream up: every available Kafka record through bronze and the "
                "windowed aggregates.",
)

reconcile_job = define_asset_job(
    "reconcile_dates",
    selection=AssetSelection.assets("replay_aggregates", "late_corrections",
                                    "reconciled_aggregates"),
    partitions_def=daily_event_dates,
    description="Corrections, replay and the blocking GX proof for event dates.",
)

all_jobs = [stream_catch_up_job, reconcile_job]
