"""Dagster resources: the pipelines' settings, Kafka, the Spark session and the run's log position.

`DEFAULT_LAKEHOUSE` is the one place definitions read settings from: the partitions, schedule
crons and freshness thresholds are built from its settings when the code location loads, and
the deployment component (`orchestration.components`) binds the same object as the `lakehouse`
resource that assets, schedules and sensors receive. Its fields can be overridden per run
(launchpad, run config); such overrides change where a run reads and writes, never the
definitions themselves.

One code location runs several pipelines: the default one (the tables at LAKEHOUSE_ROOT,
unprefixed asset keys) and one per spec named by PIPELINES (`pipeline_specs`). The one
`lakehouse` resource knows them all: `settings_for(name)` is a pipeline's settings, the
default's with the spec on top (its folder under the root, topic, windows, event shape).
"""

from __future__ import annotations

import os
import re
import sys
from datetime import date
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr, field_validator
from pyspark.sql import SparkSession

from assets.partitions import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)
from lakehouse.config.settings import Settings, SettingsError, is_credential
from lakehouse.kafka.admin import ensure_topic
from lakehouse.kafka.topic_status import TopicStatus, topic_status
from lakehouse.specs.pipeline import DEFAULT_PIPELINE, PipelineSpec, SpecError, pipeline_specs
from lakehouse.tables.catalog import BRONZE
from lakehouse.tables.generations import resolve
from lakehouse.tables.stats import rows_of_dates


