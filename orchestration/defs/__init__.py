"""The code location's component instances (`dg` defs folder): one folder per pipeline declared
as a `orchestration.components.PipelineComponent`, its `defs.yaml` holding a pipeline spec as
attributes (`dg scaffold defs orchestration.components.PipelineComponent <name>`, docs/specs.md).
Shipped with one instance, `deployment/` (`orchestration.components.DeploymentComponent`): the
default pipeline and one per spec PIPELINES names, with the resources every pipeline shares."""
