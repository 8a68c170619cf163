"""Prometheus metrics of `make stream` (`orchestration.service.metrics`) end to end: the service as a
subprocess on a fresh topic and lakehouse, scraped over HTTP while it ingests good, bad and
late records (from hand-made reports, no Spark: tests/unit/test_metrics.py). While it streams,
the catch-up schedule and catch-ups by hand beside it skip naming it (tests/e2e/beside_service.py);
then a clean SIGTERM stop."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from conftest import free_port
from test_metrics import by_label, iso, scrape, value

from lakehouse.tables.reads import read
from testkit.generator import Record, produce


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
def test_service_serves_metrics(instance_env, spark, tmp_path):
    from beside_service import (
        a_catch_up_by_hand_succeeds_as_a_no_op_naming_the_service,
        dagster_asset_materialize_succeeds_while_the_service_streams,
        ten_catch_up_ticks_skip_naming_the_service,
    )

    from testkit.faults import start_service, wait_for

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
        # histogram's sum grows by it) lies in the bracket the probe saw.
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
            reads: list[tuple[float, float]] = []  # (start, end) of each read of the table

            def visible(p=probe, reads=reads) -> bool:
                start = time.time()
                found = p in read(settings, "streaming_aggregates")["key"].to_pylist()
                reads.append((start, time.time()))
                return found

            wait_for(visible, svc, what=f"{probe} visible in streaming_aggregates", interval=0.05)
            # Its commit came after the last read that missed it began and before the read
            # that found it ended: the probe's bracket, however slow the reads were.
            earliest = (reads[-2][0] if len(reads) > 1 else sent) - sent
            latest = reads[-1][1] - sent
            until(lambda m, c=count: value(m, LATENCY + "_count") == c + 1,
                  f"the latency sample of {probe}'s batch")
            m = state["m"]
            sample = value(m, LATENCY + "_sum") - total
            assert earliest - 1 <= sample <= latest + 0.5, (probe, sample, earliest, latest)
        del producer  # its connections closed before the broker stops
        assert value(m, "lakehouse_metrics_poll_errors_total", source="streaming_aggregates") == 0
        assert value(m, "lakehouse_metrics_poll_errors_total", source="kafka") == 0
        assert value(m, "lakehouse_metrics_poll_errors_total", source="quarantined_events") == 0

        # Beside the service holding the stream: the schedule and catch-ups by hand skip.
        ten_catch_up_ticks_skip_naming_the_service(settings, svc)
        a_catch_up_by_hand_succeeds_as_a_no_op_naming_the_service(svc)
        dagster_asset_materialize_succeeds_while_the_service_streams(svc, tmp_path)
        assert svc.poll() is None, "the service stopped beside the catch-ups"
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

    # A restart with nothing new to read: the metrics a service starts from before its first
    # batch, built as the service builds them (`serving` seeded from the checkpoints, then
    # `exposing`), here in the test's process on the stopped service's lakehouse (a second
    # service start costs a JVM for the same code): the last success time and the position
    # from the checkpoint, the watermark from bronze's log, the counters from 0.
    from orchestration.service.metrics import exposing, serving

    port = free_port()
    watermark = (newest - timedelta(seconds=30)).timestamp()  # the last probe's time - delay
    with serving(settings, spark, serve=False) as metrics, exposing([metrics], port):
        deadline = time.monotonic() + 60
        while True:
            m = scrape(port)
            if (value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
                    and by_label(m, "lakehouse_kafka_consumer_lag_records", "partition")
                    and value(m, "lakehouse_stream_watermark_timestamp_seconds") == watermark):
                break
            assert time.monotonic() < deadline, f"metrics after the restart: {m}"
            time.sleep(0.5)
    last = value(m, "lakehouse_stream_last_success_timestamp_seconds", query="ingest")
    assert first_success <= last <= stopped_at
    assert by_label(m, "lakehouse_kafka_consumer_lag_records", "partition") == {
        "0": 0, "1": 0, "2": 0, "3": 0}
    assert value(before, "lakehouse_stream_watermark_timestamp_seconds") <= watermark
    assert value(m, "lakehouse_late_events_total") == 0
    assert value(m, "lakehouse_stream_batch_duration_seconds_count", query="ingest") == 0
