"""What the pipeline requires of a topic it did not create, checked before reading it.

The replay finds "everything the broker appended between T1 and T2" with offsets-for-times,
which is exact only when record timestamps are the broker's append time (monotonic per
partition). With `message.timestamp.type=CreateTime` a record's timestamp is whatever its
producer said: a replay range could miss records or take another date's, and the proof would
compare the wrong sets. So such a topic is refused, loudly, before anything reads it.
"""

from __future__ import annotations

import shlex
from datetime import timedelta
from pathlib import Path

from confluent_kafka.admin import ConfigResource, ResourceType

from lakehouse.config.settings import Settings

REQUIRED_TIMESTAMP_TYPE = "LogAppendTime"
DEFAULT_RETENTION = timedelta(days=14)
# Kafka's kafka-configs tool as the project installs it (a wrapper running the jars of `make
# setup`); outside a checkout, a Kafka distribution's script.
KAFKA_CONFIGS = Path(__file__).resolve().parents[2] / "infra" / "kafka" / "bin" / "kafka-configs"


def alter_topic_command(settings: Settings, topic: str, config: str) -> str:
    """The shell command that sets `config` (`name=value`) on `topic` of the configured brokers,
    runnable as printed. With security options set (KAFKA_SECURITY_*/SASL_*/SSL_*), it says
    that the tool needs them in a client properties file too (it reads none from the
    environment)."""
    tool = str(KAFKA_CONFIGS) if KAFKA_CONFIGS.exists() else "kafka-configs.sh"
    command = " ".join(shlex.quote(part) for part in (
        tool, "--bootstrap-server", settings.kafka_bootstrap_servers, "--alter",
        "--entity-type", "topics", "--entity-name", topic, "--add-config", config))
    secured = sorted(k for k in settings.kafka_options
                     if k.startswith(("security.", "sasl.", "ssl.")))
    if secured:
        return (f"(the brokers need {', '.join(secured)}: write them to a client properties "
                f"file and add --command-config <file>) {command}")
    return command


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
            "(verify_dates fails naming the lost offsets). Raise it: "
            + alter_topic_command(settings, topic, f"retention.ms={need_ms}"))


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
            "this one (records appended before the change keep their producer timestamps, so "
            "start LAKEHOUSE_START_DATE after it): "
            + alter_topic_command(settings, topic,
                                  f"message.timestamp.type={REQUIRED_TIMESTAMP_TYPE}")
        )
