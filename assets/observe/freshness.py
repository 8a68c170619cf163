"""Freshness checks with thresholds from settings: the fast path must have been caught up within
STREAM_FRESHNESS; each day's reconciled partition must exist by RECONCILED_DEADLINE_CRON (UTC)
of the next day. `orchestration.sensors` evaluates them (running by default)."""

from dagster import build_last_update_freshness_checks, build_time_partition_freshness_checks

from assets.resources import DEFAULT_LAKEHOUSE

settings = DEFAULT_LAKEHOUSE.settings

freshness_checks = [
    *build_last_update_freshness_checks(
        assets=["streaming_aggregates"], lower_bound_delta=settings.stream_freshness),
    *build_time_partition_freshness_checks(
        assets=["reconciled_aggregates"], deadline_cron=settings.reconciled_deadline_cron,
        timezone="UTC"),
]
