"""What the topic looks like to the pipeline, without Spark: offsets per partition from the
broker, the stream's processed offsets from bronze's newest stream commit (Spark's Kafka source
commits no consumer-group offsets; each batch stamps its end offsets there), the lag between
them, the recent append rate and the retention. Cheap enough for a sensor that ticks every minute."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin, consumer_lag, offsets_for_time, topic_offsets
from lakehouse.kafka.topic_checks import retention_shortfall
from lakehouse.tables.commit_tags import newest_stream_commit

RATE_WINDOW = timedelta(minutes=1)


@dataclass
class TopicStatus:
    topic: str
    partitions: list[dict] = field(default_factory=list)  # partition, earliest, latest, processed, lag
    retention_ms: int | None = None
    # Set when the retention is shorter than the pipeline needs (`topic_checks.retention_shortfall`).
    retention_warning: str | None = None
    records_per_second: float = 0.0
    last_batch_at: datetime | None = None

    @property
    def lag(self) -> int:
        return sum(p["lag"] for p in self.partitions)

    @property
    def retained(self) -> int:
        return sum(p["latest"] - p["earliest"] for p in self.partitions)


def processed_offsets(settings: Settings) -> tuple[dict[int, int], datetime | None]:
    """End offsets of the stream's newest batch and when it committed (empty before the first):
    the position stamped on bronze's newest stream commit, the committed state a restart
    resumes from, current to the batch. (The service writes `stream_progress` rows at most
    every 30 s: a lag read from them ran up to 30 s of the rate high.)"""
    commit = newest_stream_commit(settings)
    if commit is None:
        return {}, None
    return dict(commit.end_offsets), commit.committed_at


def retention_ms(settings: Settings) -> int | None:
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic)
    try:
        configs = admin(settings).describe_configs([resource])[resource].result(10)
    except Exception:  # noqa: BLE001 - status is best effort; offsets below are not
        return None
    value = configs.get("retention.ms")
    return int(value.value) if value is not None and value.value is not None else None


def topic_status(settings: Settings, now: datetime | None = None) -> TopicStatus:
    now = now or datetime.now(UTC)
    status = TopicStatus(settings.events_topic)
    offsets = topic_offsets(settings)
    if not offsets:
        return status
    processed, status.last_batch_at = processed_offsets(settings)
    lag = consumer_lag(offsets, processed)
    for p in offsets:
        status.partitions.append({
            "partition": p.partition, "earliest": p.earliest, "latest": p.latest,
            "processed": processed.get(p.partition), "lag": lag[p.partition],
        })
    since = offsets_for_time(settings, int((now - RATE_WINDOW).timestamp() * 1000), known=offsets)
    appended = sum(p.latest - since.get(p.partition, p.latest) for p in offsets)
    status.records_per_second = round(appended / RATE_WINDOW.total_seconds(), 2)
    status.retention_ms = retention_ms(settings)
    status.retention_warning = retention_shortfall(settings, status.retention_ms)
    return status
