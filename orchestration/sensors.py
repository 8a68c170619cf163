"""Sensors, running by default:

- `late_data_sensor`: when new rows land in `late_events` (events the fast path dropped behind the
  watermark), requests a corrections run for exactly their event dates that are still within the
  correction horizon; one run per date, keyed by the date and the newest late row it covers, so a
  re-evaluation never requests the same work twice. Nothing new, nothing requested.
- `topic_observation_sensor`: records an observation of `raw_events` (offsets, lag, rate,
  retention) every minute without launching a run.
"""

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from lakehouse.settings import Settings
from orchestration.jobs import correct_job
from orchestration.observations import topic_metadata


def new_late_dates(settings: Settings, after_ms: int, now: datetime) -> tuple[dict[date, int], int]:
    """Event dates with late rows recorded after `after_ms` (epoch ms) that corrections may still
    apply, each with its newest recorded_at (ms); and the newest recorded_at seen overall."""
    from deltalake import DeltaTable

    path = settings.table_path("late_events")
    if not Path(path, "_delta_log").exists():
        return {}, after_ms
    table = DeltaTable(path).to_pyarrow_table(columns=["event_date", "recorded_at"])
    newest, dates = after_ms, {}
    for row in table.to_pylist():
        at = row["recorded_at"]
        ms = int((at.replace(tzinfo=UTC) if at.tzinfo is None else at).timestamp() * 1000)
        if ms <= after_ms:
            continue
        newest = max(newest, ms)
        d = row["event_date"]
        horizon_end = datetime.combine(d, time.min, tzinfo=UTC) + timedelta(days=1) \
            + settings.correction_horizon
        if now <= horizon_end and d >= settings.partitions_start_date:
            dates[d] = max(dates.get(d, 0), ms)
    return dates, newest


@sensor(job=correct_job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING,
        description="Corrections for the dates that received new late events.")
def late_data_sensor(context: SensorEvaluationContext):
    settings = Settings.from_env()
    after = int(context.cursor or 0)
    dates, newest = new_late_dates(settings, after, datetime.now(UTC))
    if not dates:
        return SensorResult(skip_reason=SkipReason("no new late events"), cursor=str(newest))
    return SensorResult(
        run_requests=[RunRequest(run_key=f"late-{d.isoformat()}-{ms}", partition_key=d.isoformat())
                      for d, ms in sorted(dates.items())],
        cursor=str(newest),
    )


@sensor(minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING,
        description="Observe the topic: offsets, the stream's lag, append rate, retention.")
def topic_observation_sensor(context: SensorEvaluationContext):
    metadata = topic_metadata(Settings.from_env())
    return SensorResult(asset_events=[AssetObservation(asset_key="raw_events", metadata=metadata)])


all_sensors = [late_data_sensor, topic_observation_sensor]
