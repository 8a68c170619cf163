"""The run's log position: resolved once per run, recorded as a run tag (see
`LogPositionResource`), read by every daily asset of the run."""

from __future__ import annotations

from datetime import date

from dagster import AssetExecutionContext

from assets.resources import LogPositionResource, SparkResource
from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE
from spark_jobs.corrections import gold_bronze_version
from spark_jobs.writer import ensure_tables

RUN_TAG = "lakehouse/bronze_version"


def pinned_version(context: AssetExecutionContext, spark: SparkResource, settings: Settings) -> int:
    """The run's bronze version: the run tag if set (by an earlier step, or at launch), else the
    newest version now, which is then recorded on the run."""
    run = context.instance.get_run_by_id(context.run.run_id) or context.run
    tagged = run.tags.get(RUN_TAG)
    if tagged is not None:
        return int(tagged)
    ensure_tables(spark.session, settings)
    version = delta_log.version(settings, BRONZE.name)
    context.instance.add_run_tags(context.run.run_id, {RUN_TAG: str(version)})
    return version


def version_for(context: AssetExecutionContext, position: LogPositionResource,
                spark: SparkResource, settings: Settings, d: date) -> int:
    """The bronze version the daily assets of this run use for date `d`."""
    if position.bronze_version is not None:
        return position.bronze_version
    if position.as_published:
        published = gold_bronze_version(settings, d)
        if published is not None:
            return published
    return pinned_version(context, spark, settings)
