"""A spec pipeline through Dagster, beside the default one in one code location, added as
docs/specs.md says: `dg scaffold defs orchestration.components.PipelineComponent clash` in a defs
folder the code location loads (LAKEHOUSE_DEFS_DIR), then the YAML edited to the spec below.
Its prefixed jobs catch the stream up twice, each time correcting and proving every date (gold ==
replay == the independent reference), and neither pipeline's runs touch the other's tables or
checkpoints. (Without a broker: tests/unit/test_pipeline_components.py.)

The spec's names are the ones the Spark code once used for its own working columns: the
dimensions `id`, `window`, `has_late`, `mode`, `action` and `closed` and the measure field `time`
(they clashed with the parser's `_id_type`/`_time_text`, the window struct, the proofs' and the
changelog's `has_late`/`mode`, the corrections' diff), through classify, the catch-ups,
corrections, the replay and the proof. (`_commit_version` and any name starting with _ is
refused at load: tests/unit/test_spec.py.)"""

import subprocess
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from dagster import AssetKey

from assets.resources import LakehouseResource
from lakehouse.tables.reads import bronze_dates, read
from orchestration.definitions import definitions_for
from testkit.runs import run_in

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "clash",
    "fields": {"oid": "string", "at": "timestamp", "g": "string", "n": "long",
               "time": "decimal(12,2)"},
    "event_id": "oid",
    "event_time": {"field": "at", "formats": ["iso8601", "epoch_millis"]},
    # Several dimensions read one field: 25 value combinations, so late events land in
    # published windows and correct them.
    "dimensions": [{"name": "id", "field": "g"}, {"name": "window", "field": "n"},
                   {"name": "has_late", "field": "g"}, {"name": "mode", "field": "g"},
                   {"name": "action", "field": "n"}, {"name": "closed", "field": "g"}],
    "measures": [{"field": "time"}],
    "window": {"size": "10 minutes"},
}


