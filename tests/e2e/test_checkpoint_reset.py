"""A reset (or lost) stream checkpoint does not ingest the log again: a new checkpoint starts at
the Kafka position stamped on bronze's newest stream commit, so bronze stays unique on
(topic, partition, offset) and nothing produced meanwhile is missed."""

import re
import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from lakehouse.kafka.admin import ensure_topic
from lakehouse.tables.reads import read
from spark_jobs import stream
from testkit.faults import BRONZE_CRASH, failing_bronze_append
from testkit.generator import GeneratorConfig, generate, produce


def positions(settings, table):
    t = read(settings, table)
    return Counter(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


def ingested_then_more(settings, spark):
    """Two chunks of 200 records on the instance's topic; the first one ingested."""
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    first, second = (generate(GeneratorConfig(count=200, seed=s, end=end, span=timedelta(minutes=20),
                                              keys=3)).records for s in (1, 2))
    produce(settings, first)
    stream.run_available_now(spark, settings)
    return first, second


@pytest.mark.slow
def test_a_batch_that_crashed_before_bronze_lands_once_after_a_checkpoint_reset(
        instance_env, spark):
    """The batch's quarantine and late appends committed, then it died before its bronze commit
    (the batch's last append); the checkpoint is then lost. The new checkpoint starts at bronze's
    position and reads the batch again: its quarantined and late records land once, not twice."""
    settings = instance_env
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    first, second = (generate(GeneratorConfig(
        count=300, seed=s, end=end + timedelta(minutes=s), span=timedelta(minutes=20), keys=3,
        late_fraction=0.1, malformed_fraction=0.1)).records for s in (1, 2))
    produce(settings, first)
    stream.run_available_now(spark, settings)
    quarantined_before = sum(positions(settings, "quarantined_events").values())

    produce(settings, second)
    with failing_bronze_append(), pytest.raises(Exception, match=BRONZE_CRASH):
        stream.run_available_now(spark, settings)
    # The crashed batch's quarantine rows did commit.
    assert sum(positions(settings, "quarantined_events").values()) > quarantined_before

    shutil.rmtree(settings.checkpoint_path(stream.INGEST_QUERY))  # and the checkpoint is lost
    stream.run_available_now(spark, settings)

    everything = positions(settings, "bronze_events") + positions(settings, "quarantined_events")
    assert max(everything.values()) == 1
    assert sum(everything.values()) == len(first) + len(second)
    late = positions(settings, "late_events")
    assert late and max(late.values()) == 1


def counted_on_time(settings) -> int:
    """What the fast path must count: each event id once among bronze's rows that were not late
    (the late lane holds the others, by log position)."""
    bronze = read(settings, "bronze_events").to_pylist()
    late = set(positions(settings, "late_events"))
    return len({r["event_id"] for r in bronze if (r["partition"], r["offset"]) not in late})


@pytest.mark.slow
def test_a_batch_that_crashed_before_its_aggregates_is_counted_after_a_checkpoint_reset(
        instance_env, spark, monkeypatch):
    """The batch's bronze commit landed, then it died before its aggregates commit; the checkpoint
    is then lost. The new checkpoint starts after that batch's offsets, so it must add the
    batch's windows from bronze first, or the fast path misses them for good."""
    settings = instance_env
    first, second = ingested_then_more(settings, spark)
    produce(settings, second)

    def killed(*args, **kwargs):
        raise RuntimeError("killed before the aggregates commit")

    real_publish = stream.publish_windows
    monkeypatch.setattr(stream, "publish_windows", killed)
    with pytest.raises(Exception, match="killed before the aggregates commit"):
        stream.run_available_now(spark, settings)
    monkeypatch.setattr(stream, "publish_windows", real_publish)
    streaming = read(settings, "streaming_aggregates")
    assert sum(streaming["event_count"].to_pylist()) < counted_on_time(settings)

    shutil.rmtree(settings.checkpoint_path(stream.INGEST_QUERY))  # and the checkpoint is lost
    stream.run_available_now(spark, settings)
    stream.run_available_now(spark, settings)  # a second start adds nothing again

    everything = positions(settings, "bronze_events") + positions(settings, "quarantined_events")
    assert max(everything.values()) == 1
    assert sum(everything.values()) == len(first) + len(second)
    streaming = read(settings, "streaming_aggregates")
    assert sum(streaming["event_count"].to_pylist()) == counted_on_time(settings)


@pytest.mark.slow
def test_a_deleted_and_recreated_topic_is_refused_naming_the_topic_id(instance_env, spark):
    """Offsets of a re-created topic start at 0 again: once it is refilled past the old offsets,
    resuming at bronze's position would skip its early records silently. The stream refuses."""
    import time

    from lakehouse.kafka.admin import admin, topic_id

    settings = instance_env
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=100, seed=1, end=end, span=timedelta(minutes=10),
                                       keys=3)).records
    produce(settings, records)
    stream.run_available_now(spark, settings)
    old_id = topic_id(settings)

    admin(settings).delete_topics([settings.events_topic])[settings.events_topic].result(30)
    deadline = time.monotonic() + 60
    while topic_id(settings) is not None:  # deletion is asynchronous on the broker
        assert time.monotonic() < deadline, "topic not deleted"
        time.sleep(0.2)
    while True:  # re-created as soon as the broker has forgotten the old one
        try:
            ensure_topic(settings)
            break
        except Exception:  # noqa: BLE001 - "marked for deletion" for a moment
            assert time.monotonic() < deadline, "topic not re-created"
            time.sleep(0.2)
    produce(settings, records + records)  # past the old offsets
    new_id = topic_id(settings)
    assert new_id != old_id
    before = read(settings, "bronze_events").num_rows
    with pytest.raises(stream.TopicReplaced,
                       match=f"id is now {re.escape(new_id)}.*topic id {re.escape(old_id)}"):
        stream.run_available_now(spark, settings)
    assert read(settings, "bronze_events").num_rows == before


