"""Sensors of a pipeline (`pipeline_sensors`; another pipeline's are named `<prefix>__<name>`),
running by default:

- `late_data_sensor`: when new rows land in `late_events` (events the fast path dropped behind the
  watermark), requests a corrections run for exactly their event dates that are still within the
  correction horizon; one run per date, keyed by the date and the table version it covers, so a
  re-evaluation never requests the same work twice. It follows the table's Delta versions (files
  added since the last tick), not its rows. Nothing new, nothing requested.
  The run is `reconcile_dates`: corrections, the replay and the blocking proof for each date.
- `prove_corrected_dates`: a successful `correct_dates` run (launched by hand) is followed by
  `verify_dates` for the same dates, so no date corrections publish goes unproven.
- `topic_observation_sensor`: records an observation of `raw_events` (offsets, lag, rate,
  retention) every minute without launching a run.
- `freshness_checks_sensor`: evaluates the freshness checks of `assets.observe.freshness`.

One sensor of the code location, for every pipeline: `fail_dead_runs` (`dead_runs_sensor`).

Sensors receive the `lakehouse` resource, so they read the same settings as the assets
(`lakehouse.settings_for(pipeline)`).
"""

from datetime import UTC, date, datetime
from functools import cache

import pyarrow as pa
from dagster import (
    AssetObservation,
    DagsterEventType,
    DagsterRunStatus,
    DefaultRunLauncher,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    RunStatusSensorContext,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    build_sensor_for_freshness_checks,
    run_status_sensor,
    sensor,
)

from assets.observe.freshness import freshness_checks_for
from assets.observe.topic import topic_metadata
from assets.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)
from assets.pipelines import Pipeline
from assets.resources import KafkaResource, LakehouseResource
from lakehouse.config.settings import Settings
from lakehouse.tables.delta_log import open_table
from lakehouse.tables.locks import pid_alive
from orchestration.jobs import pipeline_jobs


def new_late_dates(settings: Settings, after_version: int | None, now: datetime
                   ) -> tuple[dict[date, int], int | None]:
    """Event dates of late rows committed after `late_events` version `after_version` (None:
    any) that corrections may still apply, and the table's current version.

    Only the Delta log is read: the partition values of the data files added since that version
    (`late_events` is append-only), so a tick costs the same however large the table grows.
    """
    table = open_table(settings, "late_events")
    if table is None:
        return {}, after_version
    current = table.version()
    if after_version is not None and current <= after_version:
        return {}, after_version
    files = _partition_by_file(table)
    if after_version is not None:
        try:
            table.load_as_version(after_version)
            for seen in _partition_by_file(table):
                files.pop(seen, None)
        except Exception:  # noqa: BLE001 - that version's log was cleaned up: treat all as new
            pass
    dates = {date.fromisoformat(v) for v in files.values() if v}
    return {d: current for d in dates
            if now <= settings.applicable_cutoff(d) and d >= settings.partitions_start_date}, current


def _partition_by_file(table) -> dict[str, str]:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return dict(zip(actions["path"], (str(v) if v is not None else "" for v in
                                      actions["partition.event_date"]), strict=True))


def late_data_result(context: SensorEvaluationContext, settings: Settings,
                     first: date) -> SensorResult:
    """The late-data sensor's tick for a pipeline's `settings` and first partition `first`.
    Cursor: `v<version>` of `late_events` last looked at (any other cursor, such as the older
    timestamp form, starts over: corrections are idempotent)."""
    cursor = context.cursor or ""
    after = int(cursor[1:]) if cursor.startswith("v") and cursor[1:].isdigit() else None
    dates, current = new_late_dates(settings, after, datetime.now(UTC))
    new_cursor = f"v{current}" if current is not None else cursor
    skip = "no new late events"
    if older := sorted(d for d in dates if d < first):
        # Older than the partitions loaded with the definitions: no run can be requested for
        # them until the code location is reloaded (its first partition is then bronze's
        # first). The cursor stays, so every tick says so, and the first after a reload asks.
        skip = (f"late events for {[d.isoformat() for d in older]}, before the first partition "
                f"{first}: reload the code location (or set PARTITIONS_START)")
        context.log.warning(skip)
        dates = {d: v for d, v in dates.items() if d >= first}
        new_cursor = cursor
    if not dates:
        return SensorResult(skip_reason=SkipReason(skip), cursor=new_cursor)
    return SensorResult(
        run_requests=[RunRequest(run_key=f"late-{d.isoformat()}-v{v}", partition_key=d.isoformat())
                      for d, v in sorted(dates.items())],
        cursor=new_cursor,
    )


