"""Freshness checks with thresholds from settings: the fast path must have been caught up within
STREAM_FRESHNESS; each day's reconciled partition must exist by RECONCILED_DEADLINE_CRON (UTC)
of the next day. A sensor evaluates them (running by default)."""

from dagster import (
    DefaultSensorStatus,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
    build_time_partition_freshness_checks,
)

from lakehouse.settings import Settings

settings = Settings.from_env()

freshness_checks = [
    *build_last_update_freshness_checks(
        assets=["streaming_aggregates"], lower_bound_delta=settings.stream_freshness),
    *build_time_partition_freshness_checks(
        assets=["reconciled_aggregates"], deadline_cron=settings.reconciled_deadline_cron,
        timezone="UTC"),
]

freshness_sensor = build_sensor_for_freshness_checks(
    freshness_checks=freshness_checks, name="freshness_checks_sensor",
    default_status=DefaultSensorStatus.RUNNING)
