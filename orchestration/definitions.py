"""The Dagster code location: `dagster ... -m orchestration.definitions`."""


import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from dagster import Definitions, in_process_executor, load_assets_from_modules  # noqa: E402

from assets import ingest  # noqa: E402
from assets.observe import timeline  # noqa: E402
from assets.observe.freshness import freshness_checks  # noqa: E402
from assets.reconcile import checks, daily  # noqa: E402
from assets.resources import DEFAULT_LAKEHOUSE, KafkaResource, LogPositionResource, SparkResource  # noqa: E402
from orchestration.jobs import all_jobs  # noqa: E402
from orchestration.schedules import all_schedules  # noqa: E402
from orchestration.sensors import all_sensors  # noqa: E402

# The settings the partitions, crons and freshness checks were built from, bound as the resource.
lakehouse = DEFAULT_LAKEHOUSE

defs = Definitions(
    # By domain: ingest (the stream), reconcile (corrections, replay, the proof), observe (the
    # timeline, the topic, freshness); maintain is a job (orchestration.jobs).
    assets=load_assets_from_modules([ingest, daily, timeline]),
    asset_checks=[checks.reconciled_equals_replay, checks.fast_path_vs_replay, *freshness_checks],
    jobs=all_jobs,
    schedules=all_schedules,
    sensors=all_sensors,
    resources={
        "lakehouse": lakehouse,
        "kafka": KafkaResource(lakehouse=lakehouse),
        "spark": SparkResource(lakehouse=lakehouse),
        "log_position": LogPositionResource(),
    },
    # Spark runs in one process per run: steps share the session instead of each starting a JVM.
    executor=in_process_executor,
)