def proof_request(context: RunStatusSensorContext):
    """The proof of the dates a successful correct_dates run published."""
    tags = context.dagster_run.tags
    key = f"prove-{context.dagster_run.run_id}"
    if tags.get(PARTITION_NAME_TAG):
        return RunRequest(run_key=key, partition_key=tags[PARTITION_NAME_TAG])
    start, end = tags.get(ASSET_PARTITION_RANGE_START_TAG), tags.get(ASSET_PARTITION_RANGE_END_TAG)
    if start and end:
        return RunRequest(run_key=key, tags={ASSET_PARTITION_RANGE_START_TAG: start,
                                             ASSET_PARTITION_RANGE_END_TAG: end})
    return SkipReason("the run published no daily partition")


@cache
def pipeline_sensors(p: Pipeline) -> tuple[SensorDefinition, ...]:
    """Pipeline `p`'s sensors."""
    jobs = pipeline_jobs(p)

    @sensor(name=p.named("late_data_sensor"), job=jobs["reconcile_dates"],
            minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING,
            description="Corrections for the dates that received new late events, each proven "
                        "against a replay of the log in the same run (blocking check).")
    def late_data_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
        return late_data_result(context, lakehouse.settings_for(p.name), p.first_partition)

    @sensor(name=p.named("topic_observation_sensor"), minimum_interval_seconds=60,
            default_status=DefaultSensorStatus.RUNNING,
            description="Observe the topic: offsets, the stream's lag, append rate, retention.")
    def topic_observation_sensor(context: SensorEvaluationContext, kafka: KafkaResource):
        metadata = topic_metadata(kafka, p.name)
        return SensorResult(asset_events=[AssetObservation(asset_key=p.key("raw_events"),
                                                           metadata=metadata)])

    @run_status_sensor(name=p.named("prove_corrected_dates"), run_status=DagsterRunStatus.SUCCESS,
                       monitored_jobs=[jobs["correct_dates"]], request_job=jobs["verify_dates"],
                       default_status=DefaultSensorStatus.RUNNING,
                       description="A correct_dates run (launched by hand: the schedule and the "
                                   "late-data sensor prove in the run) is followed by the proof "
                                   "of the dates it published.")
    def prove_corrected_dates(context: RunStatusSensorContext):
        return proof_request(context)

    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=freshness_checks_for(p), name=p.named("freshness_checks_sensor"),
        default_status=DefaultSensorStatus.RUNNING)

    return late_data_sensor, topic_observation_sensor, prove_corrected_dates, freshness_sensor


def run_worker_pid(instance, run_id: str) -> int | None:
    """The pid of a launched run's worker process: the first engine event that names one
    (`EngineEventData.in_process`, which `dagster api execute_run` records as the worker
    starts); None for a run executed in a process of its own (`dagster job execute`, tests)."""
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT,
                                               limit=20).records:
        data = record.event_log_entry.dagster_event.engine_event_data
        if data is not None and (pid := data.metadata.get("pid")) is not None:
            return int(pid.value)
    return None


def fail_dead_runs(instance) -> list[str]:
    """Mark failed the STARTED runs whose worker process is gone (killed, out of memory), and free
    the pool slots they hold: without run monitoring (the default run launcher has none) such a
    run stays STARTED and holds its pool's slot, so every later run of the pool queues behind
    it. Runs this host launched only (the default run launcher starts the worker beside the code
    server evaluating this sensor); their writer locks need nothing: a dead holder's lock is
    free (`lakehouse.tables.locks`)."""
    if not isinstance(instance.run_launcher, DefaultRunLauncher):
        return []
    failed = []
    for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED])):
        pid = run_worker_pid(instance, run.run_id)
        if pid is None or pid_alive(pid):
            continue
        instance.report_run_failed(run, message=f"its run worker (pid {pid}) is gone: killed or "
                                                f"out of memory; marked failed by fail_dead_runs")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        failed.append(run.run_id)
    return failed


@sensor(name="fail_dead_runs", minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description="Mark failed the runs whose worker process died (killed, out of memory) and "
                    "free the pool slots they held, so the runs queued behind them start.")
def dead_runs_sensor(context: SensorEvaluationContext):
    failed = fail_dead_runs(context.instance)
    return SkipReason(f"marked failed: {', '.join(failed)}" if failed
                      else "every started run's worker is alive")
