"""A reset (or lost) stream checkpoint does not ingest the log again: a new checkpoint starts at
the Kafka position stamped on bronze's newest stream commit, so bronze stays unique on
(topic, partition, offset) and nothing produced meanwhile is missed."""

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from lakehouse.generator import GeneratorConfig, generate, produce
from lakehouse.kafka_admin import ensure_topic
from lakehouse.table_reads import read
from spark_jobs import stream


def positions(settings, table):
    t = read(settings, table)
    return Counter(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


@pytest.mark.slow
def test_a_new_checkpoint_resumes_at_bronze_position(instance_env, spark):
    settings = instance_env
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    first, second = (generate(GeneratorConfig(count=200, seed=s, end=end, span=timedelta(minutes=20),
                                              keys=3)).records for s in (1, 2))
    produce(settings, first)
    stream.run_available_now(spark, settings)
    before = positions(settings, "bronze_events") + positions(settings, "quarantined_events")
    assert sum(before.values()) == len(first)

    shutil.rmtree(settings.checkpoint_path(stream.INGEST_QUERY))  # the checkpoint is lost
    produce(settings, second)
    stream.run_available_now(spark, settings)

    after = positions(settings, "bronze_events") + positions(settings, "quarantined_events")
    assert max(after.values()) == 1  # no record twice
    assert sum(after.values()) == len(first) + len(second)  # and none missed
