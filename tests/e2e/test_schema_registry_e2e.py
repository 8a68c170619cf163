"""An Avro orders pipeline whose writer schemas are registered in a real schema registry
(Apicurio), end to end on a real broker, Spark and Delta: version 1 registered, its records
caught up; version 2 registered after the next catch-up's start fetched the schemas: its batch
asks the registry before writing and the catch-up restarts with version 2; then, while the
service's query runs, version 3 registered and records of it produced: the same question, the
query restarts with the new schema, and every record is decoded; then version 4 registered and
the registry hung (SIGSTOP) before its records arrive: the service restarts the query with
backoff until the registry answers, and decodes them. Only records whose schema id
was never registered are quarantined as `unknown_schema_id`. Bronze and gold equal the
independent reference (fastavro's decoding), and the replay of every date (which fetches the
schemas at its start) equals gold."""

import base64
import contextlib
import io
import json
import re
import struct
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lakehouse.tables.reads import bronze_dates, compare_tables, read

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V3 = {**json.loads((EXAMPLES / "orders_v2.avsc").read_text())}
V3["fields"] = [*V3["fields"], {"name": "channel", "type": "string", "default": "web"}]
V4 = {**V3, "fields": [*V3["fields"], {"name": "coupon", "type": "string", "default": ""}]}


