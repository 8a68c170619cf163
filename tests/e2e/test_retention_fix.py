"""The fix printed for a topic retention shorter than the pipeline needs runs as printed (from
any folder) with the project's own Kafka tool, and raises the retention on the broker."""

import subprocess
import uuid

from confluent_kafka.admin import ConfigResource, ResourceType

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin, ensure_topic
from lakehouse.kafka.topic_status import topic_status

DAY_MS = 24 * 3600 * 1000


def retention_of(settings: Settings) -> int:
    resource = ConfigResource(ResourceType.TOPIC, settings.events_topic)
    entries = admin(settings).describe_configs([resource])[resource].result(30)
    return int(entries["retention.ms"].value)


def test_the_printed_retention_fix_runs_as_printed(kafka_bootstrap, tmp_path):
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                  "EVENTS_TOPIC": f"short-{uuid.uuid4().hex[:10]}"})
    ensure_topic(settings, partitions=1, config={"retention.ms": str(DAY_MS)})
    warning = topic_status(settings).retention_warning
    assert warning is not None
    command = warning.split("Raise it: ", 1)[1]
    assert f"--bootstrap-server {kafka_bootstrap} " in command

    done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert retention_of(settings) == 8 * DAY_MS  # the default horizon (7 days) plus a day
    assert topic_status(settings).retention_warning is None
