"""Schedules of a pipeline (`pipeline_schedules`; another pipeline's are named
`<prefix>__<name>`), all running by default (cron in UTC, from settings):

- `stream_catch_up_schedule` (CATCH_UP_CRON, every 5 minutes): one availableNow catch-up; skipped
  while another catch-up is queued or running (the assets also share the `lakehouse_stream` pool),
  and while another process holds the pipeline's stream checkpoint (the streaming service of
  `make stream`: it is ingesting), the skip naming the holder (pid, host, since when).
- `corrections_schedule` (CORRECTIONS_CRON, hourly): corrections for every date still within the
  correction horizon that has data, as one `reconcile_dates` run over the date range (single-run
  backfill policy): each date is proven against a replay in that run (blocking check).
- `verification_schedule` (VERIFICATION_CRON, daily): replay yesterday from the log and run the
  blocking proof reconciled == replay.
- `timeline_schedule` (TIMELINE_CRON, hourly): refresh the observability timeline report.
- `table_maintenance_schedule` (MAINTENANCE_CRON, daily): compact small files, VACUUM.
"""

from datetime import date, timedelta
from functools import cache

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from assets.ingest import ingesting_elsewhere, stream_held_elsewhere
from assets.partitions import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from assets.pipelines import Pipeline
from assets.resources import LakehouseResource
from lakehouse.tables.reads import bronze_dates
from orchestration.jobs import pipeline_jobs

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
          DagsterRunStatus.STARTED]


def tick_date(context: ScheduleEvaluationContext) -> date:
    return context.scheduled_execution_time.date()


def date_range_request(dates: list[date], run_key: str | None = None) -> RunRequest:
    """One run over a contiguous range of daily partitions (as a single-run backfill does)."""
    first, last = min(dates).isoformat(), max(dates).isoformat()
    if first == last:
        return RunRequest(run_key=run_key, partition_key=first)
    return RunRequest(run_key=run_key, tags={ASSET_PARTITION_RANGE_START_TAG: first,
                                             ASSET_PARTITION_RANGE_END_TAG: last})


@cache
def pipeline_schedules(p: Pipeline) -> tuple[ScheduleDefinition, ...]:
    """Pipeline `p`'s schedules; crons fixed when the code location loads (`p.settings`)."""
    settings, jobs = p.settings, pipeline_jobs(p)
    catch_up_job = jobs["stream_catch_up"]

    @schedule(name=p.named("stream_catch_up_schedule"), cron_schedule=settings.catch_up_cron,
              job=catch_up_job, execution_timezone="UTC",
              default_status=DefaultScheduleStatus.RUNNING,
              description="Catch the stream up every few minutes (one run at a time).")
    def stream_catch_up_schedule(context: ScheduleEvaluationContext, lakehouse: LakehouseResource):
        active = context.instance.get_run_records(
            RunsFilter(job_name=catch_up_job.name, statuses=ACTIVE), limit=1)
        if active:
            return SkipReason(f"catch-up run {active[0].dagster_run.run_id} is still queued or "
                              "running")
        try:  # asked of the kernel or the lock server, without Spark and without taking it
            holder = stream_held_elsewhere(lakehouse.settings_for(p.name))
        except Exception as exc:  # noqa: BLE001 - the run then says what is wrong, loudly
            context.log.warning(f"who holds the stream checkpoint is unknown "
                                f"({type(exc).__name__}: {exc}); requesting the catch-up")
            holder = None
        if holder is not None:
            return SkipReason(ingesting_elsewhere(holder))
        return RunRequest()

    @schedule(name=p.named("corrections_schedule"), cron_schedule=settings.corrections_cron,
              job=jobs["reconcile_dates"], execution_timezone="UTC",
              default_status=DefaultScheduleStatus.RUNNING,
              description="Corrections for the dates within the correction horizon, in one run, "
                          "each date proven against a replay of the log (blocking check) in "
                          "that run.")
    def corrections_schedule(context: ScheduleEvaluationContext, lakehouse: LakehouseResource):
        s = lakehouse.settings_for(p.name)
        first = p.first_partition
        recent = set(s.recent_dates(tick_date(context)))
        dates = sorted(d for d in bronze_dates(s) if d in recent)
        if older := [d.isoformat() for d in dates if d < first]:
            context.log.warning(f"bronze holds {older}, before the first partition {first}: "
                                "reload the code location (or set PARTITIONS_START) to correct "
                                "them")
            dates = [d for d in dates if d >= first]
        if not dates:
            return SkipReason("no bronze data for the dates within the correction horizon")
        return date_range_request(dates)

    @schedule(name=p.named("verification_schedule"), cron_schedule=settings.verification_cron,
              job=jobs["verify_dates"], execution_timezone="UTC",
              default_status=DefaultScheduleStatus.RUNNING,
              description="Replay yesterday from the log and prove reconciled == replay.")
    def verification_schedule(context: ScheduleEvaluationContext):
        yesterday = tick_date(context) - timedelta(days=1)
        return RunRequest(partition_key=yesterday.isoformat())

    timeline_schedule = ScheduleDefinition(
        name=p.named("timeline_schedule"), cron_schedule=settings.timeline_cron,
        job=jobs["report_timeline"], execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description="Refresh the observability timeline report.")

    table_maintenance_schedule = ScheduleDefinition(
        name=p.named("table_maintenance_schedule"), cron_schedule=settings.maintenance_cron,
        job=jobs["table_maintenance"], execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description="Compact the tables' small files and VACUUM expired ones.")

    return (stream_catch_up_schedule, corrections_schedule, verification_schedule,
            timeline_schedule, table_maintenance_schedule)
