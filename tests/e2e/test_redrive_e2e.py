"""The quarantine redrive end to end, through Dagster, on a real broker, Spark, Delta and schema
registry (Apicurio): an Avro pipeline whose records are written with two schema versions, the
second registered under the pipeline's subject only after the stream quarantined its records as
`unknown_schema_id` and their date was published and proven. Then: a redrive that crashes after
its late-lane and bronze appends, before it marks the quarantine (`failing_redrive_mark`); the
re-run, which lands nothing twice, marks them, corrects, replays and proves their date; gold ==
replay == the independent reference (fastavro's decoding); every record of the topic counted
once; a second redrive is a no-op (no commit anywhere)."""

import base64
import struct
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.tables.reads import bronze_dates, read
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


@pytest.mark.long  # a catch-up, a reconcile and three redrives: a few minutes (make test-long)
def test_redrive_after_a_schema_is_registered_counts_every_record_once(
        tmp_path, kafka_bootstrap, spark, schema_registry):
    from dagster import DagsterInstance

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.events.schema_registry import with_registry_schemas
    from lakehouse.kafka.admin import topic_offsets
    from lakehouse.specs.pipeline import load_spec, parse_spec
    from lakehouse.tables.catalog import REDRIVEN_TO
    from orchestration.definitions import definitions_for
    from testkit.avro_events import register_schema
    from testkit.faults import REDRIVE_CRASH, failing_redrive_mark
    from testkit.generator import produce
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import (
        expected_windows_for_spec,
        rows_for_spec,
        table_windows_for_spec,
    )

    topic = f"orders-redrive-{uuid.uuid4().hex[:8]}"
    subject, elsewhere = f"{topic}-value", f"{topic}-elsewhere-value"
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    # Read by region only: version 1 has no currency.
    data.update(fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"], name="orders_redrive", topic=topic,
                avro={"wire_format": "confluent",
                      "registry": {"url": schema_registry, "subject": subject}})
    path = tmp_path / "orders_redrive.yaml"
    path.write_text(yaml.safe_dump(data))
    v1, v2 = ((EXAMPLES / f"orders_v{i}.avsc").read_text() for i in (1, 2))
    first = register_schema(schema_registry, subject, v1)
    # Version 2 known to the registry under another subject only: under the pipeline's, its
    # records are `unknown_schema_id` until it is registered there too.
    register_schema(schema_registry, elsewhere, v1)
    second = register_schema(schema_registry, elsewhere, v2)

    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "PIPELINES": str(path)}
    with overridden(env):
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        spec, instance = load_spec(path), DagsterInstance.ephemeral()
        job = (spec.prefix + "__{}").format
        settings = defs.resources["lakehouse"].settings_for(spec.name)
        both = with_registry_schemas(parse_spec({**data, "avro": {
            "wire_format": "confluent", "registry": {"url": schema_registry,
                                                     "subject": elsewhere}}})
            .settings(Settings.from_env(), {})).shape
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        records = generate_records(spec, both, end)
        ids = [struct.unpack(">I", r.value[1:5])[0] if len(r.value) >= 5 else None
               for r in records]
        assert {first, second} <= set(ids)
        produce(settings, records)

        assert run_in(defs, job("stream_catch_up"), instance)[0].success
        quarantine = read(settings, "quarantined_events").to_pylist()
        unknown = [q for q in quarantine if q["reason"] == "unknown_schema_id"]
        assert len(unknown) >= ids.count(second)
        dates = sorted(bronze_dates(settings))
        for d in dates:  # published and proven without the records of version 2
            result, checks = run_in(defs, job("reconcile_dates"), instance,
                                    partition_key=d.isoformat())
            assert result.success and all(c.passed for c in checks), step_failures(result)

        # The fix upstream: version 2 registered under the pipeline's subject.
        assert register_schema(schema_registry, subject, v2) == second
        final = spec.model_copy(update={"shape": with_registry_schemas(settings).shape})
        valid_v2 = [r for r, i in zip(records, ids, strict=True)
                    if i == second and r.kind in VALID_KINDS]
        assert valid_v2
        days = sorted({q["quarantine_date"] for q in quarantine})

        # A crash after the redrive's appends, before its quarantine mark.
        with failing_redrive_mark():
            for day in days:
                crashed, _ = run_in(defs, job("redrive_quarantine"), instance,
                                    partition_key=day.isoformat())
                assert not crashed.success and REDRIVE_CRASH in _errors(crashed)
        assert read(settings, "bronze_events").num_rows == len(records) - len(quarantine) \
            + len(valid_v2)
        assert not any(q["redriven_at"] for q in read(settings, "quarantined_events").to_pylist())

        # The re-run (only unknown_schema_id): lands nothing twice, marks, proves the dates.
        reruns = {}
        for day in days:
            result, _ = run_in(defs, job("redrive_quarantine"), instance,
                               partition_key=day.isoformat(), run_config={"ops": {
                                   job("redrive_quarantined"): {"config": {
                                       "reasons": ["unknown_schema_id"]}}}})
            assert result.success, step_failures(result)
            reruns[day] = (result.run_id, _outputs(result))
        redriven = sum(o[job("redrive_quarantined")]["redriven"] for _, o in reruns.values())
        landed = sum(o[job("redrive_quarantined")]["landed_now"] for _, o in reruns.values())
        assert (redriven, landed) == (len(valid_v2), 0)  # the crashed run had landed them all
        failing = Counter()
        for _, o in reruns.values():
            for new in (o[job("redrive_quarantined")]["still_failing_by_reason"]
                        .get("unknown_schema_id", {})).items():
                failing[new[0]] += new[1]
        # Malformed records of version 2 now fail for what is wrong with them; only ids never
        # registered stay unknown.
        assert sum(failing.values()) == len(unknown) - len(valid_v2)
        assert failing["unknown_schema_id"] == len(unknown) - ids.count(second)
        proof = [o[job("reconcile_redriven_dates")] for _, o in reruns.values()]
        assert sum(sum(p["redriven_records"].values()) for p in proof) == len(valid_v2)

        # Each record of the topic once: in bronze, or in the quarantine and not redriven.
        bronze = read(settings, "bronze_events")
        quarantine = read(settings, "quarantined_events").to_pylist()
        in_bronze = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(),
                             strict=True))
        assert len(in_bronze) == len(set(in_bronze)) == len(rows_for_spec(final, records))
        marked = {(q["partition"], q["offset"]) for q in quarantine if q["redriven_at"]}
        left = {(q["partition"], q["offset"]) for q in quarantine if not q["redriven_at"]}
        assert marked <= set(in_bronze) and not left & set(in_bronze)
        every = {(o.partition, n) for o in topic_offsets(settings)
                 for n in range(o.earliest, o.latest)}
        assert set(in_bronze) | left == every
        assert {q["redriven_to"] for q in quarantine if q["redriven_at"]} == {REDRIVEN_TO}
        assert {q["redrive_run_id"] for q in quarantine if q["redriven_at"]} == {
            run_id for run_id, _ in reruns.values()}
        assert {struct.unpack(">I", base64.b64decode(q["raw_value"])[1:5])[0]
                for q in quarantine if q["redriven_at"]} == {second}
        late = read(settings, "late_events")
        late_keys = list(zip(late["partition"].to_pylist(), late["offset"].to_pylist(),
                             strict=True))
        assert len(late_keys) == len(set(late_keys)) and marked <= set(late_keys)

        # gold == replay == the independent reference, every date proven.
        expected = expected_windows_for_spec(final, records)
        assert table_windows_for_spec(final, read(settings, "reconciled_aggregates")) == expected
        assert table_windows_for_spec(final, read(settings, "replay_aggregates")) == expected

        # A second redrive: nothing to do, no commit anywhere.
        tables = ("bronze_events", "late_events", "quarantined_events",
                  "reconciled_aggregates")
        before = _versions(settings, *tables)
        for day in days:
            result, _ = run_in(defs, job("redrive_quarantine"), instance,
                               partition_key=day.isoformat())
            assert result.success, step_failures(result)
            out = _outputs(result)[job("redrive_quarantined")]
            assert (out["redriven"], out["landed_now"]) == (0, 0)
        assert _versions(settings, *tables) == before


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

    real = redrive._append

    def no_bronze(df, s, table, metadata):
        if table == "bronze_events":
            raise RuntimeError("crashed before the redrive's bronze append")
        real(df, s, table, metadata)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(redrive, "_append", no_bronze)
        for day in days:
            with pytest.raises(RuntimeError, match="bronze append"):
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
