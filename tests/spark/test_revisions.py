"""Revisions of a gold window never restart: a window removed by a correction and later
re-inserted continues from its changelog, so no changelog row is overwritten. The changelog
never holds a revision gold has not published: gold commits first, and the corrections of a run
that died before logging them are logged by the date's next run, from gold's change feed."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from lakehouse.tables.catalog import CORRECTIONS, RECONCILED
from lakehouse.tables.correction_result import CorrectionResult
from spark_jobs.corrections.publish import publish
from spark_jobs.tables import read_table
from spark_jobs.writer import Writer, ensure_tables

D = date(2026, 11, 20)
START = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def window(spark, count: int | None):
    """The recomputed windows of D: one window with `count` events, or none."""
    schema = ("event_date DATE, window_start TIMESTAMP, window_end TIMESTAMP, key STRING, "
              "event_count BIGINT, value_sum DECIMAL(38,6), value_min DECIMAL(18,6), "
              "value_max DECIMAL(18,6), event_fingerprint DECIMAL(38,0)")
    rows = [] if count is None else [(D, START, START + timedelta(minutes=1), "k", count,
                                      Decimal(count), Decimal(1), Decimal(1), Decimal(count))]
    return spark.createDataFrame(rows, schema)


def test_revisions_go_on_across_a_removal_a_run_that_died_and_a_delete_outside(
        spark, tmp_path, monkeypatch):
    import sys

    from lakehouse.config.settings import Settings
    from lakehouse.tables import delta_log
    from spark_jobs.corrections import changelog
    from spark_jobs.corrections.state import latest_state, save_state
    from spark_jobs.writer import tagged_commits

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    ensure_tables(spark, settings)
    scope = window(spark, 1).select("window_start", "key")

    def gold():
        return [(r.revision, r.event_count) for r in read_table(spark, settings, RECONCILED).collect()]

    def changelog_rows():
        return {r.revision: (r.before_event_count, r.after_event_count, r.run_id)
                for r in read_table(spark, settings, CORRECTIONS).collect()}

    def completed_run(count, run_id):
        v = delta_log.version(settings, RECONCILED.name)
        with tagged_commits(spark, f"incremental:{D.isoformat()}:{run_id}"):
            publish(Writer(spark, settings), D, window(spark, count), scope, run_id, CorrectionResult(D))
        save_state(Writer(spark, settings), D, 0, v, "incremental", run_id)

    completed_run(1, "r1")
    assert gold() == [(0, 1)] and changelog_rows() == {}
    completed_run(None, "r2")  # removed: revision 1, logged
    assert gold() == [] and changelog_rows() == {1: (1, None, "r2")}

    # r3 re-inserts the window, at revision 2 (not 0: the changelog of its earlier life is never
    # overwritten), and dies after its gold commit, before its changelog commit and state row.
    monkeypatch.setattr(sys.modules["spark_jobs.corrections.publish"], "log_published",
                        lambda *a, **k: 0)
    with tagged_commits(spark, f"incremental:{D.isoformat()}:r3"):
        publish(Writer(spark, settings), D, window(spark, 2), scope, "r3", CorrectionResult(D))
    monkeypatch.undo()
    assert gold() == [(2, 2)]
    assert changelog_rows() == {1: (1, None, "r2")}  # never ahead of gold

    # The date's next run logs r3's correction from gold's change feed, once.
    state = latest_state(settings, D)
    assert changelog.repair(Writer(spark, settings), D, state) == 1
    assert changelog.repair(Writer(spark, settings), D, state) == 0
    assert changelog_rows() == {1: (1, None, "r2"), 2: (None, 2, "r3")}
    completed_run(3, "r4")  # and revisions go on from there
    assert gold() == [(3, 3)]
    assert changelog_rows() == {1: (1, None, "r2"), 2: (None, 2, "r3"), 3: (2, 3, "r4")}

    # A gold row deleted outside the pipeline: the re-insert restores its revision, and the
    # changelog keeps what it had (a revision, once logged, is not rewritten).
    spark.sql(f"DELETE FROM delta.`{settings.table_path(RECONCILED.name)}`")
    completed_run(3, "r5")
    assert gold() == [(3, 3)]
    assert changelog_rows() == {1: (1, None, "r2"), 2: (None, 2, "r3"), 3: (2, 3, "r4")}
