"""The pipelines of the code location, each a `Pipeline` its definitions are built from.

The default pipeline (tables at LAKEHOUSE_ROOT) keeps the contract's names: unprefixed asset
keys, groups `ingest`, `reconcile`, `observe`, jobs such as `stream_catch_up`. A pipeline of a
spec (PIPELINES, `lakehouse.specs.pipeline`) gets the same definitions under its prefix: keys
`orders/bronze_events`, groups `orders_ingest`, jobs `orders__stream_catch_up`. Every factory
(`assets.ingest.ingest_assets`, `orchestration.jobs.pipeline_jobs`...) takes a `Pipeline` and is
cached: one set of definitions per pipeline, the default's being the factories called with
`DEFAULT`. There are no module-level definitions: `orchestration.definitions.defs` holds them
(tests look them up by name there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date

from dagster import AssetKey, DailyPartitionsDefinition

from assets.partitions import daily_event_dates, first_partition
from assets.resources import DEFAULT_LAKEHOUSE
from lakehouse.config.settings import Settings
from lakehouse.specs.pipeline import PipelineSpec, pipeline_specs


@dataclass(frozen=True, eq=False)
class Pipeline:
    """One pipeline's names and the settings its definitions were built from (when the code
    location loaded: crons, thresholds, partitions). At run time assets read their settings
    from the `lakehouse` resource, `lakehouse.settings_for(pipeline.name)` (run overrides)."""

    prefix: str | None  # None: the default pipeline
    settings: Settings
    first_partition: date
    partitions: DailyPartitionsDefinition

    @classmethod
    def of(cls, settings: Settings, prefix: str | None = None) -> Pipeline:
        first = first_partition(settings)
        return cls(prefix, settings, first, daily_event_dates(first))

    @property
    def name(self) -> str:
        return self.settings.pipeline

    @property
    def code_version(self) -> str:
        """The assets' code version: the pipeline's spec version (`Settings.results_version`),
        so Dagster shows the partitions materialized under an older spec as stale."""
        return self.settings.results_version

    @property
    def owners(self) -> list[str]:
        """Its assets' Dagster owners: the spec's `owners`, else PIPELINE_OWNER's entries that
        are an e-mail address or `team:<name>` (`Settings.asset_owners`)."""
        return self.settings.asset_owners

    def key(self, name: str) -> AssetKey:
        """An asset key: `bronze_events`, `orders/bronze_events`."""
        return AssetKey([self.prefix, name] if self.prefix else [name])

    def group(self, domain: str) -> str:
        """An asset group: `ingest`, `orders_ingest`."""
        return f"{self.prefix}_{domain}" if self.prefix else domain

    def named(self, name: str) -> str:
        """A job, schedule, sensor, op or pool name: `stream_catch_up`, `orders__stream_catch_up`."""
        return f"{self.prefix}__{name}" if self.prefix else name


DEFAULT = Pipeline.of(DEFAULT_LAKEHOUSE.settings)


def spec_pipeline(spec: PipelineSpec, env: Mapping[str, str] | None = None) -> Pipeline:
    """A spec's pipeline: its settings the default's with the spec on top."""
    env = os.environ if env is None else env
    return Pipeline.of(spec.settings(DEFAULT.settings, env), spec.prefix)


def spec_pipelines(env: Mapping[str, str] | None = None) -> list[Pipeline]:
    """The pipelines of the specs PIPELINES names and of the pipeline components in the defs
    folder, validated (a SpecError names the file and the field)."""
    env = os.environ if env is None else env
    return [spec_pipeline(spec, env) for spec in pipeline_specs(env)]
