"""The daily jobs over Spark Connect (SPARK_REMOTE set in the run's environment): `reconcile_dates`
as the daemon launches it (`dagster job execute` in a fresh process, no JVM of its own) against
the test session's Connect server, first publishing a date, then correcting it after late
events, every check passing each time. The catch-up stays classic (in the test's process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from conftest import REPO

from testkit.runs import run_job

# Two catch-ups and two runs in fresh processes: minutes each on a loaded 2-core machine.
# Minutes with its own Connect server JVM beside the suite: in `make test-long` (test-cluster).
pytestmark = [pytest.mark.long, pytest.mark.timeout(2400)]


def executions(server_log) -> int:
    """How many operations the Connect server has run (one log line each)."""
    return server_log.read_text(errors="replace").count("ExecuteHolder ExecuteKey")


def connect_run(job: str, day, url: str, home) -> dict:
    """Job `job` for partition `day` in a fresh `dagster job execute` process with SPARK_REMOTE
    set (the run must succeed); its check evaluations by name."""
    from dagster import DagsterInstance

    env = {**os.environ, "DAGSTER_HOME": str(home), "SPARK_REMOTE": url}
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "orchestration.definitions",
         "-j", job, "--tags", json.dumps({"dagster/partition": day.isoformat()})],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    text = done.stdout + done.stderr
    assert done.returncode == 0 and "RUN_SUCCESS" in text, text[-6000:]
    assert "STEP_FAILURE" not in text
    instance = DagsterInstance.from_config(str(home))
    run = instance.get_runs(limit=1)[0]
    return {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
            for e in instance.all_logs(run.run_id)
            if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"}


def home_and_evening(tmp_path):
    """A DAGSTER_HOME for runs in fresh processes (the local instance's dagster.yaml) and
    yesterday 20:00 UTC: the end of events whose date is whole and past at any hour."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())
    return home, (datetime.now(UTC) - timedelta(days=1)).replace(hour=20, minute=0, second=0,
                                                                 microsecond=0)


def changelog_rows(settings, day) -> int:
    from deltalake import DeltaTable

    uri, options = settings.delta_rs("late_corrections")
    table = DeltaTable(uri, storage_options=options).to_pyarrow_table()
    return sum(1 for d in table.column("event_date").to_pylist() if d == day)


def test_reconcile_dates_over_spark_connect(instance_env, spark, spark_connect, tmp_path):
    from dagster import DagsterInstance

    from testkit.generator import GeneratorConfig, generate, produce

    url, server_log = spark_connect
    settings = instance_env
    home, end = home_and_evening(tmp_path)
    day = end.date()
    cfg = GeneratorConfig(count=600, seed=44, end=end, span=timedelta(hours=3), keys=6,
                          late_fraction=0.05, duplicate_fraction=0.04, malformed_fraction=0.02)
    instance = DagsterInstance.ephemeral()
    produce(settings, generate(cfg).records)
    result, _ = run_job("stream_catch_up", instance, quiet=True)  # classic, in this process
    assert result.success

    before = executions(server_log)
    checks = connect_run("reconcile_dates", day, url, home)
    assert executions(server_log) > before, "the run did not use the Connect server"
    assert {"reconciled_equals_replay", "fast_path_vs_replay"} <= set(checks)
    assert all(c.passed for c in checks.values()), {n: c.description for n, c in checks.items()}

    # Late events for the published date: the next run corrects it (MERGE over Connect).
    late = GeneratorConfig(count=120, seed=45, end=end - timedelta(minutes=30),
                           span=timedelta(hours=2), keys=6, late_fraction=0.0,
                           duplicate_fraction=0.0, malformed_fraction=0.0)
    produce(settings, generate(late).records)
    result, _ = run_job("stream_catch_up", instance, quiet=True)
    assert result.success
    checks = connect_run("reconcile_dates", day, url, home)
    assert all(c.passed for c in checks.values()), {n: c.description for n, c in checks.items()}
    assert changelog_rows(settings, day) > 0, "the late events corrected no published window"
