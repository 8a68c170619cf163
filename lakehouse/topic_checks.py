"""What the pipeline requires of a topic it did not create, checked before reading it.

The replay finds "everything the broker appended between T1 and T2" with offsets-for-times,
which is exact only when record timestamps are the broker's append time (monotonic per
partition). With `message.timestamp.type=CreateTime` a record's timestamp is whatever its
producer said: a replay range could miss records or take another date's, and the proof would
compare the wrong sets. So such a topic is refused, loudly, before anything reads it.
"""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource, ResourceType

from lakehouse.settings import Settings

REQUIRED_TIMESTAMP_TYPE = "LogAppendTime"


class TopicMisconfigured(RuntimeError):
    """A topic's configuration breaks an assumption the pipeline's exactness rests on."""


def require_log_append_time(settings: Settings, topic: str | None = None,
                            timeout: float = 30.0) -> None:
    from lakehouse.kafka_admin import admin

    topic = topic or settings.events_topic
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin(settings).describe_configs([resource])[resource].result(timeout)
    entry = entries.get("message.timestamp.type")
    kind = entry.value if entry is not None else None
    if kind != REQUIRED_TIMESTAMP_TYPE:
        raise TopicMisconfigured(
            f"topic {topic!r} has message.timestamp.type={kind}; the pipeline needs "
            f"{REQUIRED_TIMESTAMP_TYPE}: the replay selects a date's records by broker append "
            "time, which CreateTime (the producer's clock) does not give, so a proof on this "
            "topic could pass on the wrong records. Use a topic the pipeline creates, or alter "
            f"this one (kafka-configs --alter --entity-type topics --entity-name {topic} "
            f"--add-config message.timestamp.type={REQUIRED_TIMESTAMP_TYPE}; records appended "
            "before the change keep their producer timestamps, so start LAKEHOUSE_START_DATE "
            "after it)."
        )
