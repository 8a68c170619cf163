"""A batch re-run after a crash between its quarantine and bronze commits, with a schema id
registered in between (the one input whose classification can change between two attempts):
the first attempt's verdicts stand. Its records under the then-unknown id stay quarantined and
never also land in bronze: every offset of the topic is in exactly one of the two. Real broker,
Spark, Delta and schema registry (Apicurio); the crash is an exception raised in place of the
bronze append (`testkit.faults.failing_bronze_append`)."""

import base64
import struct
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.tables.reads import read

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.long  # two catch-ups and a registry: about a minute (make test-long)
def test_a_rerun_keeps_its_first_attempts_quarantine_verdicts(tmp_path, kafka_bootstrap, spark,
                                                              schema_registry):
    from lakehouse.config.settings import Settings
    from lakehouse.events.schema_registry import with_registry_schemas
    from lakehouse.kafka.admin import topic_offsets
    from lakehouse.specs.pipeline import parse_spec
    from spark_jobs import stream as stream_module
    from testkit.avro_events import register_schema
    from testkit.faults import BRONZE_CRASH, failing_bronze_append
    from testkit.generator import GeneratorConfig, produce
    from testkit.spec_events import generate_for_spec

    topic = f"orders-rerun-{uuid.uuid4().hex[:8]}"
    subject, elsewhere = f"{topic}-value", f"{topic}-elsewhere-value"
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    data.update(fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"])

    def spec_for(subj):
        return parse_spec({**data, "name": "orders_rerun", "topic": topic, "avro": {
            "wire_format": "confluent", "registry": {"url": schema_registry, "subject": subj}}})

    spec = spec_for(subject)
    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    settings = spec.settings(base, {})
    v1, v2 = ((EXAMPLES / f"orders_v{i}.avsc").read_text() for i in (1, 2))
    first = register_schema(schema_registry, subject, v1)
    # Version 2 registered under another subject only: known to the registry by id (ids are
    # content ids), not under this pipeline's subject, so its records are `unknown_schema_id`.
    register_schema(schema_registry, elsewhere, v1)
    second = register_schema(schema_registry, elsewhere, v2)
    both = with_registry_schemas(spec_for(elsewhere).settings(base, {})).shape
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate_for_spec(spec.model_copy(update={"shape": both}), GeneratorConfig(
        count=240, seed=61, end=end, span=timedelta(minutes=30), late_fraction=0.0,
        duplicate_fraction=0.0, malformed_fraction=0.0)).records
    ids = [struct.unpack(">I", r.value[1:5])[0] for r in records]
    assert {first, second} == set(ids)
    produce(settings, records)

    with failing_bronze_append(), pytest.raises(Exception, match=BRONZE_CRASH):
        stream_module.run_available_now(spark, settings)
    quarantined = read(settings, "quarantined_events").to_pylist()
    assert len(quarantined) == ids.count(second)
    assert {q["reason"] for q in quarantined} == {"unknown_schema_id"}

    # Registered under the subject before the re-run: the re-run's start fetches it.
    assert register_schema(schema_registry, subject, v2) == second
    stream_module.run_available_now(spark, settings)

    bronze = read(settings, "bronze_events")
    quarantined = read(settings, "quarantined_events").to_pylist()
    in_bronze = set(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    in_quarantine = {(q["partition"], q["offset"]) for q in quarantined}
    assert not in_bronze & in_quarantine
    every = {(o.partition, n) for o in topic_offsets(settings) for n in range(o.earliest, o.latest)}
    assert in_bronze | in_quarantine == every
    assert len(in_bronze) == ids.count(first) and len(quarantined) == ids.count(second)
    assert {struct.unpack(">I", base64.b64decode(q["raw_value"])[1:5])[0]
            for q in quarantined} == {second}
