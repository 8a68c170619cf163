"""The Dagster code location against a broker: `dagster asset materialize` from the repo root
and the topic asset through `dg.materialize` (the code location's load, validation and CLI
without one: tests/unit/test_definitions.py)."""

import os
import subprocess

from conftest import REPO

DAGSTER = str(REPO / ".venv/bin/dagster")


def test_asset_materialize_cli_from_repo_root(instance_env, tmp_path):
    """`dagster asset materialize -m orchestration.definitions --select raw_events` creates the
    topic (LogAppendTime) and records its offsets."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    done = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions",
         "--select", "raw_events"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(instance_env.client_config)
    assert instance_env.events_topic in admin.list_topics(timeout=10).topics
    res = ConfigResource(ConfigResource.Type.TOPIC, instance_env.events_topic)
    config = admin.describe_configs([res])[res].result(10)
    assert config["message.timestamp.type"].value == "LogAppendTime"


def test_raw_events_through_dg_materialize(instance_env):
    """The topic asset, materialized with its typed resources: creates the topic with the
    settings' partitions and reports its offsets (a second run finds it)."""
    import dagster as dg

    from assets.ingest import ingest_assets
    from assets.pipelines import DEFAULT
    from assets.resources import KafkaResource, LakehouseResource

    raw_events = ingest_assets(DEFAULT)[0]

    kafka = KafkaResource(lakehouse=LakehouseResource(events_topic=instance_env.events_topic))
    first = dg.materialize([raw_events], resources={"kafka": kafka})
    assert first.success
    meta = first.asset_materializations_for_node("raw_events")[0].metadata
    assert meta["created"].value is True and meta["topic"].value == instance_env.events_topic
    assert meta["partitions"].value == instance_env.topic_partitions
    again = dg.materialize([raw_events], resources={"kafka": kafka})
    assert again.asset_materializations_for_node("raw_events")[0].metadata["created"].value is False
