"""One service for three pipelines (`make stream` with PIPELINES): one Spark application, a query
per pipeline in its own scheduler pool, metrics labelled by pipeline on one port. A SIGKILL while
a batch of the orders pipeline is in flight, a restart, a SIGKILL inside a batch of the default
pipeline (bronze committed, aggregates not) and a restart lose and duplicate nothing in any of
them; every date of each is then proven (gold == the replay of its log), the orders' gold and
replay equal the independent reference and their live aggregates count every event once but
exactly the copies the late lane recorded; a topic deleted under another stops that pipeline
alone, the others go on."""

import os
import signal
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families
from reference import aggregate, dedup, rows_of

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin
from lakehouse.specs.pipeline import load_spec
from lakehouse.tables.reads import read
from testkit.faults import (
    kill_in_flight,
    kill_inside_batch,
    output,
    running_service,
    start_service,
    wait_for,
)
from testkit.generator import GeneratorConfig, generate, produce
from testkit.reference import VALID_KINDS
from testkit.spec_events import (
    expected_windows_for_spec,
    generate_for_spec,
    rows_for_spec,
    table_windows_for_spec,
    windows_of_rows,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def spec_copy(folder: Path, name: str) -> Path:
    """An example spec with a topic of its own (tests share one broker)."""
    spec = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    spec["topic"] = f"{name}-{uuid.uuid4().hex[:8]}"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def rows(settings, table: str) -> int:
    try:
        return read(settings, table).num_rows
    except Exception:
        return 0


def positions(settings) -> Counter:
    """(partition, offset) of every record in bronze or the quarantine."""
    out: Counter = Counter()
    for table in ("bronze_events", "quarantined_events"):
        t = read(settings, table)
        out.update(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    return out


def scrape(port: int) -> dict[tuple[str, str], float]:
    """{(metric sample name, pipeline): value} of the ingest query's series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    return {(s.name, s.labels["pipeline"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("query", "ingest") == "ingest" and "pipeline" in s.labels}


def default_aggregates(settings) -> dict:
    return {(r["window_start"].astimezone(UTC).replace(tzinfo=None), r["key"]):
            (r["event_count"], r["value_sum"], r["value_min"], r["value_max"])
            for r in read(settings, "streaming_aggregates").to_pylist()}


def default_expected(settings, records) -> dict:
    """Every event counted once, except exactly the copies the late lane recorded."""
    late_ids = Counter(read(settings, "late_events")["event_id"].to_pylist())
    kept = []
    for r in reversed(rows_of([records])[0]):  # a late copy arrives after the one that counted
        if late_ids[r.event_id]:
            late_ids[r.event_id] -= 1
        else:
            kept.append(r)
    assert not +late_ids
    return aggregate(dedup(list(reversed(kept))))


def prove_every_date(env: dict, settings: dict) -> dict[str, str]:
    """`reconcile_dates` of every pipeline (its prefixed job) for each of its bronze dates, in
    this process on a code location of `env`; per pipeline "proven" or what failed."""
    from dagster import DagsterInstance

    from assets.pipelines import Pipeline, spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.config.env import overridden
    from lakehouse.tables.reads import bronze_dates, compare_tables
    from orchestration.definitions import definitions_for
    from testkit.runs import run_in, step_failures

    out = {}
    with overridden({k: env[k] for k in ("PIPELINES", "LAKEHOUSE_ROOT", "EVENTS_TOPIC",
                                         "KAFKA_BOOTSTRAP_SERVERS")}):
        pipelines = [Pipeline.of(settings["default"]), *spec_pipelines()]
        defs = definitions_for(pipelines, LakehouseResource())
        instance = DagsterInstance.ephemeral()
        for p in pipelines:
            s, verdicts = settings[p.name], []
            for d in sorted(bronze_dates(s)):
                result, _ = run_in(defs, p.named("reconcile_dates"), instance,
                                   partition_key=d.isoformat())
                verdicts.append(f"{d}: {step_failures(result)}" if not result.success
                                else f"{d}: {compare_tables(s, d)} windows differ"
                                if compare_tables(s, d) else "")
            out[p.name] = "; ".join(v for v in verdicts if v) or "proven"
    return out


@pytest.mark.long
def test_three_pipelines_in_one_service(instance_env, tmp_path):
    del instance_env  # its environment (broker, fresh root and topic) is os.environ now
    specs = [spec_copy(tmp_path, n) for n in ("orders", "app_events")]
    port = free_port()
    env = {**os.environ, "PIPELINES": ",".join(map(str, specs)), "METRICS_PORT": str(port),
           "STREAM_TRIGGER_INTERVAL": "1 second", "MAX_OFFSETS_PER_TRIGGER": "400"}
    default = Settings.from_env(env)
    spec_of = {s.name: s for s in map(load_spec, specs)}
    settings = {"default": default,
                **{n: s.settings(default, env) for n, s in spec_of.items()}}
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = {"default": generate(GeneratorConfig(count=1600, seed=11, end=end,
                                                   span=timedelta(hours=2), keys=5,
                                                   late_fraction=0.05)).records,
               **{n: generate_for_spec(s, GeneratorConfig(
                   count=900, seed=12, end=end, span=timedelta(hours=2), late_fraction=0.05,
                   duplicate_fraction=0.04, malformed_fraction=0.03)).records
                  for n, s in spec_of.items()}}
    third = {n: len(r) // 3 for n, r in records.items()}
    for n, r in records.items():
        produce(settings[n], r[:third[n]])

    def valid(n, upto=None):
        return sum(1 for r in records[n][:upto] if r.kind in VALID_KINDS)

    with running_service(env, tmp_path / "service-1.log") as svc:
        wait_for(lambda: all(rows(settings[n], "bronze_events") > 0 for n in settings), svc,
                 what="a batch of every pipeline")
        log = output(svc, 200_000)
        assert "streaming 3 pipeline(s) in one Spark application: default, orders, app_events" \
            in log, log
        wait_for(lambda: all(scrape(port)[("lakehouse_stream_input_records_total", n)] > 0
                             for n in settings), svc, what="every pipeline's records counted")
        assert all(scrape(port)[("lakehouse_stream_query_active", n)] == 1 for n in settings)
        for n, r in records.items():
            produce(settings[n], r[third[n]:2 * third[n]])
        # SIGKILL while a batch of the orders pipeline is in flight (offsets/N written,
        # commits/N not), the two others mid-stream.
        kill_in_flight(svc, settings["orders"].checkpoint_path("ingest"), min_batch=1)

    with running_service(env, tmp_path / "service-2.log") as svc:
        wait_for(lambda: rows(settings["orders"], "bronze_events") > valid("orders", third["orders"]),
                 svc, what="the orders pipeline's progress after the restart")
        for n, r in records.items():
            produce(settings[n], r[2 * third[n]:])
        # SIGKILL inside a batch of the default pipeline (bronze committed, aggregates not).
        kill_inside_batch(svc, default, "bronze_before_aggregates", min_batch=1)

    svc = start_service(env, tmp_path / "service-3.log")
    try:
        wait_for(lambda: all(rows(settings[n], "bronze_events") >= valid(n) for n in settings),
                 svc, what="every pipeline caught up after the restart")
        # Gold == the replay of the log for every date of every pipeline (Dagster's proof, run
        # beside the service as the daily jobs are).
        assert prove_every_date(env, settings) == {n: "proven" for n in settings}
        # Isolation: app_events' topic deleted under it; its query stops, the others go on.
        gone = settings["app_events"].events_topic
        admin(settings["app_events"]).delete_topics([gone])[gone].result(30)
        wait_for(lambda: "pipeline 'app_events' stopped; still streaming: default, orders"
                 in output(svc, 200_000), svc, what="app_events to stop alone")
        assert scrape(port)[("lakehouse_stream_query_active", "app_events")] == 0
        more = generate(GeneratorConfig(count=200, seed=13, keys=5, end=end + timedelta(minutes=2),
                                        span=timedelta(minutes=1), late_fraction=0)).records
        produce(default, more)
        records["default"] += more
        wait_for(lambda: default_aggregates(default) == default_expected(default,
                                                                         records["default"]),
                 svc, what="the default pipeline still publishing, exact")
    finally:
        if svc.poll() is None:
            svc.send_signal(signal.SIGTERM)
        svc.wait(120)
    assert svc.returncode == 1, output(svc)  # a pipeline's query failed: not a clean stop

    # Every record of every pipeline once, in bronze or the quarantine: offsets dense.
    for n, s in settings.items():
        got = positions(s)
        assert max(got.values()) == 1, n
        assert rows(s, "bronze_events") == valid(n), n
        for p in {p for p, _ in got}:
            assert {o for pp, o in got if pp == p} == set(range(max(o for pp, o in got
                                                                    if pp == p) + 1)), (n, p)
    # The crashed pipelines' aggregates exact, after their restarts and the stop.
    assert default_aggregates(default) == default_expected(default, records["default"])
    orders, spec = settings["orders"], spec_of["orders"]
    late = read(orders, "late_events")
    assert late.num_rows > 0
    assert max(Counter(zip(late["partition"].to_pylist(), late["offset"].to_pylist(),
                           strict=True)).values()) == 1
    late_ids, kept = Counter(late["event_id"].to_pylist()), []
    for r in reversed(rows_for_spec(spec, records["orders"])):  # a late copy comes after
        if late_ids[r.event_id]:
            late_ids[r.event_id] -= 1
        else:
            kept.append(r)
    assert not +late_ids
    assert table_windows_for_spec(spec, read(orders, "streaming_aggregates")) == \
        windows_of_rows(spec, list(reversed(kept)))
    expected = expected_windows_for_spec(spec, records["orders"])
    assert table_windows_for_spec(spec, read(orders, "reconciled_aggregates")) == expected
    assert table_windows_for_spec(spec, read(orders, "replay_aggregates")) == expected