@pytest.fixture(scope="module")
def registry_orders(tmp_path_factory, kafka_bootstrap, spark, schema_registry):
    from conftest import registry_hung

    from lakehouse.config.settings import Settings
    from lakehouse.events.schema_registry import with_registry_schemas
    from lakehouse.specs.pipeline import parse_spec
    from orchestration.service.runner import PipelineStream
    from spark_jobs import stream as stream_module
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import run_available_now
    from testkit.avro_events import register_schema
    from testkit.generator import GeneratorConfig, produce
    from testkit.spec_events import generate_for_spec

    tmp = tmp_path_factory.mktemp("registry_e2e")
    topic = f"orders-reg-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    # Read by region only: version 1 (the first registered) has no currency.
    data.update(fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"])
    spec = parse_spec({**data, "name": "orders_registry", "topic": topic,
                       "avro": {"wire_format": "confluent", "registry": {"url": schema_registry}}})
    settings = spec.settings(Settings.from_env({
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp / "lake"),
        "STREAM_TRIGGER_INTERVAL": "1 second"}), {})
    ids, records = [], []
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)

    def phase(schema, seed: int, count: int):
        """Register `schema`, then generate records with every version registered so far."""
        ids.append(register_schema(schema_registry, subject, schema))
        shape = with_registry_schemas(settings).shape
        batch = generate_for_spec(spec.model_copy(update={"shape": shape}), GeneratorConfig(
            count=count, seed=seed, end=end + timedelta(minutes=len(ids)),
            span=timedelta(minutes=40), late_fraction=0.05, duplicate_fraction=0.04,
            malformed_fraction=0.08)).records
        records.extend(batch)
        return batch

    produce(settings, phase((EXAMPLES / "orders_v1.avsc").read_text(), 51, 250))
    run_available_now(spark, settings)
    # Version 2 registered (and its records produced) after the next catch-up's start fetched
    # the schemas: its batch finds the id registered, the catch-up restarts with it. The race is
    # set by handing the start what the registry held before version 2 (fetched from it then);
    # the batch's question and the restart's fetch go to the registry.
    before_v2 = with_registry_schemas(settings)
    produce(settings, phase((EXAMPLES / "orders_v2.avsc").read_text(), 52, 250))
    fetched = []

    def fetched_before_v2_first(s):
        fetched.append(s)
        return before_v2 if len(fetched) == 1 else with_registry_schemas(s)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(stream_module, "with_registry_schemas", fetched_before_v2_first)
        run_available_now(spark, settings)
    catch_up_log = out.getvalue()
    # The service's query runs (it fetched versions 1 and 2); version 3 is registered and its
    # records produced: their batch finds the id registered, the query restarts with it.
    out = io.StringIO()
    stream = PipelineStream(spark, settings)

    def landed() -> bool:
        return sum(read(settings, t).num_rows
                   for t in ("bronze_events", "quarantined_events")) == len(records)

    def streamed(until, timeout: float = 90) -> None:
        """Poll the service's pipeline as its loop does, until `until()`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert stream.check(), out.getvalue()[-2000:]
            if until():
                return
            time.sleep(1)
        pytest.fail(f"not done within {timeout} s: {out.getvalue()[-2000:]}")

    with contextlib.redirect_stdout(out):
        stream.start()
        try:
            produce(settings, phase(V3, 53, 200))
            streamed(landed)
            # Version 4 registered, then the registry hangs (SIGSTOP) before its records
            # arrive: the batch cannot ask about the new id, the query fails and the service
            # restarts it with backoff, each restart's fetch timing out, until the registry
            # answers again; then the records are decoded, none quarantined for the outage.
            fourth = phase(V4, 54, 80)
            with registry_hung(schema_registry):
                produce(settings, fourth)
                streamed(lambda: out.getvalue().count("failure (registry)") >= 2, 120)
            # Running again: once after version 3's restart, once after the outage's.
            streamed(lambda: landed() and out.getvalue().count("ingest: running again") == 2)
        finally:
            status = stream.close()
    assert status == 0, out.getvalue()[-2000:]
    final = spec.model_copy(update={"shape": with_registry_schemas(settings).shape})
    dates = sorted(bronze_dates(settings))
    differing = {}
    for d in dates:
        run_corrections(spark, settings, d, run_id="test")
        run_replay(spark, settings, d)
        differing[d] = compare_tables(settings, d)
    yield SimpleNamespace(spec=final, settings=settings, records=records, ids=ids,
                          differing=differing, log=out.getvalue(), catch_up_log=catch_up_log,
                          starts=len(fetched))


@pytest.mark.long  # the module's fixture: one to two and a half minutes (make test-long)
def test_every_record_of_a_registered_id_is_decoded_and_gold_is_the_reference(registry_orders):
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import expected_windows_for_spec, rows_for_spec, table_windows_for_spec

    r = registry_orders
    assert len(set(r.ids)) == 4
    # The catch-up restarted with version 2, the service's query with version 3, rather than
    # quarantining their records; version 4's while the registry hung: restarted with backoff
    # (1 s, 2 s, ...) until it answered, the pipeline never stopped.
    assert "restarting with the registry's new schemas" in r.catch_up_log
    assert r.starts == 2  # the catch-up's query started twice
    assert "restarting with the registry's new schemas" in r.log
    waits = re.findall(r"transient failure \(registry\): .*unreachable.*restarting from the "
                       r"checkpoint in (\d+) s", r.log)
    assert waits[:2] == ["1", "2"], r.log[-3000:]
    assert r.log.count("ingest: running again after") == 2
    bronze = read(r.settings, "bronze_events")
    assert bronze.num_rows == len(rows_for_spec(r.spec, r.records))  # every valid record, once
    expected = expected_windows_for_spec(r.spec, r.records)
    assert table_windows_for_spec(r.spec, read(r.settings, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(r.spec, read(r.settings, "replay_aggregates")) == expected
    assert r.differing and all(n == 0 for n in r.differing.values()), r.differing
    # Records of each version are among the valid ones.
    written = Counter(struct.unpack(">I", rec.value[1:5])[0] for rec in r.records
                      if rec.kind in VALID_KINDS)
    assert all(written[i] for i in r.ids), written


@pytest.mark.long  # the module's fixture: one to two and a half minutes (make test-long)
def test_only_never_registered_ids_are_quarantined_as_unknown(registry_orders):
    from testkit.reference import VALID_KINDS

    r = registry_orders
    bad = [rec for rec in r.records if rec.kind not in VALID_KINDS]
    quarantine = read(r.settings, "quarantined_events").to_pylist()
    assert Counter(q["reason"] for q in quarantine) == Counter(rec.kind for rec in bad)
    unknown = {struct.unpack(">I", base64.b64decode(q["raw_value"])[1:5])[0]
               for q in quarantine if q["reason"] == "unknown_schema_id"}
    assert unknown and not unknown & set(r.ids)
    assert all("is not registered under subject" in q["detail"] for q in quarantine
               if q["reason"] == "unknown_schema_id")
