"""Offsets through the AdminClient's `list_offsets` (earliest, latest, for a timestamp) agree
with what a consumer sees (`get_watermark_offsets`, `offsets_for_times`) on a real broker."""

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import ensure_topic, offsets_for_time, topic_offsets


def test_offsets_match_a_consumers_view(kafka_bootstrap):
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                  "EVENTS_TOPIC": f"offsets-{uuid.uuid4().hex[:10]}"})
    topic = settings.events_topic
    assert topic_offsets(settings) == []  # missing topic
    assert offsets_for_time(settings, 0) == {}
    assert ensure_topic(settings, partitions=3)
    assert [(p.partition, p.earliest, p.latest) for p in topic_offsets(settings)] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert offsets_for_time(settings, 0) == {0: 0, 1: 0, 2: 0}

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic, value=b"a", partition=i % 2)  # partitions 0 and 1; 2 stays empty
    producer.flush(30)
    # LogAppendTime (the broker's clock, this machine's): the first batch appended before
    # `middle`, the second after it.
    tick()
    middle = tick()
    tick()
    for _ in range(4):
        producer.produce(topic, value=b"b", partition=0)
    producer.flush(30)

    offsets = topic_offsets(settings)
    assert [(p.partition, p.earliest, p.latest) for p in offsets] == [(0, 0, 7), (1, 0, 2),
                                                                      (2, 0, 0)]
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "offsets-test"})
    try:
        for p in offsets:
            assert consumer.get_watermark_offsets(TopicPartition(topic, p.partition), 10) == (
                p.earliest, p.latest)
        by_consumer = {tp.partition: tp.offset for tp in consumer.offsets_for_times(
            [TopicPartition(topic, p, middle) for p in range(3)], 10)}
    finally:
        consumer.close()
    ends = {p.partition: p.latest for p in offsets}
    at_middle = offsets_for_time(settings, middle)
    assert at_middle == {0: 3, 1: 2, 2: 0}  # no record at/after `middle`: the end offset
    assert at_middle == {p: (o if o >= 0 else ends[p]) for p, o in by_consumer.items()}
    assert offsets_for_time(settings, middle, known=offsets) == at_middle
    assert offsets_for_time(settings, 0, known=offsets) == {0: 0, 1: 0, 2: 0}
    assert offsets_for_time(settings, middle + 3_600_000) == ends


def test_topic_config_is_read_through_the_shared_admin_client(kafka_bootstrap):
    """`retention_ms` calls `admin(settings).describe_configs(...)`: with a throwaway client the
    future failed (`_DESTROY`) and the status showed no retention."""
    from lakehouse.kafka.topic_status import retention_ms

    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                  "EVENTS_TOPIC": f"offsets-{uuid.uuid4().hex[:10]}"})
    ensure_topic(settings, partitions=1)
    assert retention_ms(settings) == 14 * 24 * 3600 * 1000


def test_a_topics_retention_is_checked_against_the_correction_horizon(kafka_bootstrap):
    """The pipeline needs records kept for the correction horizon plus a day: a topic it
    creates keeps them 14 days or twice a longer horizon; a shorter retention is said in the
    topic's status and the topic asset's metadata (and by `make stream` at start)."""
    from types import SimpleNamespace

    from assets.observe.topic import topic_metadata
    from lakehouse.kafka.topic_checks import retention_shortfall
    from lakehouse.kafka.topic_status import retention_ms, topic_status

    day = 24 * 3600 * 1000

    def settings_of(**env):
        return Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                  "EVENTS_TOPIC": f"retention-{uuid.uuid4().hex[:10]}", **env})

    long = settings_of(CORRECTION_HORIZON="10 days")
    ensure_topic(long, partitions=1)
    assert retention_ms(long) == 20 * day
    assert topic_status(long).retention_warning is None

    short = settings_of()  # the default horizon, 7 days, on a topic kept one day
    ensure_topic(short, partitions=1, config={"retention.ms": str(day)})
    status = topic_status(short)
    assert status.retention_ms == day
    assert status.retention_warning == retention_shortfall(short, day)
    assert status.retention_warning.startswith(
        f"topic {short.events_topic!r} keeps records for retention.ms={day} (1 day, 0:00:00), "
        "less than the correction horizon (CORRECTION_HORIZON: 7 days, 0:00:00) plus a day")
    assert status.retention_warning.endswith(
        f"--entity-name {short.events_topic} --add-config retention.ms={8 * day}")
    metadata = topic_metadata(SimpleNamespace(status=lambda _pipeline: status))
    assert metadata["retention_covers_horizon"] is False
    assert metadata["retention_warning"] == status.retention_warning

    assert retention_shortfall(short, 8 * day) is None  # the horizon plus a day suffices
    assert retention_shortfall(short, 8 * day - 1) is not None
    assert retention_shortfall(short, -1) is None  # unlimited
    spec = short.model_copy(update={"pipeline": "orders"})
    assert "(window.correction_horizon of pipeline 'orders': 7 days" in retention_shortfall(spec, day)


def tick() -> int:
    """The wall clock's next millisecond, once it has come."""
    start = int(time.time() * 1000)
    while (now := int(time.time() * 1000)) <= start:
        pass
    return now
