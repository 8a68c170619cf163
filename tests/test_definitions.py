"""The Dagster code location: contract asset keys, validation, and the CLI from the repo root."""

import os
import subprocess
from pathlib import Path

from dagster import AssetKey

from orchestration.definitions import defs

REPO = Path(__file__).resolve().parents[1]
DAGSTER = str(REPO / ".venv/bin/dagster")
CONTRACT = ("raw_events", "bronze_events", "streaming_aggregates", "late_corrections",
            "reconciled_aggregates", "replay_aggregates")


def test_contract_asset_keys_and_daily_partitions():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(CONTRACT) <= keys
    for name in ("late_corrections", "reconciled_aggregates", "replay_aggregates"):
        pdef = graph.get(AssetKey(name)).partitions_def
        assert pdef is not None and pdef.get_partition_keys()[0] == "2025-01-01"
    checks = {k.name for k in graph.asset_check_keys}
    assert "reconciled_equals_replay" in checks


def test_definitions_validate_cli():
    done = subprocess.run([DAGSTER, "definitions", "validate", "-m", "orchestration.definitions"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Validation successful" in done.stderr + done.stdout


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
