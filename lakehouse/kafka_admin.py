"""Topic creation and offset look-ups with confluent-kafka (admin + a throwaway consumer)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lakehouse.settings import Settings

TOPIC_CONFIG = {
    # The broker stamps each record with its append time: monotonic per partition, so a replay
    # can find "everything ingested between T1 and T2" with offsets-for-times (DESIGN §3).
    "message.timestamp.type": "LogAppendTime",
    "retention.ms": str(14 * 24 * 3600 * 1000),
}


def admin(settings: Settings) -> AdminClient:
    return AdminClient({**settings.client_config, "log_level": 3})


def ensure_topic(
    settings: Settings,
    topic: str | None = None,
    partitions: int = 4,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> bool:
    """Create the topic (LogAppendTime) if missing. Returns True when it was created."""
    topic = topic or settings.events_topic
    client = admin(settings)
    if topic in client.list_topics(timeout=timeout).topics:
        return False
    futures = client.create_topics(
        [NewTopic(topic, partitions, 1, config={**TOPIC_CONFIG, **(config or {})})]
    )
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
        return False
    _wait_for_leaders(client, topic, timeout)
    return True


def _wait_for_leaders(client: AdminClient, topic: str, timeout: float) -> None:
    """A new topic answers offset requests only once every partition has a leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta and meta.error is None and meta.partitions and all(
            p.leader >= 0 and p.error is None for p in meta.partitions.values()
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic!r} has partitions without a leader after {timeout}s")


# A fresh topic (or broker) reports these until leadership settles.
_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
}


def _retrying(call, attempts: int = 20, pause: float = 0.25):
    """Retry broker calls that fail with a retriable error (e.g. a leader election)."""
    for attempt in range(attempts):
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            transient = getattr(err, "retriable", lambda: False)() or (
                getattr(err, "code", lambda: None)() in _TRANSIENT
            )
            if attempt == attempts - 1 or not transient:
                raise
            time.sleep(pause)


@dataclass(frozen=True)
class PartitionOffsets:
    partition: int
    earliest: int
    latest: int


def _consumer(settings: Settings) -> Consumer:
    return Consumer(
        {
            **settings.client_config,
            "group.id": "lakehouse-offset-probe",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )


def topic_offsets(settings: Settings, topic: str | None = None, timeout: float = 10.0):
    """Earliest and latest offsets per partition (empty list when the topic is missing)."""
    topic = topic or settings.events_topic
    consumer = _consumer(settings)
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        result = []
        for p in sorted(meta.partitions):
            lo, hi = _retrying(lambda p=p: consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout))
            result.append(PartitionOffsets(p, lo, hi))
        return result
    finally:
        consumer.close()


def offsets_for_time(
    settings: Settings, ts_ms: int, topic: str | None = None, timeout: float = 10.0,
    known: list[PartitionOffsets] | None = None,
) -> dict[int, int]:
    """First offset per partition whose (append) timestamp >= ts_ms; the end offset when none.
    `known`: the topic's offsets if the caller just read them (saves a broker round trip)."""
    topic = topic or settings.events_topic
    offsets = known if known is not None else topic_offsets(settings, topic, timeout)
    if not offsets:
        return {}
    ends = {p.partition: p.latest for p in offsets}
    consumer = _consumer(settings)
    try:
        found = _retrying(lambda: consumer.offsets_for_times(
            [TopicPartition(topic, p, ts_ms) for p in ends], timeout=timeout
        ))
        return {tp.partition: (tp.offset if tp.offset >= 0 else ends[tp.partition]) for tp in found}
    finally:
        consumer.close()
