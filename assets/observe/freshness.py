"""Freshness checks with thresholds from settings: a pipeline's fast path must have been caught
up within STREAM_FRESHNESS; each day's reconciled partition must exist by
RECONCILED_DEADLINE_CRON (UTC) of the next day. `orchestration.sensors` evaluates them (running
by default)."""

from functools import cache

from dagster import AssetChecksDefinition, build_last_update_freshness_checks, build_time_partition_freshness_checks

from assets.pipelines import Pipeline


@cache
def freshness_checks_for(p: Pipeline) -> tuple[AssetChecksDefinition, ...]:
    return (
        *build_last_update_freshness_checks(
            assets=[p.key("streaming_aggregates")], lower_bound_delta=p.settings.stream_freshness),
        *build_time_partition_freshness_checks(
            assets=[p.key("reconciled_aggregates")],
            deadline_cron=p.settings.reconciled_deadline_cron, timezone="UTC"),
    )
