"""Schedules and the late-data sensor, evaluated with Dagster's test contexts on tables written
with delta-rs: the exact run requests, and none when nothing changed."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest
from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from deltalake import write_deltalake

from assets.resources import LakehouseResource
from orchestration.definitions import defs

# The code location's own definitions (the default pipeline's names).
stream_catch_up_schedule = defs.get_schedule_def("stream_catch_up_schedule")
corrections_schedule = defs.get_schedule_def("corrections_schedule")
verification_schedule = defs.get_schedule_def("verification_schedule")
timeline_schedule = defs.get_schedule_def("timeline_schedule")
late_data_sensor = defs.get_sensor_def("late_data_sensor")
prove_corrected_dates = defs.get_sensor_def("prove_corrected_dates")
verify_job = defs.resolve_job_def("verify_dates")

TICK = datetime(2026, 11, 22, 3, 15, tzinfo=UTC)


@pytest.fixture()
def root(tmp_path, monkeypatch):
    """The lakehouse root the schedules and sensors are given through their `lakehouse`
    resource; the environment points elsewhere, so reading it instead would find nothing."""
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "not-here"))
    monkeypatch.setenv("CORRECTION_HORIZON", "7 days")
    return tmp_path


def resources(root) -> dict:
    return {"lakehouse": LakehouseResource(lakehouse_root=str(root))}


def write_bronze_dates(root, dates):
    table = pa.table({"event_id": [f"e{i}" for i in range(len(dates))],
                      "event_date": pa.array(dates, pa.date32())})
    write_deltalake(str(root / "bronze_events"), table, partition_by=["event_date"], mode="append")


def write_late(root, rows):
    table = pa.table({
        "event_id": [f"l{i}" for i in range(len(rows))],
        "event_date": pa.array([d for d, _ in rows], pa.date32()),
        "recorded_at": pa.array([t for _, t in rows], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(str(root / "late_events"), table, partition_by=["event_date"], mode="append")


def test_catch_up_schedule_requests_a_run_unless_one_is_queued_or_running(root):
    # Schedule contexts need an instance with a ref. The context is closed too: it enters its
    # own instance from that ref, which would otherwise stay Dagster's current one after this
    # test (a dead weakref for the next test that loads definitions).
    with instance_for_test() as instance, build_schedule_context(
            instance=instance, scheduled_execution_time=TICK,
            resources=resources(root)) as context:
        assert isinstance(stream_catch_up_schedule(context), RunRequest)
        instance.add_run(DagsterRun(job_name="stream_catch_up", status=DagsterRunStatus.STARTED))
        assert isinstance(stream_catch_up_schedule(context), SkipReason)


def test_corrections_schedule_covers_dates_with_data_within_the_horizon_in_one_run(root):
    context = build_schedule_context(scheduled_execution_time=TICK, resources=resources(root))
    assert isinstance(corrections_schedule(context), SkipReason)  # no data at all
    write_bronze_dates(root, [date(2026, 11, 10), date(2026, 11, 16), date(2026, 11, 21),
                              date(2026, 11, 22)])
    request = corrections_schedule(context)
    assert request.partition_key is None
    assert request.tags[ASSET_PARTITION_RANGE_START_TAG] == "2026-11-16"  # 11-10: beyond 7 days
    assert request.tags[ASSET_PARTITION_RANGE_END_TAG] == "2026-11-22"


def test_corrections_schedule_with_one_recent_date_requests_that_partition(root):
    write_bronze_dates(root, [date(2026, 11, 1), date(2026, 11, 21)])
    request = corrections_schedule(build_schedule_context(scheduled_execution_time=TICK,
                                                          resources=resources(root)))
    assert request.partition_key == "2026-11-21"
    assert ASSET_PARTITION_RANGE_START_TAG not in request.tags


def test_verification_schedule_replays_and_proves_yesterday(root):
    request = verification_schedule(build_schedule_context(scheduled_execution_time=TICK))
    assert request.partition_key == "2026-11-21"
    assert verification_schedule.job_name == "verify_dates"
    # The job replays each date up to the position its published gold rows came from.
    assert verify_job.partitions_def is not None
    config = verify_job.partitioned_config.get_run_config_for_partition_key("2026-11-21")
    assert config["resources"]["log_position"]["config"] == {"as_published": True}


def test_late_data_sensor_requests_exactly_the_dates_with_new_late_events(root):
    instance = DagsterInstance.ephemeral()
    now = datetime.now(UTC).replace(microsecond=0)
    today, yesterday, old = now.date(), now.date() - timedelta(days=1), now.date() - timedelta(days=30)

    result = late_data_sensor(build_sensor_context(instance=instance, resources=resources(root)))
    assert not result.run_requests  # no late_events table yet

    write_late(root, [(yesterday, now - timedelta(minutes=5)), (yesterday, now - timedelta(minutes=4)),
                      (today, now - timedelta(minutes=3)), (old, now - timedelta(minutes=2))])
    result = late_data_sensor(build_sensor_context(instance=instance, resources=resources(root)))
    requests = {r.partition_key: r.run_key for r in result.run_requests}
    assert set(requests) == {yesterday.isoformat(), today.isoformat()}  # `old` is beyond the horizon
    assert all(r.job_name in (None, "reconcile_dates") for r in result.run_requests)
    cursor = result.cursor
    assert cursor == "v0"  # the late_events version looked at

    again = late_data_sensor(build_sensor_context(instance=instance, cursor=cursor, resources=resources(root)))
    assert not again.run_requests and again.cursor == cursor  # nothing new, nothing requested

    write_late(root, [(today, now - timedelta(minutes=1))])
    newer = late_data_sensor(build_sensor_context(instance=instance, cursor=cursor, resources=resources(root)))
    assert [r.partition_key for r in newer.run_requests] == [today.isoformat()]
    assert newer.run_requests[0].run_key != requests[today.isoformat()]  # a new key for new work
    assert newer.cursor == "v1"

    # A cursor from before (not a version) starts over: every date with late rows in the horizon.
    legacy = late_data_sensor(build_sensor_context(instance=instance, cursor="1763780000000",
                                                      resources=resources(root)))
    assert {r.partition_key for r in legacy.run_requests} == set(requests)


def test_timeline_schedule_requests_the_report_run(root):
    data = timeline_schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=TICK))
    assert len(data.run_requests) == 1 and data.run_requests[0].partition_key is None
    assert timeline_schedule.job_name == "report_timeline"
    assert timeline_schedule.cron_schedule == "45 * * * *"


def test_a_correct_dates_run_is_followed_by_the_proof_of_its_dates():
    """Whatever launches `correct_dates`, the dates it published get a `verify_dates` run."""
    from dagster import DagsterEvent, DagsterEventType, build_run_status_sensor_context
    from dagster._core.storage.tags import PARTITION_NAME_TAG

    instance = DagsterInstance.ephemeral()

    def evaluate(tags: dict):
        run = DagsterRun(job_name="correct_dates", status=DagsterRunStatus.SUCCESS, tags=tags)
        event = DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value,
                             job_name="correct_dates")
        return prove_corrected_dates(build_run_status_sensor_context(
            sensor_name="prove_corrected_dates", dagster_event=event, dagster_instance=instance,
            dagster_run=run))

    one = evaluate({PARTITION_NAME_TAG: "2026-11-20"})
    assert one.partition_key == "2026-11-20" and one.run_key
    several = evaluate({ASSET_PARTITION_RANGE_START_TAG: "2026-11-17",
                        ASSET_PARTITION_RANGE_END_TAG: "2026-11-21"})
    assert (several.tags[ASSET_PARTITION_RANGE_START_TAG],
            several.tags[ASSET_PARTITION_RANGE_END_TAG]) == ("2026-11-17", "2026-11-21")
    assert isinstance(evaluate({}), SkipReason)
    assert prove_corrected_dates.job_name == "verify_dates"


def test_late_events_before_the_first_partition_are_named_until_a_reload(root):
    """Partitions start at the first event date read when the definitions loaded; late events
    of an older date (still within the horizon) get no run until a reload: each tick says so
    and keeps its cursor, so the first tick after the reload requests them. (A reload builds
    the sensor with a new first partition: the tick is called with each.)"""
    from orchestration.sensors import late_data_result

    instance = DagsterInstance.ephemeral()
    settings = resources(root)["lakehouse"].settings
    now = datetime.now(UTC).replace(microsecond=0)
    today, three_days = now.date(), now.date() - timedelta(days=3)

    def tick(cursor: str, first):
        return late_data_result(build_sensor_context(instance=instance, cursor=cursor),
                                settings, first)

    write_late(root, [(three_days, now - timedelta(minutes=5)), (today, now - timedelta(minutes=4))])
    result = tick("v-1", today)  # loaded before the old date's data
    assert [r.partition_key for r in result.run_requests] == [today.isoformat()]
    assert result.cursor == "v-1"  # not past the date that could not be requested
    after = tick(result.cursor, three_days)  # the reload
    assert {r.partition_key for r in after.run_requests} == {three_days.isoformat(),
                                                             today.isoformat()}

    write_late(root, [(three_days, now - timedelta(minutes=1))])
    only_old = tick("v0", today)
    assert not only_old.run_requests and only_old.cursor == "v0"
    message = only_old.skip_reason.skip_message
    assert three_days.isoformat() in message and "reload" in message


def test_the_partition_tags_are_dagsters_own():
    """The product names Dagster's partition run tags itself (its public API does not export
    them): they stay the names Dagster sets and reads."""
    from dagster._core.storage import tags

    from assets import partitions

    assert partitions.PARTITION_NAME_TAG == tags.PARTITION_NAME_TAG
    assert partitions.ASSET_PARTITION_RANGE_START_TAG == tags.ASSET_PARTITION_RANGE_START_TAG
    assert partitions.ASSET_PARTITION_RANGE_END_TAG == tags.ASSET_PARTITION_RANGE_END_TAG
