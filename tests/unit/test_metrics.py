"""Prometheus metrics of `make stream` (`orchestration.service.metrics`) from hand-made progress reports and
Delta commits (no Spark, no broker; end to end: tests/e2e/test_metrics_service.py)."""

from __future__ import annotations

import urllib.request
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
from conftest import free_port
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import PartitionOffsets
from orchestration.service.metrics import StreamMetrics, exposing
from spark_jobs.transforms.parse import REASONS

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
