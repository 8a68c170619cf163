"""The raw limit of reading a topic on this machine, no parsing, no writes: a confluent-kafka
consumer in Python and Kafka's own ConsumerPerformance (`kafka-consumer-perf-test`, from the
broker's jars). Everything the pipeline does costs on top of this."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer

from lakehouse.config.settings import Settings

KAFKA_JARS = Path(__file__).resolve().parent.parent / ".jars" / "kafka"


def confluent_records_per_s(settings: Settings, count: int) -> float:
    """Consume `count` records from the start of the topic in batches; records/s from the first
    record received (group join and the first fetch excluded, as ConsumerPerformance's
    fetch rate does)."""
    consumer = Consumer({**settings.client_config, "group.id": f"bench-raw-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([settings.events_topic])
    seen, started = 0, None
    try:
        deadline = time.monotonic() + 300
        while seen < count and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            if batch and started is None:
                started = time.perf_counter()
            seen += sum(1 for m in batch if m.error() is None)
    finally:
        consumer.close()
    if seen < count or started is None:
        raise RuntimeError(f"confluent consumer read {seen} of {count} records in 300 s")
    return count / (time.perf_counter() - started)


def kafka_perf_test(settings: Settings, count: int) -> dict[str, float]:
    """ConsumerPerformance over `count` records: records/s overall and while fetching."""
    out = subprocess.run(
        ["java", "-Xmx512m", "-cp", f"{KAFKA_JARS}/*", "org.apache.kafka.tools.ConsumerPerformance",
         "--bootstrap-server", settings.kafka_bootstrap_servers, "--topic", settings.events_topic,
         "--messages", str(count), "--timeout", "60000"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    lines = [line for line in out.splitlines() if "," in line]
    header = [h.strip() for h in lines[0].split(",")]
    row = dict(zip(header, (v.strip() for v in lines[-1].split(",")), strict=True))
    return {"records_per_s": float(row["nMsg.sec"]),
            "fetch_records_per_s": float(row["fetch.nMsg.sec"])}
