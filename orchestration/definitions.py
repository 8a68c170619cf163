"""The Dagster code location: `dagster ... -m orchestration.definitions`.

Every definition is a component instance's (Dagster's component tree, `orchestration.components`):
the deployment component (`orchestration/defs/deployment/defs.yaml`: the default pipeline, the
tables at LAKEHOUSE_ROOT under the contract's unprefixed names, and one per spec named by
PIPELINES, comma-separated YAML paths) and one pipeline component per folder of the defs folder
(`orchestration/defs/<name>/defs.yaml`, or LAKEHOUSE_DEFS_DIR), read and validated side by side
when the code location loads: a bad spec fails the load with its file and field named, one
pipeline name declared twice fails it too.
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

from dagster import BetaWarning, ComponentTree, Definitions, PreviewWarning  # noqa: E402

from assets.pipelines import Pipeline, spec_pipelines  # noqa: E402
from assets.resources import DEFAULT_LAKEHOUSE, LakehouseResource  # noqa: E402
from lakehouse.specs.pipeline import DEFS_DIR, SpecError, declared_specs, defs_dir  # noqa: E402
from orchestration.components import DeploymentComponent, PipelineComponent, definitions_of  # noqa: E402

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
    """A code location of exactly `pipelines` (a test's, a drill's, beside the deployment's):
    their definitions and the resources they share, `lakehouse` resolving every pipeline's
    settings. With `defs_folder`, its pipeline components are built by Dagster's component
    tree (the others by the same factories, `definitions_of`)."""
    components, declared = (component_definitions(defs_folder) if defs_folder is not None
                            else (Definitions(), []))
    return Definitions.merge(definitions_of([p for p in pipelines if p.name not in declared],
                                            lakehouse), components)


def code_location(folder: Path | None = None) -> Definitions:
    """The code location, all of it component instances: orchestration/defs' (the deployment
    component, `orchestration/defs/deployment`: the default pipeline, PIPELINES' specs and the
    resources they share; and a pipeline component per folder a user adds). With another defs
    folder (`folder`, LAKEHOUSE_DEFS_DIR), that folder's pipeline components and the deployment
    component's definitions. Built from the environment of the load."""
    folder = folder or defs_dir()
    spec_pipelines()  # every spec read and checked first: a bad one fails with its own message
    built, _ = component_definitions(folder)
    if folder.resolve() != DEFS_DIR:  # a tree of its own: the deployment's beside it
        built = Definitions.merge(built, DeploymentComponent.definitions())
    return built


defs = code_location()
