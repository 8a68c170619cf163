"""Prometheus metrics of `make stream` (`service.metrics`): from hand-made progress reports and
Delta commits (no Spark, no broker), then end to end: the service as a subprocess on a fresh topic
and lakehouse, scraped over HTTP while it ingests good, bad and late records."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest
from conftest import free_port
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import PartitionOffsets
from lakehouse.tables.reads import read
from service.metrics import StreamMetrics, exposing
from testkit.generator import Record, produce
from transforms.parse import REASONS

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return parse(response.read().decode("utf-8"))


def value(samples: Samples, name: str, pipeline: str = "default", **labels) -> float | None:
    return samples.get((name, frozenset({"pipeline": pipeline, **labels}.items())))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(k)[label]: v for (n, k), v in samples.items() if n == name}


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


T0 = datetime(2026, 11, 21, 14, 0, tzinfo=UTC)


def progress(batch_id: int, at: datetime, *, rows: int = 0, ran: bool = True, trigger_ms: int = 1500,
             end: dict | None = None, watermark: datetime | None = None, dropped: int = 0) -> dict:
    """A StreamingQueryProgress as `json.loads(p.json)` gives it (the fields the metrics use)."""
    durations = {"triggerExecution": trigger_ms, "latestOffset": 3}
    if ran:
        durations["addBatch"] = trigger_ms - 100
    p = {"batchId": batch_id, "timestamp": iso(at), "numInputRows": rows,
         "inputRowsPerSecond": rows / 10, "processedRowsPerSecond": rows / (trigger_ms / 1000),
         "durationMs": durations, "sources": [{"endOffset": end}] if end is not None else []}
    if watermark is not None:
        p["eventTime"] = {"watermark": iso(watermark)}
        p["stateOperators"] = [{"numRowsDroppedByWatermark": dropped}, {"numRowsDroppedByWatermark": 0}]
    return p


# ---- no Spark ------------------------------------------------------------------------------------
def test_a_service_of_several_pipelines_serves_them_on_one_port(tmp_path):
    """One family per metric name, a sample per pipeline (the exposition format allows a name
    once), and a stopped pipeline's query shown inactive."""
    a, b = (StreamMetrics(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / n),
                                             "EVENTS_TOPIC": n}).model_copy(
        update={"pipeline": n}), offsets=lambda _s: []) for n in ("default", "orders"))
    b.query_active = False
    port = free_port()
    with exposing([a, b], port) as up:
        assert up
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode("utf-8")
    assert text.count("# TYPE lakehouse_stream_batch_duration_seconds histogram") == 1
    samples = parse(text)
    assert value(samples, "lakehouse_stream_query_active") == 1
    assert value(samples, "lakehouse_stream_query_active", pipeline="orders") == 0
    assert value(samples, "lakehouse_stream_batch_duration_seconds_count", pipeline="orders",
                 query="ingest") == 0


