"""The Dagster webserver's GraphQL API over the code location in workspace.yaml: asset keys,
daily partitions, jobs, schedules, sensors, and the metadata of a materialization made here."""

import json
import os
import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import free_port

from testkit.webserver import gql, start, stop, wait_ready

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv/bin"
CONTRACT = ("raw_events", "bronze_events", "streaming_aggregates", "late_corrections",
            "reconciled_aggregates", "replay_aggregates")
DAILY = ("late_corrections", "reconciled_aggregates", "replay_aggregates")
JOBS = {"stream_catch_up", "reconcile_dates", "correct_dates", "reprocess_dates", "verify_dates"}
SCHEDULES = {"stream_catch_up_schedule", "corrections_schedule", "verification_schedule"}
SENSORS = {"late_data_sensor", "topic_observation_sensor", "freshness_checks_sensor"}


@pytest.fixture(scope="module")
def webserver_env(tmp_path_factory, kafka_bootstrap) -> dict:
    home = tmp_path_factory.mktemp("dagster_home")
    shutil.copy(REPO / "infra/dagster.yaml", home / "dagster.yaml")
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LAKEHOUSE_ROOT": str(tmp_path_factory.mktemp("lakehouse")),
        "EVENTS_TOPIC": f"webserver-{uuid.uuid4().hex[:10]}",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DAGSTER_DISABLE_TELEMETRY": "true",
        "GX_ANALYTICS_ENABLED": "false",
    }


@pytest.fixture(scope="module")
def server(webserver_env):
    """(base url, run id of the raw_events materialization). The materialization runs while the
    webserver loads the code location; both share the instance, initialized first so that the
    two processes never race to create its SQLite storage."""
    from dagster import DagsterInstance

    DagsterInstance.from_config(webserver_env["DAGSTER_HOME"]).dispose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(webserver_env["DAGSTER_HOME"]) / "webserver.log"
    proc = start(webserver_env, port, log)
    try:
        done = subprocess.run(
            [str(BIN / "dagster"), "asset", "materialize", "-m", "orchestration.definitions",
             "--select", "raw_events"], cwd=REPO, env=webserver_env, capture_output=True, text=True,
            timeout=180)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        run_ids = re.findall(r" - ([0-9a-f-]{36}) - .*RUN_SUCCESS", output)
        assert len(run_ids) == 1, output[-3000:]

        wait_ready(proc, url, log)
        yield url, run_ids[0]
    finally:
        stop(proc)


def repository(url: str) -> dict:
    data = gql(url, """{ repositoriesOrError { __typename
        ... on RepositoryConnection { nodes { name jobs { name } schedules { name } sensors { name } } }
        ... on PythonError { message } } }""")["repositoriesOrError"]
    assert data["__typename"] == "RepositoryConnection", data
    assert len(data["nodes"]) == 1, data
    return data["nodes"][0]


def test_code_location_loaded(server):
    url, _ = server
    entries = gql(url, """{ workspaceOrError { __typename ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }""")[
        "workspaceOrError"]["locationEntries"]
    assert [(e["name"], e["loadStatus"], e["locationOrLoadError"]["__typename"]) for e in entries] == [
        ("orchestration.definitions", "LOADED", "RepositoryLocation")], entries


def test_contract_asset_keys(server):
    url, _ = server
    nodes = gql(url, "{ assetNodes { assetKey { path } } }")["assetNodes"]
    keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
    assert set(CONTRACT) <= keys, sorted(set(CONTRACT) - keys)


@pytest.mark.parametrize("asset", DAILY)
def test_daily_partitions_include_today(server, asset):
    url, _ = server
    today = datetime.now(UTC).date().isoformat()  # before the query: keys only grow across midnight
    node = gql(url, """query ($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) {
        __typename ... on AssetNode { isPartitioned partitionKeys
        partitionDefinition { type description } } } }""", {"path": [asset]})["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    assert node["isPartitioned"]
    assert node["partitionDefinition"]["type"] == "TIME_WINDOW"
    assert node["partitionDefinition"]["description"].startswith("Daily"), node["partitionDefinition"]
    keys = node["partitionKeys"]
    assert keys[0] == "2025-01-01"
    assert today in keys, keys[-3:]


def test_jobs(server):
    names = {j["name"] for j in repository(server[0])["jobs"]}
    assert JOBS <= names, sorted(JOBS - names)


def test_schedules(server):
    names = {s["name"] for s in repository(server[0])["schedules"]}
    assert SCHEDULES <= names, f"missing {sorted(SCHEDULES - names)}; have {sorted(names)}"


def test_sensors(server):
    # Dagster adds its own sensors (e.g. for freshness checks): inclusion, not equality.
    names = {s["name"] for s in repository(server[0])["sensors"]}
    assert SENSORS <= names, f"missing {sorted(SENSORS - names)}; have {sorted(names)}"


def test_raw_events_materialization_metadata(server, webserver_env):
    url, run_id = server
    asset = gql(url, """{ assetOrError(assetKey: {path: ["raw_events"]}) { __typename ... on Asset {
        assetMaterializations(limit: 1) { runId metadataEntries { label __typename
            ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue }
            ... on JsonMetadataEntry { jsonString } ... on TableMetadataEntry { table { records } } } } } } }""")[
        "assetOrError"]
    assert asset["__typename"] == "Asset", asset
    [mat] = asset["assetMaterializations"]
    assert mat["runId"] == run_id
    meta = {e["label"]: e for e in mat["metadataEntries"]}
    assert meta["topic"]["__typename"] == "TextMetadataEntry"
    assert meta["topic"]["text"] == webserver_env["EVENTS_TOPIC"]
    partitions = meta["partitions"]["intValue"]
    assert partitions > 0
    offsets = [json.loads(r) for r in meta["offsets"]["table"]["records"]]
    assert sorted(r["partition"] for r in offsets) == list(range(partitions))

    run = gql(url, "query ($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }",
              {"id": run_id})["runOrError"]
    assert run == {"__typename": "Run", "status": "SUCCESS"}
