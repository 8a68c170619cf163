"""The daily jobs as the daemon launches them (`dagster job execute` in a fresh process), over Spark
Connect (SPARK_REMOTE set in the run's environment: no JVM of its own, the test session's server)
and in classic mode. A `reconcile_dates` run killed (SIGKILL) while its corrections MERGE is
writing leaves no lock held by the dead pid, nothing half-applied; the next run takes the date's
lock (over Connect: first stopping what the dead run's session still runs in the server,
spark_jobs.connect_work), succeeds, and proves gold == replay. Over Connect, late events for the
proven date are then corrected by one more run (MERGE into gold, rows in the changelog), every
check passing. The catch-ups stay classic (in the test's process)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from conftest import REPO

from testkit.faults import _spawn, kill_corrections, output
from testkit.runs import run_job

# Catch-ups and two or three runs in fresh processes (and a Connect server beside the suite):
# minutes on a loaded 2-core machine, in `make test-long` (test-cluster).
pytestmark = [pytest.mark.long, pytest.mark.timeout(2400)]


def executions(server_log) -> int:
    """How many operations the Connect server has run (one log line each)."""
    return server_log.read_text(errors="replace").count("ExecuteHolder ExecuteKey")


def home_and_evening(tmp_path):
    """A DAGSTER_HOME for runs in fresh processes (the local instance's dagster.yaml) and
    yesterday 20:00 UTC: the end of events whose date is whole and past at any hour."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())
    return home, (datetime.now(UTC) - timedelta(days=1)).replace(hour=20, minute=0, second=0,
                                                                 microsecond=0)


def start_run(day, home, remote: dict[str, str] | None, log):
    """`remote`: the Connect server's environment (SPARK_REMOTE and its state folder)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    env["DAGSTER_HOME"] = str(home)
    env.update(remote or {})
    return _spawn([sys.executable, "-m", "dagster", "job", "execute", "-m",
                   "orchestration.definitions", "-j", "reconcile_dates", "--tags",
                   json.dumps({"dagster/partition": day.isoformat()})], env, log)


def finished(run) -> None:
    """A run started by `start_run` ends successfully, no step failing."""
    assert run.wait(1500) == 0, output(run, 8000)
    text = output(run, 10**7)
    assert "RUN_SUCCESS" in text and "STEP_FAILURE" not in text, text[-6000:]


def last_checks(instance) -> None:
    """The newest run's check evaluations: the proof's among them, each of them passed."""
    run = instance.get_runs(limit=1)[0]
    checks = {e.dagster_event.event_specific_data.check_name:
              e.dagster_event.event_specific_data for e in instance.all_logs(run.run_id)
              if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert {"reconciled_equals_replay", "fast_path_vs_replay"} <= set(checks)
    assert all(c.passed for c in checks.values()), {n: c.description for n, c in checks.items()}


def rows(settings, table: str, day) -> list[dict]:
    from deltalake import DeltaTable

    uri, options = settings.delta_rs(table)
    return [r for r in DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
            if r["event_date"] == day]


@pytest.mark.parametrize("mode", ["connect", "classic"])
def test_killed_reconcile_leaves_no_lock_and_next_run_proves(mode, instance_env, spark,
                                                            spark_connect, tmp_path):
    from dagster import DagsterInstance

    from lakehouse.tables.locks import RemoteWork, lock_holder
    from testkit.generator import GeneratorConfig, generate, produce

    remote, server_log = (spark_connect.env, spark_connect.log) if mode == "connect" else \
        (None, None)
    settings = instance_env
    home, end = home_and_evening(tmp_path)
    day = end.date()
    cfg = GeneratorConfig(count=2000, seed=46, end=end, span=timedelta(hours=3), keys=6,
                          late_fraction=0.05, duplicate_fraction=0.04, malformed_fraction=0.02)
    produce(settings, generate(cfg).records)
    catch_ups = DagsterInstance.ephemeral()
    result, _ = run_job("stream_catch_up", catch_ups, quiet=True)
    assert result.success

    started = time.monotonic()
    operations = executions(server_log) if remote else 0
    run = start_run(day, home, remote, tmp_path / "killed.log")
    landed = kill_corrections(run, settings, "merge_files_written", timeout=900)
    assert landed, f"the run ended before its MERGE could be killed: {output(run)}"
    dead = run.pid

    lock = settings.path(f"_locks/date-{day.isoformat()}.lock")
    record = open(lock.removeprefix("file://")).read().split("\n")
    holder = lock_holder(settings, f"date-{day.isoformat()}")
    assert holder is None or holder.pid != dead, f"the dead run {dead} still holds {holder}"
    assert record[0].startswith(f"pid {dead} "), record  # it was the holder, and died holding it
    if mode == "connect":  # its session is left recorded for the next holder to stop
        assert any(RemoteWork.parse(line) for line in record[1:]), record

    # Dagster's side of the dead run: still STARTED, holding the daily pool's slot (no run
    # monitoring here); as an operator (or the daemon's monitoring) would, mark it failed.
    instance = DagsterInstance.from_config(str(home))
    killed = instance.get_runs(limit=1)[0]
    instance.report_run_failed(killed)
    instance.event_log_storage.free_concurrency_slots_for_run(killed.run_id)

    nxt = start_run(day, home, remote, tmp_path / "next.log")
    finished(nxt)
    if mode == "connect":
        assert "stopped the Spark Connect session" in output(nxt, 10**7)
        assert executions(server_log) > operations, "the runs did not use the Connect server"
    last_checks(instance)
    # The lock is free again, its record names no session left to stop.
    assert lock_holder(settings, f"date-{day.isoformat()}") is None
    assert not any(RemoteWork.parse(line)
                   for line in open(lock.removeprefix("file://")).read().split("\n")[1:])

    # Nothing duplicated or half-applied: one gold row per window and key, equal to the replay's;
    # one changelog row per (window, key, revision).
    window = [*settings.shape.window_id]
    measures = list(settings.shape.measure_columns)
    gold = rows(settings, "reconciled_aggregates", day)
    replay = rows(settings, "replay_aggregates", day)
    assert gold and max(Counter(tuple(r[k] for k in window) for r in gold).values()) == 1
    key = {tuple(r[k] for k in window): tuple(r[m] for m in measures) for r in gold}
    assert key == {tuple(r[k] for k in window): tuple(r[m] for m in measures) for r in replay}
    log = rows(settings, "late_corrections", day)
    assert not log or max(Counter(tuple(r[k] for k in [*window, "revision"])
                                  for r in log).values()) == 1
    print(f"{mode}: killed at {landed}; both runs {time.monotonic() - started:.0f}s")
    if mode != "connect":
        return

    # Late events for the proven date: the next run over Connect corrects its published windows.
    late = GeneratorConfig(count=120, seed=45, end=end - timedelta(minutes=30),
                           span=timedelta(hours=2), keys=6, late_fraction=0.0,
                           duplicate_fraction=0.0, malformed_fraction=0.0)
    produce(settings, generate(late).records)
    result, _ = run_job("stream_catch_up", catch_ups, quiet=True)
    assert result.success
    finished(start_run(day, home, remote, tmp_path / "late.log"))
    last_checks(instance)
    assert len(rows(settings, "late_corrections", day)) > len(log), \
        "the late events corrected no published window"
