"""Jobs: the stream catch-up, the per-date reconciliation, the timeline and table maintenance."""

from dagster import AssetSelection, define_asset_job, job

from assets.maintain import compact_and_vacuum
from assets.observe.freshness import freshness_checks
from assets.partitions import daily_event_dates
from assets.reconcile.checks import fast_path_vs_replay, reconciled_equals_replay

# Whole runs that write the same tables queue behind each other (the instance's
# `tag_concurrency_limits`, infra/dagster*.yaml): a run keeps its Spark session between its
# steps, so op-level pools alone could let it hold a cluster's cores while it waits for a slot
# held by a run that waits for those cores.
STREAM_WRITES = {"lakehouse/writes": "stream"}
DAILY_WRITES = {"lakehouse/writes": "daily"}

# Jobs run the data checks of their assets; freshness checks are left to their sensor.
DATA_CHECKS = AssetSelection.checks(reconciled_equals_replay, fast_path_vs_replay)


def assets_with_data_checks(*keys: str) -> AssetSelection:
    return AssetSelection.assets(*keys).without_checks() | (
        DATA_CHECKS & AssetSelection.checks_for_assets(*keys))


stream_catch_up_job = define_asset_job(
    "stream_catch_up",
    selection=assets_with_data_checks("raw_events", "bronze_events", "streaming_aggregates"),
    tags=STREAM_WRITES,
    description="Catch the stream up: every available Kafka record through bronze and the "
                "windowed aggregates.",
)

def daily_job(name: str, selection: AssetSelection, description: str, config=None):
    """A job over event dates: the daily partitions, queued with the other daily writers."""
    return define_asset_job(name, selection=selection, partitions_def=daily_event_dates,
                            tags=DAILY_WRITES, config=config, description=description)


PUBLISHED = ("replay_aggregates", "late_corrections", "reconciled_aggregates")

reconcile_job = daily_job(
    "reconcile_dates", assets_with_data_checks(*PUBLISHED),
    "Corrections, replay and the blocking GX proof for event dates.")

correct_job = daily_job(
    "correct_dates",
    AssetSelection.assets("late_corrections", "reconciled_aggregates").without_checks(),
    "Apply late events to the gold table for dates (incremental: only the windows bronze "
    "changes touched). The proof against the replay runs in verify_dates.")

reprocess_job = daily_job(
    "reprocess_dates", assets_with_data_checks(*PUBLISHED),
    "Rebuild reconciled_aggregates for dates from a fresh replay of the log (after a bug fix or "
    "a changed window size): changed windows get a new revision and a `reprocess` changelog "
    "row. Backfill a range of dates as one run.",
    config={"ops": {"corrections": {"config": {"reprocess": True}}}})

verify_job = daily_job(
    "verify_dates", assets_with_data_checks("replay_aggregates") | DATA_CHECKS,
    "Replay dates from the log up to the position their published gold rows were computed "
    "from, and prove reconciled_aggregates equal to it, without touching the gold table.",
    # Replay each date up to the position its published gold rows were computed from.
    config={"resources": {"log_position": {"config": {"as_published": True}}}})

timeline_job = define_asset_job(
    "report_timeline", selection=AssetSelection.assets("timeline_report"),
    description="Write the observability timeline report ($LAKEHOUSE_ROOT/reports/timeline.html).",
)


freshness_job = define_asset_job(
    "check_freshness", selection=AssetSelection.checks(*freshness_checks),
    description="Evaluate the freshness checks now (their sensor does it every minute while the "
                "daemon runs; the demo runs this at its end, so the UI shows every check "
                "evaluated).",
)


@job(name="table_maintenance", tags=DAILY_WRITES,
     description="Compact the small files of every table (OPTIMIZE where no writer races it) "
                 "and VACUUM files older than each table's Delta log retention.")
def table_maintenance_job():
    compact_and_vacuum()


all_jobs = [stream_catch_up_job, reconcile_job, correct_job, reprocess_job, verify_job, timeline_job,
            freshness_job, table_maintenance_job]
