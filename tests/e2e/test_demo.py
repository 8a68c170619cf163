"""`make demo` reads like a tool: its CLI (`python -m testkit.demo`) prints one line per step
and the summary, not Dagster's event stream (which stays in the run storage) nor Spark's log
(`assert_reads_like_a_tool`, applied to the observed demo of tests/alerts/test_demo_observed.py,
the suite's one full demo); a bad setting or a failed step is a clear error line and a non-zero
exit. Each case runs the real CLI in a subprocess on a tiny workload, with its own DAGSTER_HOME,
LAKEHOUSE_ROOT and topic."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from testkit.faults import short_lived

REPO = Path(__file__).resolve().parents[2]
RUN_LINE = re.compile(r"^  (\S+)\s.*\b(ok|FAILED)\s+[\d.]+s  run ([0-9a-f-]{36})\b")


def run_demo(tmp_path: Path, bootstrap: str, timeout: float, **extra: str):
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)  # a second demo records in the same instance
    shutil.copy(REPO / "infra" / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DEMO_", "SPARK_CONF_")) and k != "DAGSTER_HOME"}
    env.update({
        "DAGSTER_HOME": str(home),
        "LAKEHOUSE_ROOT": str(tmp_path / "lakehouse"),
        "EVENTS_TOPIC": f"demo-{uuid.uuid4().hex[:10]}",
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "DEMO_EVENTS": "300", "DEMO_CHUNKS": "1", "DEMO_SPAN": "1 hour", "DEMO_SEED": "5",
        # The live step (the service for DEMO_LIVE): tests/alerts/test_demo_observed.py.
        "DEMO_LIVE": "0",
        "DAGSTER_DISABLE_TELEMETRY": "true", "GX_ANALYTICS_ENABLED": "false",
        "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
        **extra,
    })
    env = short_lived(env)  # a driver that lives for one demo
    done = subprocess.run([sys.executable, "-m", "testkit.demo"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done, home, env


def assert_reads_like_a_tool(done, home: Path, env: dict) -> None:
    """A successful demo's console: one line per step and the summary (no DEBUG, no Spark
    WARN), every run recorded in its instance as a success; then what the UI shows
    (`first_look`). Run on the observed demo (tests/alerts/test_demo_observed.py), the one demo
    the suite runs to its end."""
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) <= 40, done.stdout
    assert "DEBUG" not in done.stdout + done.stderr
    assert " WARN " not in done.stdout + done.stderr  # Spark's log4j output went to the log
    assert "\x1b[" not in done.stdout + done.stderr  # no terminal colours or cursor moves
    assert "SetuptoolsDeprecationWarning" not in done.stdout + done.stderr
    assert "summary" in lines
    assert any(re.search(r"reconciled == replay: yes \(GX check passed\)", line) for line in lines)
    assert any(line.startswith("  timeline report") and "FAILED" not in line for line in lines)
    runs = [m.groups() for line in lines if (m := RUN_LINE.match(line))]
    assert [job for job, _, _ in runs][:1] == ["stream_catch_up"]
    assert {job for job, _, _ in runs} == {"stream_catch_up", "reconcile_dates", "report_timeline",
                                           "check_freshness", "report_scorecard"}
    # The demo names its runner as the owner: every row of its scorecard passes.
    assert any(line.startswith("  scorecard          7 of 7 rows pass") for line in lines), lines
    assert any(line.startswith("  downstream feed") for line in lines), lines
    assert all(status == "ok" for _, status, _ in runs)
    # The event stream is in the run storage (what `make ui` shows), not on the console.
    instance = DagsterInstance.from_config(str(home))
    try:
        for _, _, run_id in runs:
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS
            steps = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_SUCCESS)
            assert steps.records, run_id
    finally:
        instance.dispose()
    assert (home / "demo.log").stat().st_size > 0  # Spark's and Dagster's console output
    first_look(env, home)


def first_look(env: dict, home: Path) -> None:
    """What the UI shows after the demo, asked through the webserver's GraphQL API: the daily
    partitions start at the first event date (not LAKEHOUSE_START_DATE), and every asset check
    has a latest evaluation, which passed."""
    from conftest import free_port

    from lakehouse.config.settings import Settings
    from lakehouse.tables.reads import bronze_dates
    from testkit.webserver import gql, webserver

    env = {k: v for k, v in env.items() if k != "PARTITIONS_START"}  # the default: data's first
    first = min(bronze_dates(Settings.from_env(env))).isoformat()
    with webserver(env, free_port(), home / "webserver.log") as url:
        nodes = gql(url, """{ assetNodes { assetKey { path } isPartitioned partitionKeys
            assetChecksOrError { ... on AssetChecks { checks { name } } } } }""")["assetNodes"]
        partitioned = {"/".join(n["assetKey"]["path"]): n["partitionKeys"] for n in nodes
                       if n["isPartitioned"]}
        assert partitioned and all(keys[0] == first for keys in partitioned.values()), (
            first, {k: v[:2] for k, v in partitioned.items()})
        checks = [(n["assetKey"]["path"], c["name"]) for n in nodes
                  for c in (n["assetChecksOrError"] or {}).get("checks", [])]
        assert len(checks) >= 4, checks
        latest = {}
        for path, name in checks:
            runs = gql(url, """query ($path: [String!]!, $name: String!) {
                assetCheckExecutions(assetKey: {path: $path}, checkName: $name, limit: 1) {
                    status evaluation { success } } }""", {"path": path, "name": name})
            execution = runs["assetCheckExecutions"]
            latest["/".join(path) + ":" + name] = (execution[0]["status"] if execution
                                                   else "never evaluated")
        assert set(latest.values()) == {"SUCCEEDED"}, latest


def test_failed_step_prints_its_error_and_where_to_read_the_logs(tmp_path, kafka_bootstrap):
    """The Spark driver cannot start (an invalid heap size): `bronze_events` fails."""
    done, home, _ = run_demo(tmp_path, kafka_bootstrap, timeout=300,
                          **{"SPARK_CONF_spark.driver.memory": "not-a-size"})
    lines = done.stdout.splitlines()
    assert done.returncode != 0
    assert "DEBUG" not in done.stdout + done.stderr and "Traceback" not in done.stdout
    failed = [m.groups() for line in lines if (m := RUN_LINE.match(line))]
    assert [(job, status) for job, status, _ in failed] == [("stream_catch_up", "FAILED")]
    run_id = failed[0][2]
    error = next(line for line in lines if line.startswith("    error: "))
    assert error.startswith("    error: step ingest: PySparkRuntimeError: ")
    assert "JAVA_GATEWAY_EXITED" in error
    logs = next(line for line in lines if line.startswith("    logs: "))
    assert "make ui" in logs and f"/runs/{run_id}" in logs and str(home / "demo.log") in logs
    assert "summary" not in lines
    assert len(lines) <= 10, done.stdout


@pytest.mark.parametrize("env, message", [
    ({"WINDOW_SIZE": "7 minutes"}, "demo: error: WINDOW_SIZE='7 minutes' must be positive and "
                                   "divide a day evenly"),
    ({"DEMO_EVENTS": "lots"}, "demo: error: DEMO_EVENTS='lots' must be a positive integer"),
    # A spec error stops the demo before any Spark session or run starts.
    ({"PIPELINE": "name: o\ntopic: o\nmeasures: [{field: amout}]\n"},
     "demo: error: {path}: measures[0].field: 'amout' is not a declared field"),
    # So is a spec the code location would refuse beside the default pipeline.
    ({"PIPELINE": "name: default\ntopic: o\n"},
     "demo: error: {path}: name: 'default' is the pipeline of LAKEHOUSE_ROOT itself"),
    # A spec naming brokers of its own gets none of the deployment's credentials: refused
    # before anything is produced.
    ({"PIPELINE": "name: o\ntopic: o\nkafka_options: {bootstrap.servers: '127.0.0.1:1', "
                  "security.protocol: SASL_PLAINTEXT, sasl.mechanism: PLAIN}\n",
      "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN",
      "KAFKA_SASL_USERNAME": "lakehouse", "KAFKA_SASL_PASSWORD": "deployment-pw-7"},
     "demo: error: pipeline 'o': kafka_options.bootstrap.servers sends the client to brokers of "
     "the spec's own while the deployment's Kafka credentials are set"),
])
def test_bad_setting_is_one_error_line_and_exit_code_2(tmp_path, env, message):
    if "PIPELINE" in env:
        (tmp_path / "bad.yaml").write_text(env["PIPELINE"])
        env = {**env, "PIPELINE": str(tmp_path / "bad.yaml")}
        message = message.format(path=tmp_path / "bad.yaml")
    done, _, _ = run_demo(tmp_path, "127.0.0.1:1", timeout=60, **env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(message) and len(done.stderr.splitlines()) == 1, done.stderr


def assert_fed_and_scored(env: dict) -> None:
    """On a finished demo's deployment (`env`: its environment): the downstream feed, folded
    by the consumer's rule, holds gold's closed windows; `make scorecard` writes its seven rows,
    the replay proven, and the missing owner failing its row with what to do."""
    import json

    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from lakehouse.tables.reads import read
    from testkit.feed import committed_messages, fold, window_of

    with overridden({k: env[k] for k in ("LAKEHOUSE_ROOT", "EVENTS_TOPIC",
                                         "KAFKA_BOOTSTRAP_SERVERS")}):
        settings = Settings.from_env()
    gold = {window_of({"window_start": r["window_start"].isoformat().replace("+00:00", "Z"),
                       "key": r["key"]}): r
            for r in read(settings, "reconciled_aggregates").to_pylist() if r["status"] != "open"}
    folded = fold(committed_messages(settings, settings.feed_topic))
    assert gold and set(folded) == set(gold)
    assert all(folded[k]["value_sum"] == str(g["value_sum"]) and folded[k]["revision"]
               == g["revision"] for k, g in gold.items())

    done = subprocess.run(["make", "--no-print-directory", "scorecard"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(
        (Path(env["LAKEHOUSE_ROOT"]) / "reports" / "scorecard.json").read_text())["rows"]}
    assert list(rows) == ["timestamp", "lateness", "replay", "scaling", "cost", "governance",
                          "observability"]
    assert rows["replay"]["passed"] and rows["timestamp"]["passed"] and rows["cost"]["passed"]
    assert not rows["governance"]["passed"] and "PIPELINE_OWNER" in rows["governance"]["todo"]
    assert re.search(r"^  governance\s+FAIL  no owner", done.stdout, re.M), done.stdout
