"""The Dagster code location: `dagster ... -m orchestration.definitions`.

Its pipelines: the default one (the tables at LAKEHOUSE_ROOT, the contract's unprefixed names)
and one per spec named by PIPELINES (comma-separated YAML paths), read and validated here when
the code location loads: a bad spec fails the load with its file and field named.
"""


import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from collections.abc import Sequence  # noqa: E402

from dagster import Definitions, in_process_executor  # noqa: E402

from assets.ingest import ingest_assets  # noqa: E402
from assets.observe.freshness import freshness_checks_for  # noqa: E402
from assets.observe.timeline import timeline_asset  # noqa: E402
from assets.pipelines import DEFAULT, Pipeline, spec_pipelines  # noqa: E402
from assets.reconcile.checks import data_checks  # noqa: E402
from assets.reconcile.daily import daily_assets  # noqa: E402
from assets.resources import DEFAULT_LAKEHOUSE, KafkaResource, LakehouseResource, LogPositionResource, SparkResource  # noqa: E402
from orchestration.jobs import pipeline_jobs  # noqa: E402
from orchestration.schedules import pipeline_schedules  # noqa: E402
from orchestration.sensors import pipeline_sensors  # noqa: E402


def pipeline_definitions(p: Pipeline) -> Definitions:
    """One pipeline's definitions. By domain: ingest (the stream), reconcile (corrections,
    replay, the proof), observe (the timeline, the topic, freshness); maintain is a job."""
    return Definitions(
        assets=[*ingest_assets(p), *daily_assets(p), timeline_asset(p)],
        asset_checks=[*data_checks(p), *freshness_checks_for(p)],
        jobs=list(pipeline_jobs(p).values()),
        schedules=pipeline_schedules(p),
        sensors=pipeline_sensors(p),
    )


def definitions_for(pipelines: Sequence[Pipeline],
                    lakehouse: LakehouseResource = DEFAULT_LAKEHOUSE) -> Definitions:
    """The code location of `pipelines`: their definitions and the resources they share. By
    default the `lakehouse` resource is the one the default's partitions, crons and freshness
    checks were built from; it resolves every pipeline's settings (`settings_for`)."""
    return Definitions.merge(*map(pipeline_definitions, pipelines), Definitions(
        resources={
            "lakehouse": lakehouse,
            "kafka": KafkaResource(lakehouse=lakehouse),
            "spark": SparkResource(lakehouse=lakehouse),
            "log_position": LogPositionResource(),
        },
        # Spark runs in one process per run: steps share the session instead of each starting
        # a JVM.
        executor=in_process_executor,
    ))


PIPELINES = [DEFAULT, *spec_pipelines()]
defs = definitions_for(PIPELINES)
