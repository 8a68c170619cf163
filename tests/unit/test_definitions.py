"""The Dagster code location: contract asset keys, validation, and the CLI from the repo root
(materializing against a broker: tests/e2e/test_definitions_materialize.py)."""

import os
import subprocess
from pathlib import Path

from dagster import AssetKey

from orchestration.definitions import defs

REPO = Path(__file__).resolve().parents[2]
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


def test_crons_and_thresholds_are_read_when_the_code_location_loads():
    """A fresh load (as `dagster dev` or a reload does) builds the schedules and the freshness
    check from the environment of that load."""
    code = ("from orchestration.definitions import defs\n"
            "s = {x.name: x.cron_schedule for x in defs.schedules}\n"
            "print(s['stream_catch_up_schedule'], '|', s['table_maintenance_schedule'])\n")
    env = {**os.environ, "CATCH_UP_CRON": "*/7 * * * *", "MAINTENANCE_CRON": "5 1 * * 6",
           "PARTITIONS_START": "2025-03-01", "GX_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([str(REPO / ".venv/bin/python"), "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2].strip() == "*/7 * * * * | 5 1 * * 6"
