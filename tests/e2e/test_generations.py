"""Spec edits on Spark and a broker (`lakehouse.tables.generations`; what each kind takes:
tests/unit/test_spec_edits.py): an in-place change applied by the stream's next start (refused
by other writers before), old rows kept, a date's next corrections run recomputing the whole
date; a rebuild built apart from the Kafka log, a date the retained log no longer holds reported
as not rebuildable and never switched in silently."""

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from test_spec_edits import BASE, spec_settings

from lakehouse.config.settings import Settings
from lakehouse.tables.reads import bronze_dates, compare_tables, read


def _records(spec, count: int, seed: int, end: datetime, span: timedelta):
    from testkit.generator import GeneratorConfig
    from testkit.spec_events import generate_for_spec

    return generate_for_spec(spec, GeneratorConfig(
        count=count, seed=seed, end=end, span=span, late_fraction=0.05,
        duplicate_fraction=0.03, malformed_fraction=0.02)).records


def _rebuild_dates(spark, settings) -> None:
    """What `reprocess_dates` runs per date: the replay from the log, then gold from it."""
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay

    for d in sorted(bronze_dates(settings)):
        run_replay(spark, settings, d)
        run_corrections(spark, settings, d, run_id="test", reprocess=True)


@pytest.mark.long
def test_an_in_place_edit_is_applied_by_the_next_stream_start(tmp_path, kafka_bootstrap, spark):
    from lakehouse.tables.generations import SpecChangePending, records, resolve
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import catch_up
    from testkit.generator import produce
    from testkit.spec_events import (
        expected_windows_for_spec,
        rows_for_spec,
        table_windows_for_spec,
    )

    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
                              "EVENTS_TOPIC": f"gen-{uuid.uuid4().hex[:8]}"})
    v1_spec, v1 = spec_settings(tmp_path, base,
                                measures=[{"field": "amount", "aggregates": ["sum"]}])
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    first = _records(v1_spec, 300, 5, end - timedelta(minutes=30), timedelta(hours=1))
    produce(v1, first)
    catch_up(spark, v1)
    _rebuild_dates(spark, v1)
    assert table_windows_for_spec(v1_spec, read(v1, "reconciled_aggregates")) == \
        expected_windows_for_spec(v1_spec, first)

    v2_spec, edited = spec_settings(
        tmp_path, base, measures=[{"field": "amount", "aggregates": ["sum", "max"]}],
        window={**BASE["window"], "watermark_delay": "45 seconds"})
    v2 = resolve(edited)
    assert v2.home is None and v2.root == v1.root  # in place: the same folder
    dates_before = bronze_dates(v1)
    d = min(dates_before)
    for writer in (lambda: run_replay(spark, v2, d),
                   lambda: run_corrections(spark, v2, d, run_id="t")):
        with pytest.raises(SpecChangePending, match="applies the change at its next start"):
            writer()
    assert "amount_max" not in read(v1, "reconciled_aggregates").column_names

    # One more order in the newest event's window (open: above the watermark), so the edit
    # meets a window it has to fold into.
    valid = [r for r in first if r.kind == "event"]
    times = [row.time for row in rows_for_spec(v1_spec, valid)]
    top = valid[times.index(max(times))]
    oid = json.loads(top.value)["order_id"]
    again = dataclasses.replace(top, value=top.value.replace(f'"{oid}"'.encode(),
                                                             f'"{oid}-again"'.encode()))
    second = [again, *_records(v2_spec, 200, 6, end, timedelta(minutes=30))]
    keyed = {(r["window_start"], r["region"], r["currency"]): r
             for r in read(v1, "streaming_aggregates").to_pylist()}
    open_before = {k: r["event_count"] for k, r in keyed.items() if r["status"] == "open"}
    assert open_before
    produce(v2, second)
    catch_up(spark, v2)  # the stream's start applies the edit
    rows = records(v2)
    assert [(r["spec_version"], r["status"]) for r in rows] == [(v2.results_version, "active")]
    assert "new columns amount_max" in rows[0]["note"]
    gold = read(v2, "reconciled_aggregates")
    assert "amount_max" in gold.column_names
    old = {(r["window_start"], r["region"], r["currency"]): r for r in gold.to_pylist()}
    # Old rows keep their values; the new column is null in them until the dates are rebuilt.
    assert old and all(r["amount_max"] is None for r in old.values())
    # The fast path's windows open at the edit, folded into since, hold null in the new column,
    # never the max of the events since the edit alone; the windows opened since hold it.
    fast = {(r["window_start"], r["region"], r["currency"]): r
            for r in read(v2, "streaming_aggregates").to_pylist()}
    folded = [k for k, n in open_before.items() if fast[k]["event_count"] > n]
    assert folded and all(fast[k]["amount_max"] is None for k in open_before)
    assert all(r["amount_max"] is not None for k, r in fast.items() if k not in keyed)
    # A date's next corrections run (the hourly schedule's, a late event's), not a reprocess,
    # recomputes the whole date: its gold was computed before the edit. (A date first seen
    # since, when the second chunk crossed a midnight, has its first run.)
    for d in sorted(bronze_dates(v2)):
        result = run_corrections(spark, v2, d, run_id="after-edit")
        why = "took the folder in place" if d in dates_before else "first run for the date"
        assert result.mode == "full" and why in result.reason, (d, result.reason)
        assert run_corrections(spark, v2, d, run_id="again").mode == "incremental"
        run_replay(spark, v2, d)
    expected = expected_windows_for_spec(v2_spec, first + second)
    assert table_windows_for_spec(v2_spec, read(v2, "reconciled_aggregates")) == expected
    assert all(compare_tables(v2, d) == 0 for d in bronze_dates(v2))


