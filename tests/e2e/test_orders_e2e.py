"""The order pipeline through Dagster, beside the default one in one code location: added as
docs/specs.md says (`dg scaffold defs orchestration.components.PipelineComponent orders` in a
defs folder the code location loads, LAKEHOUSE_DEFS_DIR, then the YAML edited to the order
spec), its prefixed jobs catch the stream up, correct and prove each date (gold == replay == the
independent reference), and neither pipeline's runs touch the other's tables or checkpoints.
(Without a broker: tests/unit/test_pipeline_components.py.)"""

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey

from assets.resources import LakehouseResource
from lakehouse.tables.reads import bronze_dates, read
from orchestration.definitions import definitions_for
from testkit.runs import run_in

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def orders_spec(folder: Path) -> Path:
    """The order example with a topic of its own (tests share one broker)."""
    import uuid

    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = f"orders-{uuid.uuid4().hex[:8]}"
    path = folder / "orders.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def scaffold_and_edit(folder: Path, name: str, spec: dict) -> Path:
    """`dg scaffold defs orchestration.components.PipelineComponent <folder>/<name>`, then the
    edit a user makes: the spec's topic, fields, event id and time, dimensions and measures."""
    import os
    import subprocess

    home = folder.parent / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())  # no telemetry
    done = subprocess.run(
        [str(REPO / ".venv/bin/dg"), "scaffold", "defs", "orchestration.components.PipelineComponent",
         str(folder / name)], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "DAGSTER_HOME": str(home)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    path = folder / name / "defs.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["attributes"]["name"] == name  # named after its folder
    doc["attributes"].update({k: v for k, v in spec.items() if k != "name"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tree(root: Path) -> dict[str, float]:
    """Every file under `root` with its modification time (what a run may have touched)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@pytest.fixture(scope="module")
def two_pipelines(tmp_path_factory, kafka_bootstrap):
    """One code location with the default pipeline and the orders one; the orders pipeline run
    through its prefixed jobs (two catch-ups, each followed by the proof of every date, so late
    orders correct published windows). Yields what the tests look at."""
    import uuid
    from types import SimpleNamespace

    from dagster import DagsterInstance

    from assets.pipelines import Pipeline, spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.specs.pipeline import defs_dir, load_spec
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("two")
    folder = tmp / "defs"
    folder.mkdir()
    spec_path = scaffold_and_edit(folder, "orders", yaml.safe_load(orders_spec(tmp).read_text()))
    lake = tmp / "lake"
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(lake),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "LAKEHOUSE_DEFS_DIR": str(folder)}
    with overridden(env):
        default = Pipeline.of(Settings.from_env())
        # The code location of this environment, as orchestration.definitions builds it (the
        # module's was built when the tests started).
        defs = definitions_for([default, *spec_pipelines()], LakehouseResource(),
                               defs_folder=defs_dir())
        assert AssetKey(["orders", "reconciled_aggregates"]) in defs.resolve_all_asset_keys()
        spec, instance = load_spec(spec_path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("orders")
        assert settings.root == f"{lake}/orders"
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        records = generate_for_spec(spec, GeneratorConfig(
            count=1200, seed=9, end=end, span=timedelta(hours=4), late_fraction=0.05,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        half, proofs = len(records) // 2, []
        for chunk in (records[:half], records[half:]):
            produce(settings, chunk)
            assert run_in(defs, "orders__stream_catch_up", instance)[0].success
            for d in sorted(bronze_dates(settings)):
                result, checks = run_in(defs, "orders__reconcile_dates", instance,
                                     partition_key=d.isoformat())
                proofs.append((result.success, [(c.check_name, c.passed) for c in checks]))
        yield SimpleNamespace(defs=defs, spec=spec, instance=instance, lake=lake,
                              settings=settings, records=records, proofs=proofs,
                              written=tree(lake))


def test_orders_through_dagster_equal_the_reference_and_stay_in_their_folder(two_pipelines):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    t = two_pipelines
    settings, spec, records = t.settings, t.spec, t.records
    assert settings.root == f"{t.lake}/orders"
    # Every run succeeded and both blocking checks passed, for every date, each time.
    assert t.proofs and all(ok and checks and all(p for _, p in checks) for ok, checks in t.proofs)
    assert {name for _, checks in t.proofs for name, _ in checks} == {
        "reconciled_equals_replay", "fast_path_vs_replay"}
    expected = expected_windows_for_spec(spec, records)
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    assert read(settings, "late_corrections").num_rows > 0
    assert read(settings, "late_events").num_rows > 0
    # Every bad order is quarantined with its field's reason.
    bad = Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    assert Counter(read(settings, "quarantined_events")["reason"].to_pylist()) == bad
    assert {"missing_region", "amount_too_precise", "invalid_amount"} <= set(bad)
    # Only the orders folder was written: no default table, checkpoint or report appeared.
    assert all(p.startswith("orders/") for p in t.written), sorted(t.written)[:5]
    assert {p.split("/")[1] for p in t.written} >= {"bronze_events", "_checkpoints",
                                                   "reconciled_aggregates"}


def test_the_default_pipeline_never_touches_the_orders_folder(two_pipelines):
    from testkit.generator import GeneratorConfig, generate, produce

    t = two_pipelines
    default = t.defs.resources["lakehouse"].settings
    produce(default, generate(GeneratorConfig(count=200, seed=3, span=timedelta(hours=1)))
            .records)
    orders_before = tree(t.lake / "orders")
    assert orders_before  # the orders pipeline's tables are there (the fixture ran it)
    result, _ = run_in(t.defs, "stream_catch_up", t.instance)
    assert result.success
    assert read(default, "bronze_events").num_rows > 0
    assert tree(t.lake / "orders") == orders_before


def test_a_spec_change_leaves_the_dates_computed_before_stale(two_pipelines, tmp_path):
    """The spec version is the assets' code version: with the spec the dates were computed under,
    Dagster finds them fresh; after a change of what they hold (a new measure aggregate), stale,
    the cause a changed code version; a change of no result (another topic) keeps them fresh."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from assets.pipelines import Pipeline
    from lakehouse.specs.pipeline import load_spec

    t = two_pipelines
    gold = AssetKey(["orders", "reconciled_aggregates"])

    def status(spec_data: dict) -> list:
        path = tmp_path / f"orders-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(spec_data))
        spec = load_spec(path)
        settings = spec.settings(t.defs.resources["lakehouse"].settings, {})
        defs = definitions_for([Pipeline.of(settings, spec.prefix)], LakehouseResource())
        resolver = CachingStaleStatusResolver(t.instance, defs.get_repository_def().asset_graph,
                                              LoadingContextForTest(t.instance))
        return [(resolver.get_status(gold, d.isoformat()),
                 [c.category.name for c in resolver.get_stale_causes(gold, d.isoformat())])
                for d in sorted(bronze_dates(t.settings))]

    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = t.settings.events_topic
    assert {s for s, _ in status(spec)} == {StaleStatus.FRESH}
    assert {s for s, _ in status({**spec, "topic": "orders-elsewhere"})} == {StaleStatus.FRESH}
    changed = {**spec, "measures": [{"field": "amount", "aggregates": ["sum", "max"]}]}
    after = status(changed)
    assert after and all(s == StaleStatus.STALE and "CODE" in c for s, c in after), after
