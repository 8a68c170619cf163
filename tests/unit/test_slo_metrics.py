"""The service's SLI metrics without Spark: lag in seconds and the end-to-end latency from
bronze's Delta log (commits written here with delta-rs, with the statistics Spark's writes
carry), batches and failures, the writer lock, and the budgets from the settings."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
from prometheus_client.parser import text_string_to_metric_families
from test_metrics import progress

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import PartitionOffsets
from lakehouse.tables.commit_tags import batch_tag
from orchestration.service.metrics import StreamMetrics, broker_times


def scraped(metrics: StreamMetrics) -> dict:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def append_bronze(settings: Settings, broker_times_: list[datetime], batch: int = 0) -> None:
    rows = pa.table({"event_id": [f"e{i}" for i in range(len(broker_times_))],
                     "kafka_timestamp": pa.array(broker_times_, pa.timestamp("us", tz="UTC"))})
    write_deltalake(settings.table_path("bronze_events"), rows, mode="append",
                    commit_properties=CommitProperties(custom_metadata={
                        "userMetadata": batch_tag("q", batch)}))


def publish(settings: Settings, batch: int) -> float:
    """The batch's aggregates commit (its windows visible); its time, unix seconds."""
    write_deltalake(settings.table_path("streaming_aggregates"), pa.table({"key": ["k"]}),
                    mode="append", commit_properties=CommitProperties(custom_metadata={
                        "userMetadata": batch_tag("q", batch)}))
    return time.time()


def test_broker_times_from_add_statistics():
    adds = [{"stats": '{"numRecords": 2, "minValues": {"kafka_timestamp": "2026-11-21T14:00:00.000Z"},'
                      ' "maxValues": {"kafka_timestamp": "2026-11-21T14:00:05.500Z"}}'},
            {"stats": '{"numRecords": 1}'}]
    t0 = datetime(2026, 11, 21, 14, tzinfo=UTC).timestamp()
    assert broker_times(adds) == (t0, t0 + 5.5)
    assert broker_times([{"stats": "{}"}]) is None


def test_lag_seconds_latency_batches_lock_and_budgets(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path), "STALL_AFTER": "90 seconds",
                                  "LAG_BUDGET": "4 minutes", "LATENCY_BUDGET": "1 minute"})
    now = datetime.now(UTC).replace(microsecond=0)
    ends = [PartitionOffsets(0, 0, 100)]
    metrics = StreamMetrics(settings, offsets=lambda _s: ends)
    append_bronze(settings, [now - timedelta(hours=1)])  # before the service: positions only
    metrics.start_following_tables()
    metrics.poll()
    m = scraped(metrics)
    assert ("lakehouse_end_to_end_latency_seconds_count", ()) in m
    assert m[("lakehouse_end_to_end_latency_seconds_count", ())] == 0
    assert ("lakehouse_kafka_consumer_lag_seconds", ()) not in m  # the position is unknown yet
    assert m[("lakehouse_slo_budget_seconds", (("slo", "stall"),))] == 90
    assert m[("lakehouse_slo_budget_seconds", (("slo", "lag"),))] == 240
    assert m[("lakehouse_slo_budget_seconds", (("slo", "latency"),))] == 60
    assert m[("lakehouse_slo_budget_seconds", (("slo", "freshness"),))] == 900
    assert ("lakehouse_writer_lock_held", ()) not in m

    # A batch: 60 records behind; bronze commits records appended 40 to 30 s ago; its windows
    # are visible 3 s later: the latency is counted from the broker to that commit.
    metrics.observe_progress("ingest", [progress(0, now, rows=40, end={"events": {"0": 40}})])
    append_bronze(settings, [now - timedelta(seconds=40), now - timedelta(seconds=30)], batch=1)
    metrics.poll()
    m = scraped(metrics)
    assert m[("lakehouse_end_to_end_latency_seconds_count", ())] == 0  # not visible yet
    time.sleep(3)
    visible = publish(settings, batch=1)
    metrics.poll()
    metrics.lock_held(True)
    m = scraped(metrics)
    assert m[("lakehouse_stream_batches_total", (("query", "ingest"),))] == 1
    assert m[("lakehouse_end_to_end_latency_seconds_count", ())] == 1
    waited = visible - (now - timedelta(seconds=40)).timestamp()
    assert waited - 1 <= m[("lakehouse_end_to_end_latency_seconds_sum", ())] <= waited
    assert 30 <= m[("lakehouse_kafka_consumer_lag_seconds", ())] < 30 + 60
    assert m[("lakehouse_writer_lock_held", ())] == 1

    # A batch of late events only (no window changed: no aggregates commit): its records were
    # visible with bronze, counted once the next batch is committed.
    append_bronze(settings, [now - timedelta(seconds=20)], batch=2)
    metrics.poll()
    assert scraped(metrics)[("lakehouse_end_to_end_latency_seconds_count", ())] == 1
    append_bronze(settings, [now - timedelta(seconds=10)], batch=3)
    metrics.poll()
    m = scraped(metrics)
    assert m[("lakehouse_end_to_end_latency_seconds_count", ())] == 2
    assert m[("lakehouse_metrics_poll_errors_total", (("source", "streaming_aggregates"),))] == 0

    # Caught up: no lag, 0 seconds behind; a failed query; the lock lost.
    metrics.observe_progress("ingest", [progress(1, now + timedelta(seconds=2), end={"events": {"0": 100}})])
    metrics.query_failed("ingest")
    metrics.lock_held(False)
    m = scraped(metrics)
    assert m[("lakehouse_kafka_consumer_lag_seconds", ())] == 0
    assert m[("lakehouse_stream_batch_failures_total", (("query", "ingest"),))] == 1
    assert m[("lakehouse_writer_lock_held", ())] == 0
    assert m[("lakehouse_writer_lock_losses_total", ())] == 1
    assert time.time() - now.timestamp() < 60