def test_progress_and_kafka_offsets_to_metrics(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path), "EVENTS_TOPIC": "orders",
                                  "WINDOW_SIZE": "1 minute"})
    offsets = [PartitionOffsets(0, 0, 120), PartitionOffsets(1, 5, 40), PartitionOffsets(2, 7, 7)]
    now = T0 + timedelta(minutes=5)
    # Two instances in one process: each has its own registry (the global one would refuse).
    first, metrics = (StreamMetrics(settings, offsets=lambda _s: offsets, clock=now.timestamp)
                      for _ in range(2))
    assert first.registry is not metrics.registry
    metrics.poll()
    assert metrics.lag() == {}  # the stream's position is not known yet: no guess
    reports = [
        progress(0, T0, rows=100, trigger_ms=2000, end={"orders": {"0": 100, "1": 10}}),
        progress(1, T0 + timedelta(seconds=10), ran=False, end={"orders": {"0": 100, "1": 10}}),
        progress(1, T0 + timedelta(seconds=20), rows=30, trigger_ms=500,
                 end={"orders": {"0": 110, "1": 30}}),
    ]
    assert metrics.observe_progress("ingest", reports) == 3
    assert metrics.observe_progress("ingest", reports) == 0  # already seen: nothing twice
    # The watermark is the one stamped on bronze's newest stream commit.
    wm = T0 - timedelta(seconds=5, milliseconds=500)
    stream_commit(settings, wm)
    metrics.poll()

    port = free_port()
    assert metrics.start(port=port)
    try:
        samples = scrape(port)
    finally:
        metrics.stop()
    # Partition 2 was never read by the stream: its lag counts from its earliest offset (none).
    assert by_label(samples, "lakehouse_kafka_consumer_lag_records", "partition") == {
        "0": 10, "1": 10, "2": 0}
    assert value(samples, "lakehouse_kafka_consumer_lag_records", topic="orders", partition="0") == 10
    assert value(samples, "lakehouse_stream_watermark_timestamp_seconds") == wm.timestamp()
    assert value(samples, "lakehouse_stream_watermark_delay_seconds") == 305.5
    # Newest closed 1-minute window: [13:58, 13:59) (13:59:54.5 is the watermark) -> 6 min old.
    assert value(samples, "lakehouse_aggregate_freshness_seconds") == 360.0
    # Executed batches only: the idle report is neither a batch nor a success.
    assert value(samples, "lakehouse_stream_batch_duration_seconds_count", query="ingest") == 2
    assert value(samples, "lakehouse_stream_batch_duration_seconds_sum", query="ingest") == 2.5
    assert value(samples, "lakehouse_stream_batch_duration_seconds_bucket", query="ingest", le="0.5") == 1
    assert value(samples, "lakehouse_stream_input_records_total", query="ingest") == 130
    assert value(samples, "lakehouse_stream_input_records_per_second", query="ingest") == 3.0
    assert value(samples, "lakehouse_stream_processed_records_per_second", query="ingest") == 60.0
    assert value(samples, "lakehouse_stream_rows_dropped_by_watermark_total", query="ingest") == 0
    assert value(samples, "lakehouse_stream_last_success_timestamp_seconds", query="ingest") == (
        T0 + timedelta(seconds=20.5)).timestamp()
    # Every reason code is exported from the start (absent series cannot be alerted on).
    assert set(by_label(samples, "lakehouse_quarantined_records_total", "reason").values()) == {0}
    assert set(by_label(samples, "lakehouse_quarantined_records_total", "reason")) == set(REASONS)
    assert value(samples, "lakehouse_metrics_poll_errors_total", source="kafka") == 0


def stream_commit(settings: Settings, watermark: datetime) -> None:
    """A bronze commit as the ingest query stamps it (delta-rs: no Spark)."""
    from deltalake import CommitProperties, write_deltalake

    from lakehouse.tables.commit_tags import StreamCommit

    commit = StreamCommit(0, {0: 1}, query="q", batch_id=0,
                          next_watermark_ms=int(watermark.timestamp() * 1000))
    write_deltalake(settings.table_path("bronze_events"), pa.table({"event_id": ["a"]}),
                    mode="append",
                    commit_properties=CommitProperties(custom_metadata={
                        "userMetadata": commit.metadata()}))


def test_quarantine_and_late_counts_follow_the_delta_log(tmp_path):
    from deltalake import write_deltalake

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    quarantine, late = settings.table_path("quarantined_events"), settings.table_path("late_events")

    def rows(reasons: list[str]) -> pa.Table:
        return pa.table({"reason": reasons, "offset": list(range(len(reasons))),
                         "quarantine_date": [date(2026, 11, 21)] * len(reasons)})

    write_deltalake(quarantine, rows(["invalid_json"] * 5), partition_by=["quarantine_date"])
    metrics = StreamMetrics(settings, offsets=lambda _s: [])
    metrics.start_following_tables()  # records committed before this are not counted
    write_deltalake(quarantine, rows(["invalid_json", "missing_key", "invalid_json"]), mode="append",
                    partition_by=["quarantine_date"])  # mixed reasons: the file is read
    write_deltalake(quarantine, rows(["invalid_value"] * 2), mode="append",
                    partition_by=["quarantine_date"])  # one reason: its statistics suffice
    write_deltalake(late, pa.table({"event_id": ["a", "b", "c"]}))  # created after the start
    metrics.poll()
    write_deltalake(quarantine, rows(["empty_payload"] * 7), mode="overwrite",
                    partition_by=["quarantine_date"])  # a rewrite, not new records
    write_deltalake(late, pa.table({"event_id": ["d"]}), mode="append")
    metrics.poll()
    samples = parse(generate_latest(metrics.registry).decode())
    counts = {k: v for k, v in by_label(samples, "lakehouse_quarantined_records_total", "reason").items() if v}
    assert counts == {"invalid_json": 2, "missing_key": 1, "invalid_value": 2}
    assert value(samples, "lakehouse_late_events_total") == 4
    # Every late event is a row the watermark kept out of the aggregates.
    assert value(samples, "lakehouse_stream_rows_dropped_by_watermark_total", query="ingest") == 4
    assert value(samples, "lakehouse_metrics_poll_errors_total", source="quarantined_events") == 0
    # One service per pipeline: every sample names it.
    assert {dict(labels).get("pipeline") for _, labels in samples} == {"default"}


