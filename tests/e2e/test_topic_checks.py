"""A topic with producer (CreateTime) timestamps is refused before anything reads it."""

import uuid

import pytest
from confluent_kafka.admin import NewTopic

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin, ensure_topic
from lakehouse.kafka.topic_checks import TopicMisconfigured, require_log_append_time


def test_a_create_time_topic_is_refused_and_a_log_append_time_one_accepted(kafka_bootstrap):
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    theirs = f"createtime-{uuid.uuid4().hex[:8]}"
    futures = admin(settings).create_topics(
        [NewTopic(theirs, 2, 1, config={"message.timestamp.type": "CreateTime"})])
    futures[theirs].result(30)
    with pytest.raises(TopicMisconfigured, match="message.timestamp.type=CreateTime"):
        ensure_topic(settings, theirs)  # exists: checked, not silently used
    with pytest.raises(TopicMisconfigured, match="LogAppendTime"):
        require_log_append_time(settings, theirs)

    ours = f"logappend-{uuid.uuid4().hex[:8]}"
    assert ensure_topic(settings, ours) is True
    assert ensure_topic(settings, ours) is False  # exists and is fine
    require_log_append_time(settings, ours)
