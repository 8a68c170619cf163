"""The quarantine redrive end to end on a real broker, Spark and Delta: with nothing fixed upstream
it reports what still fails and commits nothing; a crash between its late-lane and bronze
appends lands each record once. (A schema registered later and a size limit widened, a crash
before the mark, gold == replay == an independent reference: tests/e2e/test_redrive_spec_edit_e2e.py.)"""

import struct
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.tables.reads import read
from testkit.runs import run_in, step_failures

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _outputs(result) -> dict:
    """Each op's output metadata, by op name."""
    return {e.step_key: {k: v.value for k, v in e.event_specific_data.metadata.items()}
            for e in result.all_events if e.event_type_value == "STEP_OUTPUT"}


def _errors(result) -> str:
    """The failed steps' errors with their causes."""
    return "\n".join(e.event_specific_data.error.to_string() for e in result.all_events
                     if e.event_type_value == "STEP_FAILURE" and e.event_specific_data.error)


def _versions(settings, *tables) -> dict:
    from lakehouse.tables import delta_log

    return {t: delta_log.version(settings, t) for t in tables}


def generate_records(spec, shape, end: datetime) -> list:
    from testkit.generator import GeneratorConfig
    from testkit.spec_events import generate_for_spec

    return generate_for_spec(spec.model_copy(update={"shape": shape}), GeneratorConfig(
        count=300, seed=71, end=end, span=timedelta(minutes=40), late_fraction=0.05,
        duplicate_fraction=0.05, malformed_fraction=0.05)).records



def test_a_redrive_with_nothing_fixed_reports_what_still_fails_and_commits_nothing(
        instance_env, spark):
    """The default pipeline, nothing fixed upstream: every record still fails for its reason
    (reported per reason, for the reasons selected) and no table gets a commit."""
    from dagster import DagsterInstance

    from assets.pipelines import Pipeline
    from assets.resources import LakehouseResource
    from lakehouse.kafka.admin import ensure_topic
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, generate, produce

    settings = instance_env
    ensure_topic(settings)
    defs = definitions_for([Pipeline.of(settings)], LakehouseResource(
        lakehouse_root=settings.lakehouse_root, events_topic=settings.events_topic,
        kafka_bootstrap_servers=settings.kafka_bootstrap_servers))
    instance = DagsterInstance.ephemeral()
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    produce(settings, generate(GeneratorConfig(count=300, seed=5, end=end,
                                               span=timedelta(minutes=30), keys=4,
                                               malformed_fraction=0.1)).records)
    assert run_in(defs, "stream_catch_up", instance)[0].success
    quarantine = read(settings, "quarantined_events").to_pylist()
    reasons = Counter(q["reason"] for q in quarantine)
    assert len(reasons) >= 2
    chosen = sorted(reasons)[:2]
    days = sorted({q["quarantine_date"] for q in quarantine})
    tables = ("bronze_events", "late_events", "quarantined_events")
    before = _versions(settings, *tables)
    considered, failing = Counter(), Counter()
    for day in days:
        result, _ = run_in(defs, "redrive_quarantine", instance, partition_key=day.isoformat(),
                           run_config={"ops": {"redrive_quarantined": {"config": {
                               "reasons": chosen}}}})
        assert result.success, step_failures(result)
        out = _outputs(result)["redrive_quarantined"]
        assert (out["redriven"], out["landed_now"], out["event_dates"]) == (0, 0, [])
        for row in out["per_reason"].records:
            considered[row.data["reason"]] += row.data["considered"]
        for was, now in out["still_failing_by_reason"].items():
            failing.update({(was, k): v for k, v in now.items()})
    assert considered == {r: reasons[r] for r in chosen}
    assert failing == {(r, r): reasons[r] for r in chosen}  # each fails as before
    assert _versions(settings, *tables) == before


@pytest.mark.long  # a catch-up and three redrives with a registry: a few minutes
def test_a_crash_between_the_late_lane_and_bronze_lands_each_record_once(
        tmp_path, kafka_bootstrap, spark, schema_registry):
    """The redrive's other crash point (spark_jobs.redrive directly): its late-lane append made,
    its bronze append not. The re-run appends only to bronze, then marks; each record is once in
    each table."""
    from lakehouse.config.settings import Settings
    from lakehouse.events.schema_registry import with_registry_schemas
    from lakehouse.specs.pipeline import parse_spec
    from spark_jobs import redrive
    from spark_jobs.stream import run_available_now
    from testkit.avro_events import register_schema
    from testkit.faults import BRONZE_CRASH, failing_bronze_append
    from testkit.generator import GeneratorConfig, produce
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import generate_for_spec

    topic = f"orders-redrive2-{uuid.uuid4().hex[:8]}"
    subject, elsewhere = f"{topic}-value", f"{topic}-elsewhere-value"
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    data.update(fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"], name="orders_redrive2", topic=topic)

    def spec_for(subj):
        return parse_spec({**data, "avro": {"wire_format": "confluent", "registry": {
            "url": schema_registry, "subject": subj}}})

    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    settings = spec_for(subject).settings(base, {})
    v1, v2 = ((EXAMPLES / f"orders_v{i}.avsc").read_text() for i in (1, 2))
    register_schema(schema_registry, subject, v1)
    register_schema(schema_registry, elsewhere, v1)
    second = register_schema(schema_registry, elsewhere, v2)
    both = with_registry_schemas(spec_for(elsewhere).settings(base, {})).shape
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate_for_spec(spec_for(subject).model_copy(update={"shape": both}),
                                GeneratorConfig(count=120, seed=81, end=end,
                                                span=timedelta(minutes=20), late_fraction=0.0,
                                                duplicate_fraction=0.05,
                                                malformed_fraction=0.0)).records
    valid_v2 = [r for r in records if r.kind in VALID_KINDS
                and struct.unpack(">I", r.value[1:5])[0] == second]
    assert valid_v2
    produce(settings, records)
    run_available_now(spark, settings)
    days = sorted({q["quarantine_date"] for q in read(settings, "quarantined_events").to_pylist()})
    assert register_schema(schema_registry, subject, v2) == second

    with failing_bronze_append():  # the writer raises where it would append to bronze
        for day in days:
            with pytest.raises(RuntimeError, match=BRONZE_CRASH):
                redrive.run_redrive(spark, settings, day, run_id="crashed")
    late = read(settings, "late_events").num_rows
    assert late == len(valid_v2)
    results = [redrive.run_redrive(spark, settings, day, run_id="rerun") for day in days]
    assert sum(r.landed_now for r in results) == sum(r.total_redriven for r in results) \
        == len(valid_v2)
    assert read(settings, "late_events").num_rows == late  # nothing appended twice
    for name in ("bronze_events", "late_events"):
        t = read(settings, name)
        keys = list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
        assert len(keys) == len(set(keys)), name
    assert read(settings, "bronze_events").num_rows == len(records)  # every record, once
    quarantine = read(settings, "quarantined_events").to_pylist()
    assert len(quarantine) == len(valid_v2) and all(q["redrive_run_id"] == "rerun"
                                                   for q in quarantine)
    again = [redrive.run_redrive(spark, settings, day, run_id="again") for day in days]
    assert sum(r.total_redriven + r.landed_now for r in again) == 0