# ---- the service, end to end ---------------------------------------------------------------------
def event(i: int, t: datetime) -> Record:
    body = {"event_id": f"m-{i}", "key": f"k{i % 8}", "event_time": iso(t), "value": "1.5"}
    return Record(body["key"].encode(), json.dumps(body).encode(), "event", body)


BAD = {  # reason -> payloads
    "invalid_json": [b'{"event_id": "x1", "key": ', b"not json", b'{"a": 1'],
    "missing_event_id": [json.dumps({"key": "k1", "event_time": "2026-11-21T14:00:00Z",
                                     "value": 1}).encode()] * 2,
    "invalid_value": [json.dumps({"event_id": "x9", "key": "k1", "event_time": "2026-11-21T14:00:00Z",
                                  "value": "12,50 EUR"}).encode()],
}


TRIGGER_S = 2
LATENCY = "lakehouse_end_to_end_latency_seconds"


@pytest.mark.slow
def test_service_serves_metrics(instance_env):
    from test_service import start_service, wait_for

    settings = instance_env
    port = free_port()
    env = {**os.environ, "STREAM_TRIGGER_INTERVAL": f"{TRIGGER_S} seconds",
           "METRICS_PORT": str(port)}
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    good = [event(i, base + timedelta(seconds=i)) for i in range(40)]
    bad = [Record(b"k1", payload, reason) for reason, payloads in BAD.items() for payload in payloads]
    produce(settings, good[:20] + bad + good[20:])
    newest = base + timedelta(seconds=39)

    svc = start_service(env)
    state: dict = {}

    def until(check, what: str) -> None:
        """Scrape until `check(samples)` holds; on a timeout, say what the last scrape had."""
        def scraped() -> bool:
            try:
                state["m"] = scrape(port)
            except OSError:
                return False
            return bool(check(state["m"]))

        try:
            wait_for(scraped, svc, what=what)
        except AssertionError as exc:
            last = {k: v for k, v in (state.get("m") or {}).items() if k[0].startswith("lakehouse_")}
            raise AssertionError(f"{exc}\nlast scrape: {last}") from None

    try:
        # Quarantine counted by reason, exactly what was produced.
        want = Counter({reason: len(p) for reason, p in BAD.items()})
        until(lambda m: Counter({
            k: int(v) for k, v in by_label(m, "lakehouse_quarantined_records_total", "reason").items() if v
        }) == want, f"quarantine counters {dict(want)}")
        # Lag for every partition of the topic, down to 0 once bronze has caught up; the
        # watermark is the newest event time minus WATERMARK_DELAY (30 s).
        until(lambda m: (lag := by_label(m, "lakehouse_kafka_consumer_lag_records", "partition"))
              and set(lag) == {"0", "1", "2", "3"} and not any(lag.values())
              and value(m, "lakehouse_stream_watermark_timestamp_seconds")
              == (newest - timedelta(seconds=30)).timestamp()
              and value(m, "lakehouse_stream_batch_duration_seconds_count", query="ingest") >= 1,
              "lag 0 on the 4 partitions and the watermark")
        m = state["m"]
        assert value(m, "lakehouse_stream_input_records_total", query="ingest") == len(good) + len(bad)
        assert 30 < value(m, "lakehouse_stream_watermark_delay_seconds") < 30 + 20 * 60
        assert value(m, "lakehouse_aggregate_freshness_seconds") >= value(
            m, "lakehouse_stream_watermark_delay_seconds")
        assert value(m, "lakehouse_late_events_total") == 0
        first_success = value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
        assert time.time() - 120 < first_success <= time.time()

        # Two events far behind the watermark: late, dropped by the fast path and recorded.
        late = [event(100 + i, base - timedelta(minutes=5)) for i in range(2)]
        produce(settings, late + [event(200, newest + timedelta(seconds=5))])
        until(lambda m: value(m, "lakehouse_late_events_total") == 2
              and value(m, "lakehouse_stream_rows_dropped_by_watermark_total", query="ingest") == 2
              and value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
              > first_success,
              "2 late events, recorded and dropped, by a new batch")
        m = state["m"]
        assert value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest") > first_success

        # The latency histogram against a probe from outside: one event at a time, produced
        # now and polled for in streaming_aggregates with delta-rs; the batch's sample (the
        # histogram's sum grows by it) is within one trigger interval of what the probe saw.
        from confluent_kafka import Producer

        # First every batch so far observed: the count holds still for two metrics polls (5 s).
        held: list = [None, 0.0]

        def settled(m) -> bool:
            if value(m, LATENCY + "_count") != held[0]:
                held[:] = [value(m, LATENCY + "_count"), time.monotonic()]
            return time.monotonic() - held[1] > 11

        until(settled, "the latency histogram settled")
        m = state["m"]
        producer = Producer({**settings.client_config, "linger.ms": 0})
        for j in range(3):
            count = value(m, LATENCY + "_count")
            total = value(m, LATENCY + "_sum")
            probe = f"probe-{j}"
            newest = datetime.now(UTC).replace(microsecond=0)
            body = {"event_id": probe, "key": probe, "event_time": iso(newest), "value": "1"}
            sent = time.time()
            producer.produce(settings.events_topic, key=probe, value=json.dumps(body))
            producer.flush(10)
            wait_for(lambda p=probe: p in read(settings, "streaming_aggregates")["key"].to_pylist(),
                     svc, what=f"{probe} visible in streaming_aggregates", interval=0.05)
            seen = time.time() - sent
            until(lambda m, c=count: value(m, LATENCY + "_count") == c + 1,
                  f"the latency sample of {probe}'s batch")
            m = state["m"]
            sample = value(m, LATENCY + "_sum") - total
            assert abs(sample - seen) <= TRIGGER_S, (probe, sample, seen)
        del producer  # its connections closed before the broker stops
        assert value(m, "lakehouse_metrics_poll_errors_total", source="streaming_aggregates") == 0
        assert value(m, "lakehouse_metrics_poll_errors_total", source="kafka") == 0
        assert value(m, "lakehouse_metrics_poll_errors_total", source="quarantined_events") == 0
    finally:
        if svc.poll() is None:
            svc.send_signal(signal.SIGTERM)
        out, _ = svc.communicate(timeout=120)
    assert svc.returncode == 0, out[-3000:]
    assert "stopped cleanly" in out
    assert f"metrics on http://127.0.0.1:{port}/metrics" in out
    with pytest.raises(OSError):  # stopped with the service
        scrape(port)
    stopped_at, before = time.time(), state["m"]

    # A restart with nothing new to read runs no batch: the last success time and the position
    # come from the checkpoint, the watermark from bronze's log; the counters start from 0.
    svc = start_service(env)
    try:
        # The newest event time (the last probe's) minus the delay.
        watermark = (newest - timedelta(seconds=30)).timestamp()
        until(lambda m: value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
              and by_label(m, "lakehouse_kafka_consumer_lag_records", "partition")
              and value(m, "lakehouse_stream_watermark_timestamp_seconds") == watermark,
              "metrics of the restarted service")
        m = state["m"]
        last = value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
        assert first_success <= last <= stopped_at
        assert by_label(m, "lakehouse_kafka_consumer_lag_records", "partition") == {
            "0": 0, "1": 0, "2": 0, "3": 0}
        assert value(before, "lakehouse_stream_watermark_timestamp_seconds") <= watermark
        assert value(m, "lakehouse_late_events_total") == 0
        assert value(m, "lakehouse_stream_batch_duration_seconds_count", query="ingest") == 0
    finally:
        if svc.poll() is None:
            svc.send_signal(signal.SIGTERM)
        out, _ = svc.communicate(timeout=120)
    assert svc.returncode == 0, out[-3000:]