def test_a_date_beyond_the_retained_log_is_reported_not_rebuildable(tmp_path, kafka_bootstrap,
                                                                     spark, monkeypatch):
    from confluent_kafka import TopicPartition

    from lakehouse.kafka.admin import admin, topic_offsets
    from lakehouse.tables.generations import records, resolve
    from spark_jobs.generations import SwitchRefused, switch, verdicts
    from spark_jobs.stream import catch_up
    from testkit.generator import end_across_midnight, produce
    from testkit.spec_events import expected_windows_for_spec, table_windows_for_spec

    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
                              "EVENTS_TOPIC": f"gen-{uuid.uuid4().hex[:8]}"})
    v1_spec, v1 = spec_settings(tmp_path, base)
    end = end_across_midnight(datetime.now(UTC).replace(second=0, microsecond=0))
    records_ = _records(v1_spec, 400, 7, end, timedelta(hours=4))
    produce(v1, records_)
    catch_up(spark, v1)
    _rebuild_dates(spark, v1)
    first, last = sorted(bronze_dates(v1))[:1] + sorted(bronze_dates(v1))[-1:]
    # Retention takes the oldest records of every partition (some of the first date's).
    cut = {o.partition: o.earliest + (o.latest - o.earliest) // 5 for o in topic_offsets(v1)}
    for f in admin(v1).delete_records([TopicPartition(v1.events_topic, p, o)
                                       for p, o in cut.items()]).values():
        f.result(30)

    v2_spec, edited = spec_settings(tmp_path, base, dimensions=["currency"])
    v2 = resolve(edited)
    assert v2.home == v1.root and v2.root.endswith(f"_generations/{v2.results_version}")
    catch_up(spark, v2)  # the new generation, from the earliest retained offset
    from lakehouse.kafka.log_ranges import ReplayIncomplete
    from spark_jobs.replay import run_replay

    # Every record was appended today: deleted ones may belong to either date (the broker's
    # append time is all a replay can bound a date by), so neither can be rebuilt.
    for d in (first, last):
        with pytest.raises(ReplayIncomplete, match="retention cut the log"):
            run_replay(spark, v2, d)
    report = verdicts(spark, v2)
    assert report.proven == [] and not report.unproven
    assert sorted(report.not_rebuildable) == [first.isoformat(), last.isoformat()]
    assert all("retention cut the log" in why for why in report.not_rebuildable.values())
    with pytest.raises(SwitchRefused, match="2 not rebuildable from the log"):
        switch(spark, v2)
    # Nothing moved: the old generation is where it was, as it was, and still proven.
    assert table_windows_for_spec(v1_spec, read(v1, "reconciled_aggregates")) == \
        expected_windows_for_spec(v1_spec, records_)
    assert all(compare_tables(v1, d) == 0 for d in (first, last))
    # A switch that dies before its one registry commit changes nothing; the next one switches.
    import spark_jobs.generations as generations

    def dies(*_, **__):
        raise OSError("killed mid-switch")

    monkeypatch.setattr(generations, "_append", dies)
    with pytest.raises(OSError, match="killed mid-switch"):
        switch(spark, v2, accept_not_rebuildable=True)
    monkeypatch.undo()
    assert resolve(edited).root == v2.root and resolve(v1).root == v1.root
    done = switch(spark, v2, accept_not_rebuildable=True)
    assert done.switched and done.not_rebuildable == report.not_rebuildable
    row = records(v1)[-1]
    assert (row["spec_version"], row["status"], row["location"]) == (
        v2.results_version, "active", f"_generations/{v2.results_version}")
    assert json.loads(row["not_rebuildable"]) == report.not_rebuildable
    assert (v1.results_version, "retired", ".") in {
        (r["spec_version"], r["status"], r["location"]) for r in records(v1)}
    # Nothing moved: the new generation is current where it was built, the old one readable
    # where it was until retired.
    now = resolve(edited)
    assert (now.root, now.home) == (v2.root, v1.root)
    with pytest.raises(SwitchRefused, match="no generation is being built"):
        switch(spark, now)
    assert read(now, "bronze_events").column_names[:2] == ["event_id", "currency"]
    assert table_windows_for_spec(v1_spec, read(v1, "reconciled_aggregates")) == \
        expected_windows_for_spec(v1_spec, records_)
    from spark_jobs.generations import retire

    with pytest.raises(ValueError, match="not retired"):
        retire(spark, now, v2.results_version)
    assert retire(spark, now, v1.results_version) == "."
    assert not Path(v1.table_path("bronze_events")).exists()
    assert records(v1)[-1]["status"] == "deleted"
    assert resolve(edited).root == v2.root and read(now, "bronze_events").num_rows > 0


@pytest.mark.long
def test_a_spec_edit_while_the_service_runs_waits_for_its_next_start(tmp_path, kafka_bootstrap,
                                                                      spark):
    """`make stream` keeps the spec it started with: an in-place edit made meanwhile is refused
    by the new spec's runs (the catch-up: the stream's lock; a replay: not applied yet) and the
    service's own batches stay in the old shape; its next start applies the edit. An edit that
    needs a rebuild meanwhile builds apart, beside the running service."""
    import os
    import signal

    from conftest import free_port

    from lakehouse.tables.generations import SpecChangePending, records, resolve
    from lakehouse.tables.locks import CheckpointBusy
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import catch_up, run_available_now
    from testkit.faults import running_service, wait_for
    from testkit.generator import produce

    base = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
                              "EVENTS_TOPIC": f"gen-{uuid.uuid4().hex[:8]}"})
    path = tmp_path / "orders.yaml"

    def edit(**changes):
        from lakehouse.specs.pipeline import load_spec

        path.write_text(yaml.safe_dump({**BASE, "topic": base.events_topic, **changes}))
        spec = load_spec(path)
        return spec, resolve(spec.settings(base, {}))

    v1_spec, v1 = edit(measures=[{"field": "amount", "aggregates": ["sum"]}])
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    recs = _records(v1_spec, 600, 9, end, timedelta(hours=1))
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "LAKEHOUSE_ROOT": str(tmp_path / "lake"), "PIPELINE": str(path),
           "STREAM_TRIGGER_INTERVAL": "1 second", "METRICS_PORT": str(free_port())}

    def bronze_rows(settings) -> int:
        try:
            return read(settings, "bronze_events").num_rows
        except Exception:
            return 0

    def measured(settings) -> bool:
        """The fast path holds the new measure (a batch under v2 published its windows)."""
        table = read(settings, "streaming_aggregates")
        return "amount_max" in table.column_names and any(
            v is not None for v in table["amount_max"].to_pylist())

    produce(v1, recs[:200])
    with running_service(env) as svc:
        wait_for(lambda: bronze_rows(v1) > 0, svc, what="the first batch under v1")
        _, v2 = edit(measures=[{"field": "amount", "aggregates": ["sum", "max"]}])
        assert v2.home is None  # in place
        with pytest.raises(CheckpointBusy):
            run_available_now(spark, v2)
        with pytest.raises(SpecChangePending):
            run_replay(spark, v2, min(bronze_dates(v1)))
        produce(v1, recs[200:400])
        wait_for(lambda: bronze_rows(v1) >= 380, svc, what="the service's batches after the edit")
        assert "amount_max" not in read(v1, "streaming_aggregates").column_names
        assert records(v1) == []  # nothing applied: the tables still hold v1
        # An edit that needs a rebuild builds apart, beside the running service.
        _, v3 = edit(dimensions=["currency"])
        assert v3.home == v1.root
        catch_up(spark, v3)
        assert read(v3, "bronze_events").num_rows >= 380
        assert read(v3, "bronze_events").column_names[:2] == ["event_id", "currency"]
        _, v2 = edit(measures=[{"field": "amount", "aggregates": ["sum", "max"]}])
        svc.send_signal(signal.SIGTERM)
        out, _ = svc.communicate(timeout=120)
        assert svc.returncode == 0 and "in place" not in out, out[-3000:]

    produce(v1, recs[400:])
    with running_service(env) as svc:  # the next start applies the edit
        wait_for(lambda: bronze_rows(v2) >= 560 and measured(v2), svc,
                 what="the batches under v2, their windows published")
        svc.send_signal(signal.SIGTERM)
        out, _ = svc.communicate(timeout=120)
        assert svc.returncode == 0, out[-3000:]
    assert f"-> {v2.results_version} in place" in out
    assert [(r["spec_version"], r["status"]) for r in records(v2)] == [
        (v3.results_version, "building"), (v2.results_version, "active")]
