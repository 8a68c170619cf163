"""A pipeline added as docs/specs.md says: `dg scaffold defs` and a YAML edit, in a defs folder
the code location loads (LAKEHOUSE_DEFS_DIR), beside the default pipeline. Its prefixed jobs catch
its stream up and reconcile every date on the real broker: gold == replay == the independent
reference, in its own folder. (Without a broker: tests/unit/test_pipeline_components.py.)"""

import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from lakehouse.tables.reads import bronze_dates, read
from testkit.runs import run_in

REPO = Path(__file__).resolve().parents[2]


def scaffold_and_edit(folder: Path, topic: str) -> Path:
    """`dg scaffold defs orchestration.components.PipelineComponent <folder>/parcels`, then the
    edit a user makes: the topic, the event's own fields, what to group by and sum."""
    home = folder.parent / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())  # no telemetry
    done = subprocess.run(
        [str(REPO / ".venv/bin/dg"), "scaffold", "defs", "orchestration.components.PipelineComponent",
         str(folder / "parcels")], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "DAGSTER_HOME": str(home)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    path = folder / "parcels" / "defs.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["attributes"].update({
        "topic": topic,
        "fields": {"parcel_id": "string", "depot": "string", "shipped_at": "timestamp",
                   "weight": "decimal(12,3)"},
        "event_id": "parcel_id",
        "event_time": {"field": "shipped_at", "formats": ["iso8601", "epoch_millis"]},
        "dimensions": ["depot"],
        "measures": [{"field": "weight", "aggregates": ["sum", "max"]}],
    })
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.slow  # a catch-up and two dates' reconciliation: over a minute alone
def test_a_scaffolded_pipeline_catches_up_and_reconciles(tmp_path, kafka_bootstrap):
    from assets.pipelines import Pipeline, spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.specs.pipeline import defs_dir, load_spec
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import expected_windows_for_spec, generate_for_spec, table_windows_for_spec

    folder = tmp_path / "defs"
    folder.mkdir()
    spec_path = scaffold_and_edit(folder, f"parcels-{uuid.uuid4().hex[:8]}")
    lake = tmp_path / "lake"
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(lake),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "LAKEHOUSE_DEFS_DIR": str(folder)}
    with overridden(env):
        # The code location of this environment, as orchestration.definitions builds it.
        defs = definitions_for([Pipeline.of(Settings.from_env()), *spec_pipelines()],
                               LakehouseResource(), defs_folder=defs_dir())
        assert AssetKey(["parcels", "reconciled_aggregates"]) in defs.resolve_all_asset_keys()
        spec, instance = load_spec(spec_path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("parcels")
        assert settings.root == f"{lake}/parcels"
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        records = generate_for_spec(spec, GeneratorConfig(
            count=600, seed=17, end=end, span=timedelta(hours=3), late_fraction=0.05,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        produce(settings, records)
        assert run_in(defs, "parcels__stream_catch_up", instance)[0].success
        dates = sorted(bronze_dates(settings))
        assert dates
        for d in dates:
            result, checks = run_in(defs, "parcels__reconcile_dates", instance,
                                    partition_key=d.isoformat())
            assert result.success, d
            assert {c.check_name: c.passed for c in checks} == {
                "reconciled_equals_replay": True, "fast_path_vs_replay": True}, d
        expected = expected_windows_for_spec(spec, records)
        assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
        assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    # Only the pipeline's own folder was written.
    assert {p.relative_to(lake).parts[0] for p in lake.rglob("*") if p.is_file()} == {"parcels"}