class LakehouseResource(ConfigurableResource):
    """The typed settings (env vars, docs/design.md §9); fields here override them (tests, UI).
    An override goes through the same validation as the environment, and a run config cannot
    send the environment's Kafka credentials to another broker. Read once per resource object."""

    lakehouse_root: str | None = None
    events_topic: str | None = None
    kafka_bootstrap_servers: str | None = None
    _settings: Settings | None = PrivateAttr(default=None)
    _specs: dict[str, PipelineSpec] | None = PrivateAttr(default=None)
    _pipelines: dict[str, Settings] = PrivateAttr(default_factory=dict)

    @property
    def settings(self) -> Settings:
        """The default pipeline's settings (the overrides apply to them)."""
        if self._settings is None:
            self._settings = self._resolve()
        return self._settings

    def settings_for(self, pipeline: str) -> Settings:
        """Pipeline `pipeline`'s settings: the default's, or for a spec of PIPELINES the spec's
        on top of them (`PipelineSpec.settings`), in the folder of the generation its spec
        writes (`lakehouse.tables.generations.resolve`, read at each call: a switch moves it). Specs
        are read once per resource object."""
        if pipeline == DEFAULT_PIPELINE:
            return resolve(self.settings)
        if pipeline not in self._pipelines:
            if self._specs is None:
                self._specs = {spec.name: spec for spec in pipeline_specs()}
            if pipeline not in self._specs:
                raise SpecError(f"pipeline {pipeline!r} is not among PIPELINES and the "
                                f"pipeline components ({', '.join(self._specs) or 'none'})")
            self._pipelines[pipeline] = _own_brokers(
                self._specs[pipeline].settings(self.settings, os.environ))
        return resolve(self._pipelines[pipeline])

    def _resolve(self) -> Settings:
        overrides = {"LAKEHOUSE_ROOT": self.lakehouse_root, "EVENTS_TOPIC": self.events_topic,
                     "KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap_servers}
        return _own_brokers(Settings.from_env(
            {**os.environ, **{k: v for k, v in overrides.items() if v is not None}}))


def _own_brokers(settings: Settings) -> Settings:
    """`settings`, unless a run override sends their Kafka credentials (the environment's, or a
    spec's secret_env) to other brokers than the environment's."""
    if (settings.kafka_bootstrap_servers != Settings.from_env().kafka_bootstrap_servers
            and any(is_credential(k) for k in settings.kafka_options)):
        raise SettingsError(
            "kafka_bootstrap_servers may not be overridden per run while Kafka credentials "
            "are configured (KAFKA_SASL_*/KAFKA_SSL_*, a pipeline spec's secret_env): they "
            "belong to KAFKA_BOOTSTRAP_SERVERS' brokers; change the environment instead")
    return settings


class KafkaResource(ConfigurableResource):
    """The events topic on the settings' brokers (admin calls and offsets; the stream itself
    reads through Spark's Kafka source with the same options)."""

    lakehouse: LakehouseResource

    def ensure_topic(self, pipeline: str = DEFAULT_PIPELINE) -> bool:
        """Create the pipeline's topic when missing (partitions and replication from the
        settings)."""
        return ensure_topic(self.lakehouse.settings_for(pipeline))

    def status(self, pipeline: str = DEFAULT_PIPELINE) -> TopicStatus:
        """The pipeline's topic: offsets, retention, the stream's lag and append rate (one lag
        formula)."""
        return topic_status(self.lakehouse.settings_for(pipeline))


# What a run's `spark_config` may set: sizes and parallelism. Everything else (class paths, jars,
# Java options, the catalog, credentials) comes from the deployment's environment only.
SPARK_CONFIG_ALLOWED = re.compile(
    r"^spark\.(executor\.(memory|cores|instances|memoryOverhead)|driver\.(memory|maxResultSize)"
    r"|cores\.max|default\.parallelism|sql\.shuffle\.partitions"
    r"|sql\.adaptive\.[A-Za-z.]+|sql\.files\.maxPartitionBytes|task\.cpus)$")


DEFAULT_LAKEHOUSE = LakehouseResource()


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session resource, configured from the settings: the session starts
    on first use (runs that need no Spark start no JVM) and, with the in-process executor, every
    step of a run shares it. `spark_config` (shown and editable in the launchpad) is applied on
    top of the settings' configuration, for sizes and parallelism only (`SPARK_CONFIG_ALLOWED`:
    executor and driver memory and cores, shuffle partitions, adaptive execution); class paths,
    jars, Java options, the catalog and credentials come from the deployment's SPARK_CONF_*
    environment only."""

    lakehouse: LakehouseResource
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark settings for the run, on top of the pipeline's own "
                    "(spark_jobs.session.spark_conf).")
    _session: SparkSession | None = PrivateAttr(default=None)
    _classic: bool = PrivateAttr(default=False)
    _short_run: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """With SPARK_REMOTE set, a run's steps use the Spark Connect server, except a run of the
        stream's catch-up (or a generation switch), which stays classic as a whole: its
        `foreachBatch` would run in the server's Python worker, away from the writer lock and
        the fence this process holds, and one process holds one kind of session."""
        run = context.run
        self._classic = run is not None and runs_the_stream(run.job_name, run.asset_selection)
        self._short_run = _one_run_process() and (run is None or self._small_run(run))

    def _small_run(self, run) -> bool:
        """Whether the run's input is at most SHORT_RUN_MAX_RECORDS records, from metadata (no
        Spark): a catch-up's, the records past the stream's position; a daily run's, bronze's
        rows of its dates (every date when it names none). Unknown (e.g. no broker): small, as
        every run was before the size was looked at."""
        try:
            settings = self.lakehouse.settings_for(_pipeline_of(run))
            if self._classic:
                records = topic_status(settings).lag
            else:
                tags = run.tags or {}
                first = tags.get(ASSET_PARTITION_RANGE_START_TAG) or tags.get(PARTITION_NAME_TAG)
                last = tags.get(ASSET_PARTITION_RANGE_END_TAG) or first
                dates = None if first is None else [
                    date.fromordinal(o) for o in range(date.fromisoformat(first).toordinal(),
                                                       date.fromisoformat(last).toordinal() + 1)]
                records = rows_of_dates(settings, BRONZE.name, BRONZE.partition_by, dates)
        except Exception:  # noqa: BLE001 - a guess only; the run itself reports real errors
            return True
        return records <= settings.short_run_max_records

    @field_validator("spark_config")
    @classmethod
    def _allowed_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        refused = sorted(k for k in value if not SPARK_CONFIG_ALLOWED.match(k))
        if refused:
            raise ValueError(
                f"spark_config may not set {', '.join(refused)}: a run may size Spark "
                "(executor/driver memory and cores, shuffle partitions, adaptive execution), "
                "anything else comes from the deployment's SPARK_CONF_* environment")
        return value

    @property
    def spark_session(self) -> SparkSession:
        if self._session is None:
            from spark_jobs.session import get_spark

            self._session = get_spark(self.lakehouse.settings, extra=self.spark_config,
                                      short_run=self._short_run, classic=self._classic)
        return self._session

    @property
    def session(self) -> SparkSession:
        return self.spark_session


# The assets written by the stream's query (a catch-up), and the jobs that run it or take its
# locks when a run names no asset selection.
STREAM_ASSETS = ("bronze_events", "streaming_aggregates")
STREAM_JOBS = ("stream_catch_up", "switch_generation", "retire_generation", "__ASSET_JOB")


def runs_the_stream(job_name: str, asset_selection) -> bool:
    """Whether a run (its job, its asset keys; None: the job's own) runs the stream's query."""
    if asset_selection is not None:
        return any(key.path[-1] in STREAM_ASSETS for key in asset_selection)
    return job_name.endswith(STREAM_JOBS)


def _pipeline_of(run) -> str:
    """The pipeline a run belongs to: a spec pipeline's jobs are `<name>__<job>`, its assets
    `<prefix>/<key>` (a spec's prefix is its name unless it sets `asset_prefix`)."""
    if "__" in run.job_name and not run.job_name.startswith("__"):
        return run.job_name.split("__", 1)[0]
    keys = list(run.asset_selection or ())
    return keys[0].path[0] if keys and len(keys[0].path) > 1 else DEFAULT_PIPELINE


def _one_run_process() -> bool:
    """Whether this process is the `dagster` command running one run (`dagster asset
    materialize`, `dagster job execute`, the run launcher's `dagster api execute_run`): its JVM
    lives for that run only. Not in a test worker, the demo or any other host process, whose
    session outlives the run."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return argv0.name == "dagster" or argv0.parent.name == "dagster"


class LogPositionResource(ConfigurableResource):
    """Which prefix of the Kafka log the daily assets of a run compute from (one resolution per
    run; every daily asset of the run reads it, whatever else the run selects).

    - default: the newest bronze version when the run first needs it, pinned for the rest of
      the run and recorded as the run tag `lakehouse/bronze_version`;
    - `bronze_version`: exactly that bronze version (reproduce an earlier run);
    - `as_published`: per date, the version the date's published gold rows were computed from
      (verification of what is published, without touching gold); a date never corrected uses
      the run's pinned newest version.
    The bronze version stands for a Kafka position: the end offsets stamped on that bronze
    commit (`spark_jobs.tables.bronze_position`)."""

    bronze_version: int | None = Field(
        default=None, description="Compute from exactly this bronze version (default: newest).")
    as_published: bool = Field(
        default=False, description="Per date, the bronze version its gold rows were computed "
                                   "from (verify what is published).")
