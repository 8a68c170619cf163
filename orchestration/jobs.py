"""Jobs of a pipeline: the stream catch-up, the per-date reconciliation, the timeline and table
maintenance (`pipeline_jobs`; the default pipeline's keep the contract's names)."""

from functools import cache

from dagster import AssetSelection, define_asset_job, job

from assets.generations import retire_op, switch_op
from assets.maintain import maintenance_op
from assets.observe.freshness import freshness_checks_for
from assets.pipelines import Pipeline
from assets.reconcile.checks import data_checks
from assets.redrive import redrive_ops

# Whole runs that write the same tables queue behind each other (the instance's
# `tag_concurrency_limits`, infra/dagster*.yaml): a run keeps its Spark session between its
# steps, so op-level pools alone could let it hold a cluster's cores while it waits for a slot
# held by a run that waits for those cores. Per pipeline (`stream`, `daily` for the default,
# `orders__stream`... for a spec's; the limit applies per tag value): pipelines write their
# own tables and queue only behind themselves.
WRITES = "lakehouse/writes"


def writes(p: Pipeline, kind: str) -> dict[str, str]:
    """The run tag that queues `p`'s writers of `kind` ("stream" or "daily") one at a time."""
    return {WRITES: p.named(kind)}

PUBLISHED = ("replay_aggregates", "late_corrections", "reconciled_aggregates", "reconciled_feed")


@cache
def pipeline_jobs(p: Pipeline) -> dict:
    """Pipeline `p`'s jobs by the default pipeline's names (`verify_dates`...); each is named
    `p.named(...)`. Jobs run the data checks of their assets; freshness checks are left to
    their sensor (and the job `check_freshness`)."""
    data_checks_ = AssetSelection.checks(*data_checks(p))

    def with_data_checks(*names: str) -> AssetSelection:
        keys = [p.key(n) for n in names]
        return AssetSelection.assets(*keys).without_checks() | (
            data_checks_ & AssetSelection.checks_for_assets(*keys))

    def daily_job(name: str, selection: AssetSelection, description: str, config=None):
        """A job over event dates: the daily partitions, queued with the other daily writers."""
        return define_asset_job(p.named(name), selection=selection, partitions_def=p.partitions,
                                tags=writes(p, "daily"), config=config,
                                description=description)

    def daily_op_job(name: str, op_def, description: str):
        """A job of one op, queued with the daily writers (the op takes its locks itself)."""
        @job(name=p.named(name), tags=writes(p, "daily"), description=description)
        def one_op():
            op_def()
        return one_op

    table_maintenance_job = daily_op_job(
        "table_maintenance", maintenance_op(p),
        "Compact the small files of every table (OPTIMIZE where no writer races it) and VACUUM "
        "files older than each table's Delta log retention.")
    # The op takes both generations' stream locks itself.
    switch_generation_job = daily_op_job(
        "switch_generation", switch_op(p),
        "After an edit of the spec that needs a rebuild (lakehouse.tables.generations): switch to "
        "the generation rebuilt under the new spec version (one commit of the generations "
        "registry), once every date is proven in it or reported as not rebuildable from the log.")
    retire_generation_job = daily_op_job(
        "retire_generation", retire_op(p),
        "Delete an old generation a switch retired (config: its spec version); it stays readable "
        "until then.")

    redrive, reconcile_redriven = redrive_ops(p)

    # Partitioned by quarantine date (the records' broker date); queued with the daily writers.
    @job(name=p.named("redrive_quarantine"), partitions_def=p.partitions,
         tags=writes(p, "daily"),
         description="Give a date's quarantined records a second chance after a fix upstream "
                     "(a schema registered, ...): re-classify them with today's spec and "
                     "registry, land those that now pass exactly once (bronze and the late "
                     "lane), mark them redriven (never deleted), then correct, replay and prove "
                     "the event dates they landed in. Config: the reasons (default: all).")
    def redrive_quarantine_job():
        reconcile_redriven(redrive())

    jobs = [
        define_asset_job(
            p.named("stream_catch_up"),
            selection=with_data_checks("raw_events", "bronze_events", "streaming_aggregates"),
            tags=writes(p, "stream"),
            description="Catch the stream up: every available Kafka record through bronze and "
                        "the windowed aggregates."),
        daily_job(
            "reconcile_dates", with_data_checks(*PUBLISHED),
            "Corrections, replay and the blocking GX proof for event dates."),
        daily_job(
            "correct_dates",
            AssetSelection.assets(p.key("late_corrections"),
                                  p.key("reconciled_aggregates")).without_checks(),
            "Apply late events to the gold table for dates (incremental: only the windows bronze "
            "changes touched). The proof against the replay runs in verify_dates."),
        daily_job(
            "reprocess_dates", with_data_checks(*PUBLISHED),
            "Rebuild reconciled_aggregates for dates from a fresh replay of the log (after a bug "
            "fix or a changed window size): changed windows get a new revision and a `reprocess` "
            "changelog row. Backfill a range of dates as one run.",
            config={"ops": {p.named("corrections"): {"config": {"reprocess": True}}}}),
        daily_job(
            "verify_dates", with_data_checks("replay_aggregates") | data_checks_,
            "Replay dates from the log up to the position their published gold rows were "
            "computed from, and prove reconciled_aggregates equal to it, without touching the "
            "gold table.",
            # Replay each date up to the position its published gold rows were computed from.
            config={"resources": {"log_position": {"config": {"as_published": True}}}}),
        define_asset_job(
            p.named("report_timeline"), selection=AssetSelection.assets(p.key("timeline_report")),
            description="Write the observability timeline report (reports/timeline.html in the "
                        "pipeline's folder: $LAKEHOUSE_ROOT for the default pipeline)."),
        define_asset_job(
            p.named("report_scorecard"),
            selection=AssetSelection.assets(p.key("readiness_scorecard")),
            description="Write the readiness scorecard (reports/scorecard.html in the "
                        "pipeline's folder): seven rows with their evidence, each an asset "
                        "check (`make scorecard`)."),
        define_asset_job(
            p.named("check_freshness"), selection=AssetSelection.checks(*freshness_checks_for(p)),
            description="Evaluate the freshness checks now (their sensor does it every minute "
                        "while the daemon runs; the demo runs this at its end, so the UI shows "
                        "every check evaluated)."),
        table_maintenance_job,
        switch_generation_job,
        retire_generation_job,
        redrive_quarantine_job,
    ]
    prefix = p.named("")
    return {j.name.removeprefix(prefix): j for j in jobs}
