"""Pipelines as Dagster components (orchestration/components.py): a `defs.yaml` whose attributes
are a pipeline spec, validated by the spec's code; `dg` on the project (list, check, scaffold).
A scaffolded pipeline run end to end: tests/e2e/test_spec_pipeline_e2e.py (its module fixture)."""

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey
from jsonschema import Draft202012Validator

from assets.resources import LakehouseResource
from lakehouse.specs.pipeline import (
    DEFS_DIR,
    PIPELINE_COMPONENT,
    SpecError,
    load_spec,
    parse_spec,
    pipeline_specs,
    selected_pipeline,
    spec_json_schema,
)
from orchestration.components import scaffold_text
from orchestration.definitions import definitions_for

REPO = Path(__file__).resolve().parents[2]
DG = str(REPO / ".venv/bin/dg")
EXAMPLES = REPO / "examples"


def dg_env(home: Path, **extra: str) -> dict[str, str]:
    """dg's environment: an instance folder whose dagster.yaml turns telemetry off (dg reads it,
    not DAGSTER_DISABLE_TELEMETRY). One folder per process: dg commands started side by side on
    one instance race to create its SQLite schema (CI: `alembic_version` created twice)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())
    return {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_DISABLE_TELEMETRY": "true",
            "GX_ANALYTICS_ENABLED": "false", **extra}


def instance(folder: Path, name: str, attributes: dict) -> Path:
    path = folder / name / "defs.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"type": PIPELINE_COMPONENT, "attributes": attributes},
                                   sort_keys=False))
    return path


def orders() -> dict:
    return yaml.safe_load((EXAMPLES / "orders.yaml").read_text())


def causes(exc: BaseException) -> str:
    """An error's message with every cause's (Dagster wraps a component's load error)."""
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(out)


def test_the_project_ships_no_pipeline_component():
    """Its one component instance is the deployment's (the default pipeline and PIPELINES')."""
    assert list(DEFS_DIR.rglob("defs.yaml")) == [DEFS_DIR / "deployment" / "defs.yaml"]
    assert pipeline_specs({}) == []


def test_attributes_are_validated_by_the_spec_with_its_messages(tmp_path):
    """A bad field is named as a spec file's would be, with the defs.yaml for the file: by the
    specs' reader and by Dagster's component load alike."""
    bad = {**orders(), "measures": [{"field": "amout", "aggregates": ["sum"]}]}
    path = instance(tmp_path, "orders", bad)
    message = "measures[0].field: 'amout' is not a declared field"
    with pytest.raises(SpecError, match=r"defs\.yaml: measures\[0\]\.field: 'amout'"):
        pipeline_specs({"LAKEHOUSE_DEFS_DIR": str(tmp_path)})
    with pytest.raises(SpecError) as as_file:  # the same as the spec file's message
        parse_spec(bad, "orders.yaml")
    assert message in str(as_file.value)
    from orchestration.definitions import component_definitions

    with pytest.raises(Exception) as loaded:
        component_definitions(tmp_path)
    assert f"{path}: {message}" in causes(loaded.value) or f"defs.yaml: {message}" in causes(
        loaded.value)
    path.write_text(yaml.safe_dump({"type": PIPELINE_COMPONENT, "attributes": {"name": "x"}}))
    with pytest.raises(SpecError, match=r"defs\.yaml: topic: Field required"):
        pipeline_specs({"LAKEHOUSE_DEFS_DIR": str(tmp_path)})


def test_a_component_and_a_spec_file_of_one_name_are_refused(tmp_path):
    path = instance(tmp_path, "orders", orders())
    env = {"LAKEHOUSE_DEFS_DIR": str(tmp_path)}
    assert [s.name for s in pipeline_specs(env)] == ["orders"]
    with pytest.raises(SpecError, match="pipeline 'orders' is declared twice, by "
                                        "examples/orders.yaml and .*orders/defs.yaml"):
        pipeline_specs({**env, "PIPELINES": "examples/orders.yaml"})
    # PIPELINE may name a component's defs.yaml (make demo, make stream): read once.
    assert load_spec(path) == pipeline_specs(env)[0]
    for chosen in ({**env, "PIPELINE": str(path)}, {**env, "PIPELINE": str(path), "PIPELINES": str(path)}):
        spec, settings = selected_pipeline(chosen)
        assert spec.name == settings.pipeline == "orders"
    with pytest.raises(SpecError, match="LAKEHOUSE_DEFS_DIR=.*: no such folder"):
        pipeline_specs({"LAKEHOUSE_DEFS_DIR": str(tmp_path / "missing")})


def test_the_resource_and_the_service_run_component_pipelines(tmp_path):
    """What runs a pipeline outside the code location's load reads the components too: the
    `lakehouse` resource (each run's settings) and `make stream` (`service_pipelines`)."""
    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import service_pipelines

    instance(tmp_path, "orders", orders())
    env = {"LAKEHOUSE_DEFS_DIR": str(tmp_path), "LAKEHOUSE_ROOT": str(tmp_path / "lake")}
    with overridden(env):
        settings = LakehouseResource().settings_for("orders")
        served = service_pipelines()
    assert (settings.root, settings.events_topic) == (f"{tmp_path}/lake/orders", "orders")
    assert [s.pipeline for s in served] == ["default", "orders"]


def test_the_attributes_json_schema_takes_every_example_and_names_unknown_keys():
    schema = Draft202012Validator(spec_json_schema())
    for example in EXAMPLES.glob("*.yaml"):
        assert not list(schema.iter_errors(yaml.safe_load(example.read_text()))), example
    errors = [e.message for e in schema.iter_errors({**orders(), "colour": "blue"})]
    assert errors == ["Additional properties are not allowed ('colour' was unexpected)"]
    assert [e.message for e in schema.iter_errors({"name": "x"})] == ["'topic' is a required property"]


def test_a_component_pipeline_gets_the_spec_pipelines_definitions(tmp_path):
    """The same assets, checks, jobs, schedules and sensors as the spec of PIPELINES."""
    from assets.pipelines import DEFAULT
    from lakehouse.config.env import overridden

    instance(tmp_path, "orders", orders())
    with overridden({"LAKEHOUSE_DEFS_DIR": str(tmp_path)}):
        component = definitions_for([DEFAULT], LakehouseResource(), defs_folder=tmp_path)
    with overridden({"PIPELINES": str(EXAMPLES / "orders.yaml")}):
        from assets.pipelines import spec_pipelines

        listed = definitions_for([DEFAULT, *spec_pipelines()], LakehouseResource())

    def names(defs):
        graph = defs.resolve_asset_graph()
        return ({k.to_user_string() for k in graph.get_all_asset_keys()},
                {c.to_user_string() for c in graph.asset_check_keys},
                {j.name for j in defs.resolve_all_job_defs()},
                {s.name for s in defs.schedules}, {s.name for s in defs.sensors})

    assert names(component) == names(listed)
    assert AssetKey(["orders", "reconciled_aggregates"]) in component.resolve_all_asset_keys()


def test_dg_checks_and_lists_the_project_with_a_scaffolded_pipeline(tmp_path):
    """The scaffold `dg scaffold defs orchestration.components.PipelineComponent <path>` runs
    (`scaffold_object`, in-process here; the command itself: the e2e test) writes a valid spec;
    edited, it is a pipeline whose assets `dg list defs` lists under its prefix beside the
    default pipeline's (LAKEHOUSE_DEFS_DIR points at its folder); `dg check yaml` and `dg check
    defs` pass on the project; the default pipeline and a PIPELINES spec are the deployment
    component instance's (`dg list defs --path`, `dg list component-tree`). The commands run
    side by side."""
    from dagster.components.component_scaffolding import scaffold_object

    folder = tmp_path / "defs"
    scaffold_object(folder / "parcels", "orchestration.components.PipelineComponent", None, "yaml",
                    REPO)
    written = folder / "parcels" / "defs.yaml"
    assert written.read_text() == scaffold_text("parcels")
    assert load_spec(written).name == "parcels"
    # The edit: the pipeline's own topic, prefix and fields.
    doc = yaml.safe_load(written.read_text())
    doc["attributes"].update({"topic": "parcels-in", "asset_prefix": "parcel",
                              "fields": {**doc["attributes"]["fields"], "depot": "string"},
                              "dimensions": ["key", "depot"]})
    written.write_text(yaml.safe_dump(doc, sort_keys=False))
    commands = {"yaml": (["check", "yaml"], dg_env(tmp_path / "home-yaml")),
                "defs": (["check", "defs"], dg_env(tmp_path / "home-defs")),
                "list": (["list", "defs", "--json"],
                         dg_env(tmp_path / "home-list", LAKEHOUSE_DEFS_DIR=str(folder))),
                # The default pipeline and a PIPELINES spec: the deployment component's.
                "deployment": (["list", "defs", "--json", "--path", "orchestration/defs/deployment"],
                               dg_env(tmp_path / "home-deployment",
                                      PIPELINES=str(EXAMPLES / "orders.yaml"))),
                "tree": (["list", "component-tree"], dg_env(tmp_path / "home-tree"))}
    running = {k: subprocess.Popen([DG, *cmd], env=e, cwd=REPO, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for k, (cmd, e) in commands.items()}
    outs = {k: p.communicate(timeout=600) for k, p in running.items()}
    assert {k: p.returncode for k, p in running.items()} == dict.fromkeys(commands, 0), {
        k: (o + e)[-3000:] for k, (o, e) in outs.items()}
    assert "All component YAML validated successfully." in outs["yaml"][0]
    assert "All definitions loaded successfully." in "".join(outs["defs"])
    assets = {a["asset_key"] for a in yaml.safe_load(outs["list"][0])["assets"]}
    assert {"raw_events", "bronze_events", "streaming_aggregates", "late_corrections",
            "reconciled_aggregates", "replay_aggregates"} <= assets
    assert {f"parcel/{a}" for a in ("raw_events", "bronze_events", "reconciled_aggregates",
                                    "replay_aggregates")} <= assets
    deployed = {a["asset_key"] for a in yaml.safe_load(outs["deployment"][0])["assets"]}
    assert {"raw_events", "reconciled_aggregates", "orders/raw_events",
            "orders/reconciled_aggregates"} <= deployed
    assert "deployment" in outs["tree"][0] and "DeploymentComponent" in outs["tree"][0]


def test_the_scaffold_is_a_valid_minimal_spec():
    spec = parse_spec(yaml.safe_load(scaffold_text("parcels"))["attributes"])
    assert (spec.name, spec.source.topic, spec.prefix) == ("parcels", "parcels", "parcels")
    with pytest.raises(SpecError, match="is not a column name"):
        parse_spec(yaml.safe_load(scaffold_text("Parcels"))["attributes"])
