"""Column names the Spark code once used for its own working columns run end to end: a spec with
the dimensions `id`, `window`, `has_late`, `mode`, `action` and `closed` and the measure field
`time` (they clashed with the parser's `_id_type`/`_time_text`, the window struct, the proofs'
and the changelog's `has_late`/`mode`, the corrections' diff) through classify, two catch-ups,
corrections, the replay and the proof, through its prefixed Dagster jobs. (`_commit_version`
and any name starting with _ is refused at load: tests/unit/test_spec.py.)"""

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import yaml

from lakehouse.tables.reads import bronze_dates, read
from testkit.runs import run_in

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


@pytest.fixture(scope="module")
def clash(tmp_path_factory, kafka_bootstrap):
    from dagster import DagsterInstance

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.specs.pipeline import load_spec
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, end_across_midnight, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("clash")
    path = tmp / "clash.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "topic": f"clash-{uuid.uuid4().hex[:8]}"}))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp / "lake"),
           "PIPELINES": str(path)}
    with overridden(env):
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        spec, instance = load_spec(path), DagsterInstance.ephemeral()
        settings = defs.resources["lakehouse"].settings_for("clash")
        end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
        records = generate_for_spec(spec, GeneratorConfig(
            count=900, seed=37, end=end, span=timedelta(hours=4), late_fraction=0.08,
            duplicate_fraction=0.04, malformed_fraction=0.03)).records
        half, proofs = len(records) // 2, []
        for chunk in (records[:half], records[half:]):
            produce(settings, chunk)
            assert run_in(defs, "clash__stream_catch_up", instance)[0].success
            for d in sorted(bronze_dates(settings)):
                result, checks = run_in(defs, "clash__reconcile_dates", instance,
                                     partition_key=d.isoformat())
                proofs.append((result.success, [(c.check_name, c.passed) for c in checks]))
        yield SimpleNamespace(spec=spec, settings=settings, records=records, proofs=proofs)


def test_formerly_colliding_names_are_classified_counted_corrected_and_proven(clash):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    spec, settings, records = clash.spec, clash.settings, clash.records
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
    changelog = read(settings, "late_corrections")
    assert changelog.num_rows > 0 and "late_event" in changelog["cause"].to_pylist()
    assert {"before_time_sum", "after_time_sum", "has_late", "mode"} <= set(
        changelog.column_names)
    bad = Counter(r.kind for r in records if r.kind not in VALID_KINDS)
    assert Counter(read(settings, "quarantined_events")["reason"].to_pylist()) == bad
    assert {"missing_id", "invalid_time", "time_too_precise"} <= set(bad)


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
