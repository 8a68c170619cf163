"""The code location's component instances (`dg` defs folder): one folder per pipeline declared
as a `orchestration.components.PipelineComponent`, its `defs.yaml` holding a pipeline spec as
attributes (`dg scaffold defs orchestration.components.PipelineComponent <name>`, docs/specs.md).
Shipped empty: the default deployment's pipelines are the default one and PIPELINES'."""
