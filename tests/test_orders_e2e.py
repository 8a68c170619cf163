"""The order pipeline through Dagster, beside the default one in one code location: its prefixed
jobs catch the stream up, correct and prove each date (gold == replay == the independent
reference), and neither pipeline's runs touch the other's tables or checkpoints."""

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.table_reads import bronze_dates, read

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def tree(root: Path) -> dict[str, float]:
    """Every file under `root` with its modification time (what a run may have touched)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@pytest.fixture(scope="module")
def two_pipelines(tmp_path_factory, kafka_bootstrap):
    import uuid

    from dagster import DagsterInstance

    from assets.pipelines import Pipeline, spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.env import overridden
    from lakehouse.settings import Settings
    from lakehouse.spec import load_spec
    from orchestration.definitions import definitions_for

    tmp = tmp_path_factory.mktemp("two")
    spec_path = tmp / "orders.yaml"
    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = f"orders-{uuid.uuid4().hex[:8]}"
    spec_path.write_text(yaml.safe_dump(spec))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp / "lake"),
           "EVENTS_TOPIC": f"default-{uuid.uuid4().hex[:8]}", "PIPELINES": str(spec_path)}
    with overridden(env):
        default = Pipeline.of(Settings.from_env())
        # The resource of this environment (the module's was built when the tests started).
        defs = definitions_for([default, *spec_pipelines()], LakehouseResource())
        yield defs, load_spec(spec_path), DagsterInstance.ephemeral(), tmp / "lake"


def run(defs, name, instance, **kw):
    from testkit.runs import check_evaluations

    result = defs.resolve_job_def(name).execute_in_process(instance=instance, raise_on_error=False,
                                                       **kw)
    return result, check_evaluations(result)


def test_orders_through_dagster_equal_the_reference_and_stay_in_their_folder(two_pipelines):
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, generate_for_spec, table_windows_for_spec

    defs, spec, instance, lake = two_pipelines
    settings = defs.resources["lakehouse"].settings_for("orders")
    assert settings.root == f"{lake}/orders"
    end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
    records = generate_for_spec(spec, GeneratorConfig(
        count=1200, seed=9, end=end, span=timedelta(hours=4), late_fraction=0.05,
        duplicate_fraction=0.04, malformed_fraction=0.03)).records
    half = len(records) // 2
    default_files = tree(lake)  # nothing of the default pipeline yet
    for chunk in (records[:half], records[half:]):
        produce(settings, chunk)
        result, _ = run(defs, "orders__stream_catch_up", instance)
        assert result.success
        for d in sorted(bronze_dates(settings)):
            result, checks = run(defs, "orders__reconcile_dates", instance,
                                 partition_key=d.isoformat())
            assert result.success and checks and all(c.passed for c in checks), checks
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
    touched = {p for p, t in tree(lake).items() if default_files.get(p) != t}
    assert touched and all(p.startswith("orders/") for p in touched), sorted(touched)[:5]
    assert {p.split("/")[1] for p in touched} >= {"bronze_events", "_checkpoints",
                                                 "reconciled_aggregates"}


def test_the_default_pipeline_never_touches_the_orders_folder(two_pipelines):
    from testkit.generator import GeneratorConfig, generate, produce

    defs, _, instance, lake = two_pipelines
    default = defs.resources["lakehouse"].settings
    produce(default, generate(GeneratorConfig(count=200, seed=3, span=timedelta(hours=1)))
            .records)
    orders_before = tree(lake / "orders")
    result, _ = run(defs, "stream_catch_up", instance)
    assert result.success
    assert read(default, "bronze_events").num_rows > 0
    assert tree(lake / "orders") == orders_before