@pytest.mark.slow
def test_records_retention_deleted_before_the_stream_read_them(instance_env, spark, monkeypatch):
    """Retention passes the stream's position while it is behind. By default the stream refuses
    to start and names the ranges; with ON_DATA_LOSS=skip_and_record it records them in
    skipped_offsets and goes on from the earliest retained offsets, every retained record once."""
    from confluent_kafka import TopicPartition

    from lakehouse.kafka.admin import admin, topic_offsets

    settings = instance_env
    first, second = ingested_then_more(settings, spark)
    produce(settings, second)
    # Retention deletes the first half of what the stream has not read yet, in every partition.
    offsets = topic_offsets(settings)
    bronze_ends = {p: o for p, o in stream.start_positions(settings).items() if o is not None}
    cut = {o.partition: bronze_ends[o.partition] + (o.latest - bronze_ends[o.partition]) // 2
           for o in offsets}
    futures = admin(settings).delete_records(
        [TopicPartition(settings.events_topic, p, o) for p, o in cut.items()])
    for f in futures.values():
        f.result(30)
    lost = sum(cut[p] - bronze_ends[p] for p in cut)
    assert lost > 0

    with pytest.raises(stream.DataLost, match="ON_DATA_LOSS=skip_and_record") as refused:
        stream.run_available_now(spark, settings)
    assert f"offsets {bronze_ends[0]}-{cut[0] - 1}" in str(refused.value)

    monkeypatch.setenv("ON_DATA_LOSS", "skip_and_record")
    from lakehouse.config.settings import Settings

    skipping = Settings.from_env()
    stream.run_available_now(spark, skipping)
    stream.run_available_now(spark, skipping)  # a second start records nothing again
    skipped = read(skipping, "skipped_offsets").to_pylist()
    assert {(r["partition"], r["from_offset"], r["to_offset"]) for r in skipped} == {
        (p, bronze_ends[p], cut[p]) for p in cut if cut[p] > bronze_ends[p]}
    assert sum(r["records"] for r in skipped) == lost
    everything = positions(skipping, "bronze_events") + positions(skipping, "quarantined_events")
    assert max(everything.values()) == 1
    assert sum(everything.values()) == len(first) + len(second) - lost
