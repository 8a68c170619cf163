"""A launched run whose worker died (SIGKILL, out of memory) stays STARTED in Dagster and holds its
pool's slot: `fail_dead_runs` (the `fail_dead_runs` sensor) marks it failed and frees the slot."""

from __future__ import annotations

import os
import subprocess

from dagster import DagsterInstance, DagsterRunStatus, job, op
from dagster._core.events import EngineEventData

from orchestration.sensors import fail_dead_runs, run_worker_pid


@op
def nothing():
    pass


@job
def one_op():
    nothing()


def started(instance: DagsterInstance, pid: int | None):
    run = instance.create_run_for_job(one_op, status=DagsterRunStatus.STARTED)
    if pid is not None:  # what `dagster api execute_run` records as it starts
        instance.report_engine_event("the worker started", run, EngineEventData.in_process(pid))
    return run


def test_a_started_run_whose_worker_is_gone_is_marked_failed_and_frees_its_slot(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        dead, alive, unknown = started(instance, gone.pid), started(instance, os.getpid()), \
            started(instance, None)
        instance.event_log_storage.set_concurrency_slots("lakehouse_daily", 1)
        instance.event_log_storage.claim_concurrency_slot("lakehouse_daily", dead.run_id, "step")
        assert run_worker_pid(instance, dead.run_id) == gone.pid

        assert fail_dead_runs(instance) == [dead.run_id]
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
        assert instance.get_run_by_id(unknown.run_id).status == DagsterRunStatus.STARTED
        info = instance.event_log_storage.get_concurrency_info("lakehouse_daily")
        assert info.active_slot_count == 0, info
        assert fail_dead_runs(instance) == []  # once
