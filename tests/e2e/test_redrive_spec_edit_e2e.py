"""The quarantine redrive across an in-place spec edit, through Dagster, on
a real broker, Spark, Delta and schema registry (Apicurio).

Quarantined for two causes fixed later: version 2 of the order schema known to the registry under
another subject only (`unknown_schema_id`), and orders above a size limit (`payload_too_large`,
MAX_EVENT_BYTES). The dates are published and proven; then the spec is edited in place (a `max`
of the amount, a longer watermark delay, the size limit widened: `lakehouse.tables.generations`
`change_between`) and version 2 is registered under the pipeline's subject.

The redrive refuses until the stream's next start applies the edit (nothing committed); after
it, a redrive that crashes after its late-lane and bronze appends, before its quarantine mark;
its re-run lands nothing twice, marks, and recomputes the whole date under the new spec (its new
column in every window); gold == replay == the independent reference of the edited spec; each
record of the topic once; a second redrive commits nothing; the catch-up that applies the edit
has nothing new to read (the refusals tell the user to run one). Beside it: the
values only a rebuild accepts (a wider decimal, another time form) are counted by the rebuilt
generation, leaving a redrive nothing."""

import base64
import io
import json
import struct
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fastavro
import pytest
import yaml
from test_redrive_e2e import _errors, _outputs, _versions, generate_records

from lakehouse.tables.reads import bronze_dates, read
from testkit.generator import Record
from testkit.runs import run_in, step_failures

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TABLES = ("bronze_events", "late_events", "quarantined_events", "reconciled_aggregates")


