"""The Dagster code location: `dagster ... -m orchestration.definitions`.

Its pipelines: the default one (the tables at LAKEHOUSE_ROOT, the contract's unprefixed names),
one per spec named by PIPELINES (comma-separated YAML paths), and one per pipeline component in
the defs folder (`orchestration/defs/<name>/defs.yaml`, or LAKEHOUSE_DEFS_DIR; loaded by
Dagster's component tree, `orchestration.components`), read and validated side by side here when
the code location loads: a bad spec fails the load with its file and field named, one pipeline
name declared twice fails it too.
"""


import atexit
import gc
import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

# A process that loaded the code location (a run's `dagster asset materialize` or `dagster api
# execute_run` above all) spent ~1.5 s at its exit in the collector's last pass over the millions
# of objects its imports built (Dagster, Great Expectations, pandas): frozen, they are left to
# the process's end like the rest of its memory; atexit handlers and `__del__` of objects
# outside cycles run as before (measured 2026-11-29, commit 0302327).
atexit.register(gc.freeze)

import importlib  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from dagster import BetaWarning, ComponentTree, Definitions, PreviewWarning, in_process_executor  # noqa: E402

from assets.pipelines import DEFAULT, Pipeline, spec_pipelines  # noqa: E402
from assets.resources import DEFAULT_LAKEHOUSE, KafkaResource, LakehouseResource, LogPositionResource, SparkResource  # noqa: E402
from lakehouse.specs.pipeline import DEFS_DIR, SpecError, declared_specs, defs_dir  # noqa: E402
from orchestration.components import PipelineComponent, pipeline_definitions  # noqa: E402
from orchestration.sensors import dead_runs_sensor  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def component_definitions(folder: Path) -> tuple[Definitions, list[str]]:
    """The definitions of the component instances under `folder` (Dagster's component tree, as
    `dg` loads orchestration/defs) and the names of the pipelines they declare. They must be the
    pipelines `declared_specs` reads there (what the resource, the service and the daily metrics
    run): a pipeline component is declared with its full type name."""
    if folder.resolve() == DEFS_DIR:
        module = importlib.import_module("orchestration.defs")
    else:  # LAKEHOUSE_DEFS_DIR: a folder of defs.yaml files, outside the packages
        module = types.ModuleType("lakehouse_defs")
        module.__file__, module.__path__ = None, [str(folder)]
    tree = ComponentTree.from_module(defs_module=module, project_root=PROJECT_ROOT)
    with warnings.catch_warnings():  # Dagster's own loaders and code references, "in preview/beta"
        warnings.simplefilter("ignore", PreviewWarning)
        warnings.simplefilter("ignore", BetaWarning)
        built = tree.build_defs()
        names = [c.spec.name for c in tree.get_all_components(of_type=PipelineComponent)]
    read = sorted(s.name for s in declared_specs(folder).values())
    if sorted(names) != read:
        raise SpecError(f"{folder}: the pipeline components loaded ({', '.join(names) or 'none'}) "
                        f"are not those declared with `type: orchestration.components."
                        f"PipelineComponent` ({', '.join(read) or 'none'}): write that type in "
                        "each pipeline's defs.yaml")
    return built, names


def definitions_for(pipelines: Sequence[Pipeline],
                    lakehouse: LakehouseResource = DEFAULT_LAKEHOUSE,
                    defs_folder: Path | None = None) -> Definitions:
    """The code location of `pipelines`: their definitions and the resources they share. By
    default the `lakehouse` resource is the one the default's partitions, crons and freshness
    checks were built from; it resolves every pipeline's settings (`settings_for`). With
    `defs_folder`, its pipeline components are built by Dagster's component tree (the others by
    the same factories, `pipeline_definitions`)."""
    components, declared = (component_definitions(defs_folder) if defs_folder is not None
                            else (Definitions(), []))
    return Definitions.merge(*(pipeline_definitions(p) for p in pipelines
                               if p.name not in declared), components, Definitions(
        resources={
            "lakehouse": lakehouse,
            "kafka": KafkaResource(lakehouse=lakehouse),
            "spark": SparkResource(lakehouse=lakehouse),
            "log_position": LogPositionResource(),
        },
        # Spark runs in one process per run: steps share the session instead of each starting
        # a JVM.
        executor=in_process_executor,
        sensors=[dead_runs_sensor],
    ))


# Every pipeline of the code location: the default, PIPELINES', the defs folder's components.
PIPELINES = [DEFAULT, *spec_pipelines()]
defs = definitions_for(PIPELINES, defs_folder=defs_dir())