def scaffold_and_edit(folder: Path, name: str, spec: dict) -> Path:
    """`dg scaffold defs orchestration.components.PipelineComponent <folder>/<name>`, then the
    edit a user makes: the spec's topic, fields, event id and time, dimensions and measures."""
    from test_pipeline_components import dg_env

    done = subprocess.run(
        [str(REPO / ".venv/bin/dg"), "scaffold", "defs", "orchestration.components.PipelineComponent",
         str(folder / name)], cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dg_env(folder.parent / "dagster_home"))
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
def clash(tmp_path_factory, kafka_bootstrap):
    """One code location with the default pipeline and the scaffolded one; the latter run
    through its prefixed jobs on one date (two catch-ups, the date proven after each, so the
    second chunk's late events correct published windows). Yields what the tests
    look at."""
    from dagster import DagsterInstance

    from assets.pipelines import Pipeline, spec_pipelines
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.specs.pipeline import defs_dir, load_spec
    from testkit.generator import GeneratorConfig, end_within_one_date, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("clash")
    folder = tmp / "defs"
    folder.mkdir()
    topic = f"clash-{uuid.uuid4().hex[:8]}"
    spec_path = scaffold_and_edit(folder, "clash", {**SPEC, "topic": topic})
    lake = tmp / "lake"
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(lake),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "LAKEHOUSE_DEFS_DIR": str(folder)}
    with overridden(env):
        # The code location of this environment, as orchestration.definitions builds it (the
        # module's was built when the tests started).
        defs = definitions_for([Pipeline.of(Settings.from_env()), *spec_pipelines()],
                               LakehouseResource(), defs_folder=defs_dir())
        assert AssetKey(["clash", "reconciled_aggregates"]) in defs.resolve_all_asset_keys()
        spec, instance = load_spec(spec_path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("clash")
        assert settings.root == f"{lake}/clash"
        # One date (what crosses a midnight: tests/e2e/test_spec_generations_e2e.py, the
        # default pipeline's scenario), all of it past.
        end = end_within_one_date(datetime.now(UTC).replace(second=0, microsecond=0),
                                  timedelta(hours=4))
        records = generate_for_spec(spec, GeneratorConfig(
            count=900, seed=37, end=end, span=timedelta(hours=4), late_fraction=0.08,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        half, proofs = len(records) // 2, []
        for chunk in (records[:half], records[half:]):
            produce(settings, chunk)
            assert run_in(defs, "clash__stream_catch_up", instance)[0].success
            dates = sorted(bronze_dates(settings))
            for d in dates:  # published after the first chunk, corrected after the second
                result, checks = run_in(defs, "clash__reconcile_dates", instance,
                                        partition_key=d.isoformat())
                proofs.append((result.success, [(c.check_name, c.passed) for c in checks]))
        yield SimpleNamespace(defs=defs, spec=spec, instance=instance, lake=lake, topic=topic,
                              settings=settings, records=records, proofs=proofs,
                              written=tree(lake))


def test_the_pipeline_equals_the_reference_and_stays_in_its_folder(clash):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    spec, settings, records = clash.spec, clash.settings, clash.records
    # Every run succeeded and both blocking checks passed, for every date, each time.
    assert clash.proofs and all(ok and checks and all(p for _, p in checks)
                                for ok, checks in clash.proofs), clash.proofs
    assert {name for _, checks in clash.proofs for name, _ in checks} == {
        "reconciled_equals_replay", "fast_path_vs_replay"}
    bronze = read(settings, "bronze_events")
    assert bronze.column_names[:8] == ["event_id", "id", "window", "has_late", "mode", "action",
                                       "closed", "event_time"]
    assert "time" in bronze.column_names
    expected = expected_windows_for_spec(spec, records)
    assert table_windows_for_spec(spec, read(settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(settings, "replay_aggregates")) == expected
    assert read(settings, "late_events").num_rows > 0
    changelog = read(settings, "late_corrections")
    assert changelog.num_rows > 0 and "late_event" in changelog["cause"].to_pylist()
    assert {"before_time_sum", "after_time_sum", "has_late", "mode"} <= set(
        changelog.column_names)
    # Every bad record is quarantined with its field's reason.
    bad = Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    assert Counter(read(settings, "quarantined_events")["reason"].to_pylist()) == bad
    assert {"missing_id", "invalid_time", "time_too_precise"} <= set(bad)
    # Only the pipeline's folder was written: no default table, checkpoint or report appeared.
    assert all(p.startswith("clash/") for p in clash.written), sorted(clash.written)[:5]
    assert {p.split("/")[1] for p in clash.written} >= {"bronze_events", "_checkpoints",
                                                       "reconciled_aggregates"}


def test_the_changelog_repair_reads_the_same_corrections_with_these_names(clash, spark):
    """The repair path (`corrections_in` over the pipeline's gold commits, with their modes)
    finds what the runs logged, on a shape with `has_late` and `mode` dimensions."""
    from lakehouse.config.settings import utc
    from spark_jobs.corrections.changelog import corrections_in, pipeline_commits

    settings = clash.settings
    changelog = read(settings, "late_corrections").to_pylist()
    dims = settings.shape.dimension_names

    def key(row: dict) -> tuple:
        return (utc(row["window_start"]), *(row[d] for d in dims), row["revision"], row["cause"])

    dates = sorted({r["event_date"] for r in changelog})
    assert dates
    for d in dates:
        commits = pipeline_commits(settings, d, -1)
        assert commits and "reprocess" not in {mode for mode, _ in commits.values()}
        found = corrections_in(spark, settings, d, min(commits), max(commits), commits)
        assert Counter(key(r.asDict()) for r in found.collect()) == Counter(
            key(r) for r in changelog if r["event_date"] == d)


def test_the_default_pipeline_never_touches_the_spec_pipelines_folder(clash):
    from testkit.generator import GeneratorConfig, generate, produce

    default = clash.defs.resources["lakehouse"].settings
    produce(default, generate(GeneratorConfig(count=200, seed=3, span=timedelta(hours=1)))
            .records)
    before = tree(clash.lake / "clash")
    assert before  # the spec pipeline's tables are there (the fixture ran it)
    result, _ = run_in(clash.defs, "stream_catch_up", clash.instance)
    assert result.success
    assert read(default, "bronze_events").num_rows > 0
    assert tree(clash.lake / "clash") == before


def test_a_spec_change_leaves_the_dates_computed_before_stale(clash, tmp_path):
    """The spec version is the assets' code version: with the spec the dates were computed under,
    Dagster finds them fresh; after a change of what they hold (a new measure aggregate), stale,
    the cause a changed code version; a change of no result (another topic) keeps them fresh."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from assets.pipelines import Pipeline
    from lakehouse.specs.pipeline import load_spec

    gold = AssetKey(["clash", "reconciled_aggregates"])

    def status(spec_data: dict) -> list:
        path = tmp_path / f"clash-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(spec_data))
        spec = load_spec(path)
        settings = spec.settings(clash.defs.resources["lakehouse"].settings, {})
        defs = definitions_for([Pipeline.of(settings, spec.prefix)], LakehouseResource())
        resolver = CachingStaleStatusResolver(clash.instance, defs.get_repository_def().asset_graph,
                                              LoadingContextForTest(clash.instance))
        return [(resolver.get_status(gold, d.isoformat()),
                 [c.category.name for c in resolver.get_stale_causes(gold, d.isoformat())])
                for d in sorted(bronze_dates(clash.settings))]

    spec = {**SPEC, "topic": clash.topic}
    assert {s for s, _ in status(spec)} == {StaleStatus.FRESH}
    assert {s for s, _ in status({**spec, "topic": "clash-elsewhere"})} == {StaleStatus.FRESH}
    changed = {**spec, "measures": [{"field": "time", "aggregates": ["sum", "max"]}]}
    after = status(changed)
    assert after and all(s == StaleStatus.STALE and "CODE" in c for s, c in after), after
