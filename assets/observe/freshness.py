"""Freshness checks with thresholds from settings: a pipeline's fast path must have been caught
up within STREAM_FRESHNESS; each date's reconciled partition must exist by the first
RECONCILED_DEADLINE_CRON tick (UTC) after the date ends. `orchestration.sensors` evaluates them
(running by default).

The reconciled check is ours, not Dagster's `build_time_partition_freshness_checks`: with
partitions that include today's date (`end_offset=1`), that one expects the tick's own date (at
03:00 today: today's partition, which cannot be complete), and every date since the partitions'
start, events or not. Here a date is due when bronze holds events of it (read from its Delta
log when the check runs)."""

from datetime import UTC, date, datetime, timedelta
from functools import cache

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetRecordsFilter,
    MetadataValue,
    asset_check,
    build_last_update_freshness_checks,
)

from assets.pipelines import Pipeline
from assets.resources import LakehouseResource
from lakehouse.config import cron
from lakehouse.config.settings import Settings, day_bounds
from lakehouse.tables.reads import bronze_dates

FRESH_UNTIL = "dagster/fresh_until_timestamp"  # read by Dagster's freshness sensor


def deadline(settings: Settings, d: date) -> datetime:
    """When date `d`'s reconciled partition is due: the first RECONCILED_DEADLINE_CRON tick
    (UTC) after the date ends."""
    end = day_bounds(d)[1]
    return cron.next_after(settings.reconciled_deadline_cron, end)


def due_date(settings: Settings, now: datetime) -> date:
    """The newest date whose deadline has passed at `now`."""
    d = now.astimezone(UTC).date()
    while deadline(settings, d) > now:
        d -= timedelta(days=1)
    return d


def reconciled_freshness(p: Pipeline) -> AssetChecksDefinition:
    cron = p.settings.reconciled_deadline_cron

    @asset_check(asset=p.key("reconciled_aggregates"), name="freshness_check",
                 description=f"The newest date whose deadline has passed (the first `{cron}` "
                             "tick, UTC, after the date ends) has a reconciled partition if "
                             "bronze holds events of it.")
    def freshness_check(context: AssetCheckExecutionContext,
                        lakehouse: LakehouseResource) -> AssetCheckResult:
        settings = lakehouse.settings_for(p.name)
        now = datetime.now(UTC)
        due = due_date(settings, now)
        due_at = deadline(settings, due)
        metadata = {"due_date": due.isoformat(), "deadline": MetadataValue.timestamp(due_at),
                    FRESH_UNTIL: MetadataValue.timestamp(deadline(settings, due + timedelta(days=1)))}
        if due not in bronze_dates(settings):
            # A stream that stopped is the streaming check's and the stall alert's to report.
            return AssetCheckResult(passed=True, metadata=metadata, description=(
                f"nothing due: bronze holds no event of {due}"))
        done = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=p.key("reconciled_aggregates"),
                               asset_partitions=[due.isoformat()]), limit=1).records
        if done:
            metadata["materialized_at"] = MetadataValue.timestamp(done[0].timestamp)
            return AssetCheckResult(passed=True, metadata=metadata,
                                    description=f"{due} was reconciled")
        del metadata[FRESH_UNTIL]  # overdue: the sensor re-evaluates after the next materialization
        return AssetCheckResult(passed=False, metadata=metadata, description=(
            f"overdue: {due} has events in bronze and no reconciled partition (due "
            f"{due_at:%Y-%m-%d %H:%M} UTC)"))

    return freshness_check


@cache
def freshness_checks_for(p: Pipeline) -> tuple[AssetChecksDefinition, ...]:
    return (
        *build_last_update_freshness_checks(
            assets=[p.key("streaming_aggregates")], lower_bound_delta=p.settings.stream_freshness),
        reconciled_freshness(p),
    )
