"""`make stream` and the catch-up schedule side by side: while the real service holds the
pipeline's stream, ten ticks of the definitions' catch-up schedule skip naming it (its pid) and
request no run, and a catch-up launched by hand (in-process and through `dagster asset
materialize`) succeeds as a no-op whose materializations say it was skipped and who holds the
stream. Checks, not tests: run while the service of tests/e2e/test_metrics_service.py streams
(one service start for both)."""

import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from conftest import REPO, run_job
from dagster import DagsterInstance, build_schedule_context, instance_for_test

from assets.resources import LakehouseResource
from lakehouse.tables.locks import SERVICE_ROLE

SKIP_TAIL = "holds the stream checkpoint 'ingest': it is ingesting; no catch-up needed"


def ten_catch_up_ticks_skip_naming_the_service(settings, svc) -> None:
    from orchestration.definitions import defs

    schedule = defs.get_schedule_def("stream_catch_up_schedule")
    resources = {"lakehouse": LakehouseResource(lakehouse_root=str(settings.root))}
    ticks = []
    # A schedule context needs an instance with a ref (and is closed: see tests/unit/
    # test_schedules.py).
    with instance_for_test() as instance:
        for _ in range(10):
            with build_schedule_context(instance=instance, resources=resources,
                                        scheduled_execution_time=datetime.now(UTC)) as context:
                ticks.append(schedule.evaluate_tick(context))
        assert instance.get_runs_count() == 0
    assert [t.run_requests for t in ticks] == [[]] * 10  # no run requested
    for tick in ticks:
        assert tick.skip_message.startswith(f"{SERVICE_ROLE} (pid {svc.pid} on "), \
            tick.skip_message
        assert tick.skip_message.endswith(SKIP_TAIL)


def skipped_materializations(result) -> dict[str, dict]:
    return {e.event_specific_data.materialization.asset_key.to_user_string():
            {k: v.value for k, v in e.event_specific_data.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()}


def a_catch_up_by_hand_succeeds_as_a_no_op_naming_the_service(svc) -> None:
    instance = DagsterInstance.ephemeral()
    result, _ = run_job("stream_catch_up", instance)
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert result.success and not failures, failures
    materialized = skipped_materializations(result)
    for key in ("bronze_events", "streaming_aggregates"):
        meta = materialized[key]
        assert meta["skipped"] is True
        assert meta["batches"] == 0 and meta["input_rows"] == 0
        assert meta["skip_reason"].startswith(f"{SERVICE_ROLE} (pid {svc.pid} on ")
        assert meta["stream_holder"]["pid"] == svc.pid
        assert meta["stream_holder"]["role"] == SERVICE_ROLE
    logged = [e.message for e in instance.all_logs(result.run_id)
              if e.user_message and "skipped, nothing ingested by this run" in e.user_message]
    assert logged and SKIP_TAIL in logged[0]


def dagster_asset_materialize_succeeds_while_the_service_streams(svc, tmp_path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m",
         "orchestration.definitions", "--select", "raw_events,bronze_events,streaming_aggregates"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    print(f"dagster asset materialize took {time.monotonic() - t0:.1f}s")
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    assert "STEP_FAILURE" not in text and "CheckpointBusy" not in text
    assert f"pid {svc.pid} on " in text and SKIP_TAIL in text