@pytest.mark.long  # two catch-ups, a reconcile, four redrives with a registry: a few minutes
def test_a_redrive_after_an_in_place_spec_edit_counts_every_record_once(
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
    from lakehouse.tables.generations import (
        SpecChangePending,
        change_between,
        records,
        require_applied,
    )
    from orchestration.definitions import definitions_for
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import caught_up
    from testkit.avro_events import register_schema
    from testkit.faults import REDRIVE_CRASH, failing_redrive_mark
    from testkit.generator import produce
    from testkit.reference import VALID_KINDS
    from testkit.spec_events import (
        expected_windows_for_spec,
        rows_for_spec,
        table_windows_for_spec,
    )

    topic = f"orders-redrive-edit-{uuid.uuid4().hex[:8]}"
    subject, elsewhere = f"{topic}-value", f"{topic}-elsewhere-value"
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    data.update(fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"], name="orders_redrive_edit", topic=topic,
                measures=[{"field": "amount", "aggregates": ["sum"]}],
                avro={"wire_format": "confluent",
                      "registry": {"url": schema_registry, "subject": subject}})
    edited = {**data, "measures": [{"field": "amount", "aggregates": ["sum", "max"]}],
              "window": {**data["window"], "watermark_delay": "45 seconds"}}
    path = tmp_path / "orders_redrive_edit.yaml"
    path.write_text(yaml.safe_dump(data))
    v1, v2 = ((EXAMPLES / f"orders_v{i}.avsc").read_text() for i in (1, 2))
    first = register_schema(schema_registry, subject, v1)
    register_schema(schema_registry, elsewhere, v1)
    second = register_schema(schema_registry, elsewhere, v2)

    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "PIPELINES": str(path)}
    with overridden(env):
        spec, instance = load_spec(path), DagsterInstance.ephemeral()
        job = (spec.prefix + "__{}").format
        both = with_registry_schemas(parse_spec({**data, "avro": {
            "wire_format": "confluent", "registry": {"url": schema_registry,
                                                     "subject": elsewhere}}})
            .settings(Settings.from_env(), {})).shape
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        generated = generate_records(spec, both, end)
        ids = [struct.unpack(">I", r.value[1:5])[0] if len(r.value) >= 5 else None
               for r in generated]
        assert {first, second} <= set(ids)
        # Orders above the first spec's size limit (every other record's size): version 1's
        # valid orders again, their ids padded.
        limit = max(len(r.value) for r in generated)
        schema = fastavro.parse_schema(json.loads(v1))

        def padded(r: Record, n: int) -> Record:
            order = fastavro.schemaless_reader(io.BytesIO(r.value[5:]), schema)
            order["order_id"] = f"{order['order_id']}-{'x' * 100}-{n}"
            body = io.BytesIO()
            fastavro.schemaless_writer(body, schema, order)
            return Record(key=r.key, value=r.value[:5] + body.getvalue(), kind="event")

        big = [padded(r, n) for n, (r, i) in enumerate(
            [(r, i) for r, i in zip(generated, ids, strict=True)
             if i == first and r.kind == "event"][:6])]
        generated += big
        ids += [first] * len(big)
        assert all(len(r.value) > limit for r in big)

        with overridden({"MAX_EVENT_BYTES": str(limit)}):
            defs = definitions_for(spec_pipelines(), LakehouseResource())
            settings = defs.resources["lakehouse"].settings_for(spec.name)
            assert settings.max_event_bytes == limit
            produce(settings, generated)
            assert run_in(defs, job("stream_catch_up"), instance)[0].success
            quarantine = read(settings, "quarantined_events").to_pylist()
            reasons = Counter(q["reason"] for q in quarantine)
            assert reasons["payload_too_large"] == len(big)
            assert reasons["unknown_schema_id"] >= sum(
                i == second for r, i in zip(generated, ids, strict=True) if r not in big)
            days = sorted({q["quarantine_date"] for q in quarantine})
            for d in sorted(bronze_dates(settings)):  # published and proven under the first spec
                result, checks = run_in(defs, job("reconcile_dates"), instance,
                                        partition_key=d.isoformat())
                assert result.success and all(c.passed for c in checks), step_failures(result)
            assert "amount_max" not in read(settings, "reconciled_aggregates").column_names

        # The spec edited in place (MAX_EVENT_BYTES back to its default, 64 KiB, among it), and
        # the fix upstream: version 2 under the pipeline's subject.
        path.write_text(yaml.safe_dump(edited))
        defs = definitions_for(spec_pipelines(), LakehouseResource())
        after = defs.resources["lakehouse"].settings_for(spec.name)
        assert after.root == settings.root and after.home is None  # the same folder
        change = change_between(settings.results_inputs, after.results_inputs)
        assert change.kind == "in_place" and "payload_too_large" in change.describe(), change
        assert register_schema(schema_registry, subject, v2) == second
        final = load_spec(path)
        final = final.model_copy(update={"shape": with_registry_schemas(after).shape})
        # What the fixes let pass: version 2's valid orders and the valid orders above the limit.
        passing_now = [r for r, i in zip(generated, ids, strict=True)
                       if (i == second or r in big) and r.kind in VALID_KINDS]
        assert any(r in big for r in passing_now) and any(r not in big for r in passing_now)

        # Before the stream's next start applies the edit, the redrive refuses and commits
        # nothing (a `make stream` still on the first spec is never mixed with the edited one).
        before = _versions(after, *TABLES)
        refused, _ = run_in(defs, job("redrive_quarantine"), instance,
                            partition_key=days[0].isoformat())
        assert not refused.success
        assert "applies the change at its next start" in _errors(refused), _errors(refused)
        assert _versions(after, *TABLES) == before

        # The refusals say "run the stream catch-up": one with nothing new to read (which
        # otherwise starts no query) is not idle while an edit waits, and applies it.
        with pytest.raises(SpecChangePending, match="applies the change at its next start"):
            require_applied(after)
        assert not caught_up(after)
        assert run_in(defs, job("stream_catch_up"), instance)[0].success  # applies the edit
        require_applied(after)  # the edited spec's writers go on
        assert caught_up(after)
        rows = records(after)
        assert [(r["spec_version"], r["status"]) for r in rows] == [
            (after.results_version, "active")]
        assert "new columns amount_max" in rows[0]["note"]

        # A crash after the redrive's late-lane and bronze appends, before its quarantine mark.
        with failing_redrive_mark():
            for day in days:
                crashed, _ = run_in(defs, job("redrive_quarantine"), instance,
                                    partition_key=day.isoformat())
                assert not crashed.success and REDRIVE_CRASH in _errors(crashed)
        assert read(after, "bronze_events").num_rows == \
            len(generated) - len(quarantine) + len(passing_now)
        assert not any(q["redriven_at"] for q in read(after, "quarantined_events").to_pylist())

        # The re-runs land nothing twice (the crashed run landed everything that passes), mark,
        # recompute and prove the dates: first only `unknown_schema_id` (the reasons selected in
        # the run's config), then every reason.
        def rerun(reasons=None) -> list[tuple[str, dict]]:
            config = {"ops": {job("redrive_quarantined"): {"config": {"reasons": reasons}}}}
            runs = []
            for day in days:
                result, _ = run_in(defs, job("redrive_quarantine"), instance,
                                   partition_key=day.isoformat(),
                                   **({"run_config": config} if reasons else {}))
                assert result.success, step_failures(result)
                runs.append((result.run_id, _outputs(result)))
            return runs

        def total(runs, key) -> int:
            return sum(o[job("redrive_quarantined")][key] for _, o in runs)

        unknown = [q for q in quarantine if q["reason"] == "unknown_schema_id"]
        registered_now = [r for r, i in zip(generated, ids, strict=True)
                          if i == second and r not in big]
        selected = rerun(["unknown_schema_id"])
        valid_v2 = [r for r in passing_now if r not in big]
        assert (total(selected, "redriven"), total(selected, "landed_now")) == (len(valid_v2), 0)
        failing = Counter()
        for _, o in selected:
            assert set(o[job("redrive_quarantined")]["still_failing_by_reason"]) <= {
                "unknown_schema_id"}
            for now, n in (o[job("redrive_quarantined")]["still_failing_by_reason"]
                           .get("unknown_schema_id", {})).items():
                failing[now] += n
        # Malformed records of version 2 now fail for what is wrong with them; only ids never
        # registered stay unknown.
        assert sum(failing.values()) == len(unknown) - len(valid_v2)
        assert failing["unknown_schema_id"] == len(unknown) - len(registered_now)
        proof = [o[job("reconcile_redriven_dates")] for _, o in selected]
        assert sum(sum(p["redriven_records"].values()) for p in proof) == len(valid_v2)
        every_reason = rerun()
        assert (total(every_reason, "redriven"), total(every_reason, "landed_now")) == (
            len(passing_now) - len(valid_v2), 0)  # the orders above the old size limit
        reruns = selected + every_reason
        touched = {date for _, o in reruns for date in o[job("redrive_quarantined")]["event_dates"]}
        # A date the redrive did not touch: its next corrections run (the hourly schedule's)
        # recomputes it whole under the edited spec.
        for d in sorted(bronze_dates(after)):
            if d.isoformat() not in touched:
                run_corrections(spark, after, d, run_id="after-edit")
                run_replay(spark, after, d)

        # Each record of the topic once: in bronze, or in the quarantine and not redriven.
        bronze = read(after, "bronze_events")
        quarantine = read(after, "quarantined_events").to_pylist()
        in_bronze = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(),
                             strict=True))
        assert len(in_bronze) == len(set(in_bronze)) == len(rows_for_spec(final, generated))
        marked = {(q["partition"], q["offset"]) for q in quarantine if q["redriven_at"]}
        left = {(q["partition"], q["offset"]) for q in quarantine if not q["redriven_at"]}
        assert len(marked) == len(passing_now)
        assert {q["redriven_to"] for q in quarantine if q["redriven_at"]} == {REDRIVEN_TO}
        assert {q["redrive_run_id"] for q in quarantine if q["redriven_at"]} <= {
            run_id for run_id, _ in reruns}
        assert {struct.unpack(">I", base64.b64decode(q["raw_value"])[1:5])[0]
                for q in quarantine if q["redriven_at"]} == {first, second}
        assert marked <= set(in_bronze) and not left & set(in_bronze)
        every = {(o.partition, n) for o in topic_offsets(after)
                 for n in range(o.earliest, o.latest)}
        assert set(in_bronze) | left == every
        late = read(after, "late_events")
        late_keys = list(zip(late["partition"].to_pylist(), late["offset"].to_pylist(),
                             strict=True))
        assert len(late_keys) == len(set(late_keys)) and marked <= set(late_keys)

        # gold == replay == the independent reference of the edited spec (its max in every
        # window: the whole date recomputed, not only the windows the redrive touched).
        gold = read(after, "reconciled_aggregates")
        assert gold.num_rows and None not in gold["amount_max"].to_pylist()
        expected = expected_windows_for_spec(final, generated)
        assert table_windows_for_spec(final, gold) == expected
        assert table_windows_for_spec(final, read(after, "replay_aggregates")) == expected
        assert expected != expected_windows_for_spec(
            final, [r for r in generated if r not in passing_now])  # the redrive counted something

        # A second redrive: nothing to do, no commit anywhere.
        before = _versions(after, *TABLES)
        for day in days:
            result, _ = run_in(defs, job("redrive_quarantine"), instance,
                               partition_key=day.isoformat())
            assert result.success, step_failures(result)
            again = _outputs(result)[job("redrive_quarantined")]
            assert (again["redriven"], again["landed_now"]) == (0, 0)
        assert _versions(after, *TABLES) == before


