"""Dagster resources: the pipeline's settings and one SparkSession per run process."""


from dataclasses import replace
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import PrivateAttr
from pyspark.sql import SparkSession

from lakehouse.settings import Settings


class LakehouseResource(ConfigurableResource):
    """The typed settings (env vars, DESIGN §7); fields here override them (tests, UI)."""

    lakehouse_root: str | None = None
    events_topic: str | None = None
    kafka_bootstrap_servers: str | None = None

    @property
    def settings(self) -> Settings:
        base = Settings.from_env()
        overrides = {
            "lakehouse_root": Path(self.lakehouse_root) if self.lakehouse_root else None,
            "events_topic": self.events_topic,
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
        }
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


class SparkResource(ConfigurableResource):
    """Creates the session on first use, so runs that need no Spark start no JVM. With the
    in-process executor every step of a run shares it."""

    lakehouse: LakehouseResource
    _session: SparkSession | None = PrivateAttr(default=None)

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            from spark_jobs.session import get_spark

            self._session = get_spark(self.lakehouse.settings)
        return self._session
