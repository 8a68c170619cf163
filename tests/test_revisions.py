"""Revisions of a gold window never restart: a window removed by a correction and later
re-inserted continues from its changelog, so no changelog row is overwritten; a rerun after a
failed gold MERGE reuses the revision it logged."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from spark_jobs.corrections.publish import publish
from spark_jobs.corrections.result import CorrectionResult
from spark_jobs.tables import CORRECTIONS, RECONCILED, ensure_tables, read_table

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


def test_a_removed_window_that_comes_back_continues_its_revisions(spark, tmp_path):
    from lakehouse.settings import Settings

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    ensure_tables(spark, settings)
    scope = window(spark, 1).select("window_start", "key")

    def run(count: int | None):
        publish(spark, settings, D, window(spark, count), scope, "run", CorrectionResult(D))
        gold = read_table(spark, settings, RECONCILED).collect()
        changelog = {r.revision: r.after_event_count
                     for r in read_table(spark, settings, CORRECTIONS).collect()}
        return ([(r.revision, r.event_count) for r in gold], changelog)

    assert run(1) == ([(0, 1)], {})
    assert run(None) == ([], {1: None})  # removed: revision 1
    assert run(2) == ([(2, 2)], {1: None, 2: 2})  # back: revision 2, not 0
    assert run(3) == ([(3, 3)], {1: None, 2: 2, 3: 3})  # its next correction: 3, nothing lost

    # Removed again, and the re-insert's gold MERGE "fails" after its changelog row was written:
    # the rerun reuses that revision instead of skipping one.
    assert run(None) == ([], {1: None, 2: 2, 3: 3, 4: None})
    assert run(5) == ([(5, 5)], {1: None, 2: 2, 3: 3, 4: None, 5: 5})
    spark.sql(f"DELETE FROM delta.`{settings.table_path(RECONCILED.name)}`")
    assert run(5) == ([(5, 5)], {1: None, 2: 2, 3: 3, 4: None, 5: 5})
