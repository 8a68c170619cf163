"""Pipelines as Dagster components: `PipelineComponent`, whose attributes are a pipeline spec.

An instance is a folder of the code location's defs folder (`orchestration/defs/<name>/`, or
LAKEHOUSE_DEFS_DIR) holding a `defs.yaml`:

    type: orchestration.components.PipelineComponent
    attributes: {name: shipments, topic: shipments, ...}   # a spec's fields (docs/specs.md)

`dg scaffold defs orchestration.components.PipelineComponent shipments` writes one with a valid
minimal spec to edit. The attributes are validated by the spec's own code (`lakehouse.specs.pipeline`, the
same messages, naming the defs.yaml and the field), and the instance builds the definitions of
that pipeline, the same as for a spec of PIPELINES (`pipeline_definitions`): assets under its
prefix, its checks, jobs, schedules and sensors. The resources are the code location's
(`orchestration.definitions`). `dg check yaml` checks the attributes' keys (`spec_json_schema`);
`dg check defs` and the code location's load check the rest.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import yaml
from pydantic import BaseModel, ConfigDict

from assets.ingest import ingest_assets
from assets.observe.freshness import freshness_checks_for
from assets.observe.scorecard import scorecard_asset
from assets.observe.timeline import timeline_asset
from assets.pipelines import DEFAULT, Pipeline, spec_pipeline, spec_pipelines
from assets.reconcile.checks import data_checks
from assets.reconcile.daily import daily_assets
from assets.reconcile.feed import feed_asset
from assets.resources import DEFAULT_LAKEHOUSE, KafkaResource, LakehouseResource, LogPositionResource, SparkResource
from lakehouse.specs.pipeline import (
    PIPELINE_COMPONENT,
    PipelineSpec,
    component_spec,
    declared_specs,
    defs_dir,
    parse_spec,
    spec_json_schema,
)
from orchestration.jobs import pipeline_jobs
from orchestration.schedules import pipeline_schedules
from orchestration.sensors import dead_runs_sensor, pipeline_sensors


def pipeline_definitions(p: Pipeline) -> dg.Definitions:
    """One pipeline's definitions. By domain: ingest (the stream), reconcile (corrections,
    replay, the proof), observe (the timeline, the topic, freshness); maintain is a job."""
    return dg.Definitions(
        assets=[*ingest_assets(p), *daily_assets(p), feed_asset(p), timeline_asset(p),
                scorecard_asset(p)],
        asset_checks=[*data_checks(p), *freshness_checks_for(p)],
        jobs=list(pipeline_jobs(p).values()),
        schedules=pipeline_schedules(p),
        sensors=pipeline_sensors(p),
    )


def shared_definitions(lakehouse: LakehouseResource) -> dg.Definitions:
    """What every pipeline of a code location shares: the resources (`lakehouse` resolves each
    pipeline's settings, `settings_for`: the one the default pipeline's partitions, crons and
    freshness checks were built from), one process per run (steps share its Spark session
    instead of each starting a JVM), and the sensor of runs whose worker died."""
    return dg.Definitions(
        resources={
            "lakehouse": lakehouse,
            "kafka": KafkaResource(lakehouse=lakehouse),
            "spark": SparkResource(lakehouse=lakehouse),
            "log_position": LogPositionResource(),
        },
        executor=dg.in_process_executor,
        sensors=[dead_runs_sensor],
    )


def definitions_of(pipelines: list[Pipeline], lakehouse: LakehouseResource) -> dg.Definitions:
    """`pipelines`' definitions and what they share (`shared_definitions`)."""
    return dg.Definitions.merge(*map(pipeline_definitions, pipelines), shared_definitions(lakehouse))


def _schema(schema: dict[str, Any]) -> None:
    schema.clear()
    schema.update(spec_json_schema())


class PipelineAttributes(BaseModel):
    """The attributes as written: any mapping here (the spec's code validates them in
    `PipelineComponent.load`, with its messages); its JSON schema is the spec's
    (`spec_json_schema`), for `dg check yaml` and editors."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_schema)


def scaffold_text(name: str) -> str:
    """The defs.yaml of a new pipeline `name`: a valid minimal spec (the contract's event shape)
    to edit into the topic's own."""
    return f"""\
type: {PIPELINE_COMPONENT}
# A pipeline spec (docs/specs.md): the topic, the event's fields, what to group by and sum.
attributes:
  name: {name}
  topic: {name}
  fields:
    event_id: string
    key: string
    event_time: timestamp
    value: decimal(38,6)
  event_id: event_id
  event_time: {{field: event_time, formats: [iso8601, epoch_millis]}}
  dimensions: [key]
  measures:
    - {{field: value, aggregates: [sum, min, max]}}
  window: {{size: 1 minute, watermark_delay: 30 seconds, correction_horizon: 7 days}}
"""


class PipelineScaffolder(dg.Scaffolder):
    """`dg scaffold defs orchestration.components.PipelineComponent <name>`: the folder's
    defs.yaml, a spec named after the folder, checked before it is written."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = request.target_path.name
        text = scaffold_text(name)
        parse_spec(yaml.safe_load(text)["attributes"],
                   f"{name} (the folder's name)")
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(text)


@dg.scaffold_with(PipelineScaffolder)
class PipelineComponent(dg.Component):
    """A pipeline declared as a component: its attributes are a pipeline spec's fields (`name`,
    `topic`, `fields`, `event_id`, `event_time`, `dimensions`, `measures`, `window`, optional
    `tables`, `asset_prefix`, `kafka_options`, `secret_env`, `format`, `avro`; docs/specs.md).
    It builds the pipeline's assets (under its prefix), checks, jobs, schedules and sensors."""

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return PipelineAttributes

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> PipelineComponent:
        yaml_path = next((p for p in (context.path / "defs.yaml", context.path / "defs.yml")
                          if p.exists()), context.path / "defs.yaml")
        return cls(component_spec(attributes.model_extra if attributes else None, yaml_path))

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return pipeline_definitions(spec_pipeline(self.spec))


class DeploymentComponent(dg.Component):
    """The deployment's own pipelines as one component instance
    (`orchestration/defs/deployment/defs.yaml`, no attributes): the default pipeline (the tables
    at LAKEHOUSE_ROOT, the contract's unprefixed names) and one per spec PIPELINES names, with
    what every pipeline of the code location shares (`shared_definitions`). The defs folder's
    pipeline components are instances of their own. The default's settings are
    `DEFAULT_LAKEHOUSE`'s (the `lakehouse` resource), the PIPELINES specs read at the load."""

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return self.definitions()

    @staticmethod
    def definitions() -> dg.Definitions:
        """The instance's definitions (a code location whose defs folder is LAKEHOUSE_DEFS_DIR
        merges them beside that folder's tree)."""
        components = {s.name for s in declared_specs(defs_dir()).values()}
        return definitions_of([DEFAULT, *(p for p in spec_pipelines() if p.name not in components)],
                              DEFAULT_LAKEHOUSE)
