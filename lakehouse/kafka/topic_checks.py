"""What the pipeline requires of a topic it did not create, checked before reading it.

The replay finds "everything the broker appended between T1 and T2" with offsets-for-times,
which is exact only when record timestamps are the broker's append time (monotonic per
partition). With `message.timestamp.type=CreateTime` a record's timestamp is whatever its
producer said: a replay range could miss records or take another date's, and the proof would
compare the wrong sets. So such a topic is refused, loudly, before anything reads it.
"""

from __future__ import annotations

from datetime import timedelta

from confluent_kafka.admin import ConfigResource, ResourceType

from lakehouse.config.settings import Settings

REQUIRED_TIMESTAMP_TYPE = "LogAppendTime"
DEFAULT_RETENTION = timedelta(days=14)


def required_retention(settings: Settings) -> timedelta:
    """How long the topic must keep records: the correction horizon plus a day. A date's first
    records are appended at its start; its last correction, proven against a replay of the log,
    runs up to the horizon after its end."""
    return settings.correction_horizon + timedelta(days=1)


def created_retention(settings: Settings) -> timedelta:
    """The retention of a topic the pipeline creates: 14 days, or twice the correction horizon
    when that is longer (always above `required_retention`)."""
    return max(DEFAULT_RETENTION, 2 * settings.correction_horizon)


def retention_shortfall(settings: Settings, retention_ms: int | None) -> str | None:
    """What a topic retention shorter than `required_retention` costs and how to raise it;
    None when it suffices, is unlimited (-1) or unknown."""
    need = required_retention(settings)
    need_ms = int(need.total_seconds() * 1000)
    if retention_ms is None or retention_ms < 0 or retention_ms >= need_ms:
        return None
    horizon = ("CORRECTION_HORIZON" if settings.pipeline == "default"
               else f"window.correction_horizon of pipeline {settings.pipeline!r}")
    topic = settings.events_topic
    return (f"topic {topic!r} keeps records for retention.ms={retention_ms} "
            f"({timedelta(milliseconds=retention_ms)}), less than the correction horizon "
            f"({horizon}: {settings.correction_horizon}) plus a day: retention deletes a date's "
            "first records before its last correction, whose replay then cannot prove the date "
            "(verify_dates fails naming the lost offsets). Raise it: kafka-configs --alter "
            f"--entity-type topics --entity-name {topic} --add-config retention.ms={need_ms}")


class TopicMisconfigured(RuntimeError):
    """A topic's configuration breaks an assumption the pipeline's exactness rests on."""


def require_log_append_time(settings: Settings, topic: str | None = None,
                            timeout: float = 30.0) -> None:
    from lakehouse.kafka.admin import admin

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
