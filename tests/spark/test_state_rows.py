"""The newest state row of a date, read with delta-rs from tables Spark created and appended to
(`corrections_state`, `replay_state`): ordering, ties, filters, and nothing to read."""

from datetime import UTC, date, datetime, timedelta

from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import CORRECTIONS_STATE, REPLAY_STATE
from spark_jobs.corrections.state import latest_state
from spark_jobs.replay import latest_replay, replayed_in_run
from spark_jobs.writer import ensure_tables

D, OTHER = date(2026, 3, 29), date(2026, 3, 30)
T0 = datetime(2026, 3, 30, 1, 0, tzinfo=UTC)


def append(spark, settings, table, rows):
    spark.createDataFrame(rows, table.ddl).write.format("delta").mode("append").save(
        settings.table_path(table.name))


def test_latest_state_and_replay_rows(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lakehouse")})
    assert latest_state(settings, D) is None  # no table yet
    ensure_tables(spark, settings)
    assert latest_state(settings, D) is None and latest_replay(settings, D) is None

    # (event_date, bronze_version, reconciled_version, mode, run_id, updated_at)
    append(spark, settings, CORRECTIONS_STATE, [
        (D, 9, 4, "full", "a", T0 + timedelta(hours=5)),  # newest time, older gold version
        (D, 5, 6, "incremental", "b", T0),
        (D, 7, 6, "incremental", "c", T0 + timedelta(minutes=1)),  # same gold version, later
        (OTHER, 12, 20, "full", "d", T0 + timedelta(hours=9)),  # another date
    ])
    state = latest_state(settings, D)
    assert (state.run_id, state.bronze_version, state.reconciled_version) == ("c", 7, 6)
    assert state.updated_at == T0 + timedelta(minutes=1)  # an aware UTC instant
    assert latest_state(settings, OTHER).run_id == "d"

    # (event_date, bronze_version, run_id, replayed_at)
    append(spark, settings, REPLAY_STATE, [
        (D, 3, "r1", T0), (D, 8, "r2", T0 + timedelta(hours=1)), (D, None, "r1", T0 - timedelta(1)),
    ])
    assert latest_replay(settings, D).run_id == "r2"
    assert replayed_in_run(settings, D, "r1") == 3  # the run's newest replay of the date
    assert replayed_in_run(settings, D, "r3") is None and replayed_in_run(settings, OTHER, None) is None