@pytest.mark.long  # two catch-ups and a rebuild of every date: 106 s alone (2026-11-27); make test is over budget
def test_values_a_rebuild_accepts_are_counted_by_the_rebuilt_generation_not_redriven(
        tmp_path, kafka_bootstrap, spark):
    """The value-accepting edits (a wider decimal, another time form) are rebuilds: orders
    quarantined under the first spec (`amount_out_of_range`, `invalid_event_time`) are counted,
    once, by the generation the edited spec builds from the log; its redrive has nothing to do,
    and the first generation stays as it was, proven."""
    import json

    from test_spec_edits import BASE, spec_settings

    from lakehouse.config.settings import Settings
    from lakehouse.kafka.admin import topic_offsets
    from lakehouse.tables.generations import change_between, resolve
    from lakehouse.tables.reads import compare_tables
    from spark_jobs.corrections import run_corrections
    from spark_jobs.redrive import run_redrive
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import catch_up
    from testkit.generator import GeneratorConfig, Record, produce
    from testkit.spec_events import (
        expected_windows_for_spec,
        generate_for_spec,
        table_windows_for_spec,
    )

    def rebuild_dates(settings):
        for d in sorted(bronze_dates(settings)):
            run_replay(spark, settings, d)
            run_corrections(spark, settings, d, run_id="test", reprocess=True)

    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
                              "EVENTS_TOPIC": f"accept-{uuid.uuid4().hex[:8]}"})
    narrow = {"fields": {**BASE["fields"], "amount": "decimal(10,2)"},
              "event_time": {"field": "created_at", "formats": ["iso8601"]}}
    v1_spec, v1 = spec_settings(tmp_path, base, **narrow)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    generated = generate_for_spec(v1_spec, GeneratorConfig(
        count=200, seed=46, end=end, span=timedelta(minutes=20), late_fraction=0.05,
        duplicate_fraction=0.05, malformed_fraction=0.05)).records
    # Orders the first spec quarantines and the edited one accepts: an amount above
    # decimal(10,2)'s range, a time in epoch milliseconds.
    events = [json.loads(r.value) for r in generated if r.kind == "event"][:12]
    extra = []
    for i, e in enumerate(events):
        e = {**e, "order_id": f"accepted-later-{i}"}
        if i % 2:
            e["amount"] = "123456789.12"
        else:
            e["created_at"] = int(datetime.fromisoformat(e["created_at"]).timestamp() * 1000)
        extra.append(Record(key=None, value=json.dumps(e).encode(), kind="event"))
    produce(v1, generated + extra)
    catch_up(spark, v1)
    rebuild_dates(v1)
    reasons = {q["reason"] for q in read(v1, "quarantined_events").to_pylist()}
    assert {"amount_out_of_range", "invalid_event_time"} <= reasons
    assert table_windows_for_spec(v1_spec, read(v1, "reconciled_aggregates")) == \
        expected_windows_for_spec(v1_spec, generated)

    v2_spec, edited = spec_settings(tmp_path, base)  # decimal(18,2), iso8601 and epoch_millis
    change = change_between(v1.results_inputs, edited.results_inputs)
    assert change.kind == "rebuild" and "event time changed" in change.why
    assert any("'amount' read as" in w for w in change.why), change.why
    v2 = resolve(edited)
    assert v2.home == v1.root and v2.root != v1.root  # built apart
    catch_up(spark, v2)  # the new generation, from the earliest retained offset
    rebuild_dates(v2)

    expected = expected_windows_for_spec(v2_spec, generated + extra)
    assert expected != expected_windows_for_spec(v2_spec, generated)
    assert table_windows_for_spec(v2_spec, read(v2, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(v2_spec, read(v2, "replay_aggregates")) == expected
    assert all(compare_tables(v2, d) == 0 for d in bronze_dates(v2))
    # Each record once in the new generation: in bronze or in its quarantine.
    bronze = read(v2, "bronze_events")
    keys = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    held = {(q["partition"], q["offset"]) for q in read(v2, "quarantined_events").to_pylist()}
    every = {(o.partition, n) for o in topic_offsets(v2) for n in range(o.earliest, o.latest)}
    assert len(keys) == len(set(keys)) and not held & set(keys) and held | set(keys) == every
    assert {f"accepted-later-{i}" for i in range(len(extra))} <= set(
        bronze["event_id"].to_pylist())
    # Nothing left for a redrive in the new generation; the first stays as it was, proven.
    for d in sorted({q["quarantine_date"] for q in read(v2, "quarantined_events").to_pylist()}):
        assert run_redrive(spark, v2, d, run_id="after-rebuild").total_redriven == 0
    assert table_windows_for_spec(v1_spec, read(v1, "reconciled_aggregates")) == \
        expected_windows_for_spec(v1_spec, generated)
    assert all(compare_tables(v1, d) == 0 for d in bronze_dates(v1))
