"""A corrections run on a date whose bronze rows did not change since its last run reads no
bronze and diffs nothing: it only finalizes the open windows the stream's watermark has closed
since (their values are what a recompute would give). Bronze is written here as the stream
writes it: rows in a commit stamped with the stream's position and next watermark."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE, CORRECTIONS, RECONCILED
from lakehouse.tables.commit_tags import StreamCommit
from spark_jobs.corrections import run_corrections
from spark_jobs.tables import read_table
from spark_jobs.writer import ensure_tables

D = (datetime.now(UTC) - timedelta(days=1)).date()
T = datetime(D.year, D.month, D.day, 10, tzinfo=UTC)


def stream_append(spark, settings, batch: int, events: list[tuple[str, datetime]],
                  watermark: datetime) -> None:
    """One stream commit: `events` (id, event time) of key `k`, value 1, and the watermark the
    batch leaves."""
    now = datetime.now(UTC)
    rows = [(i, "k", t, t, Decimal(1), None, None, None, "events", 0, batch * 10 + n, now,
             t.date(), now, batch) for n, (i, t) in enumerate(events)]
    tag = StreamCommit(version=-1, end_offsets={0: batch * 10 + len(events)}, query="q",
                       batch_id=batch, watermark_ms=0,
                       next_watermark_ms=int(watermark.timestamp() * 1000)).metadata()
    (spark.createDataFrame(rows, read_table(spark, settings, BRONZE).schema).coalesce(1)
     .write.format("delta").mode("append").option("userMetadata", tag)
     .save(settings.table_path(BRONZE.name)))


def statuses(spark, settings) -> dict:
    return {(r.window_start.minute, r.status, r.revision) for r in
            read_table(spark, settings, RECONCILED).collect()}


def test_an_unchanged_date_only_finalizes_what_the_watermark_closed(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    ensure_tables(spark, settings)
    minute = timedelta(minutes=1)
    # Three one-minute windows (10:00, 10:01, 10:02); the watermark closes the first.
    stream_append(spark, settings, 1, [(f"e{m}", T + m * minute) for m in range(3)], T + minute)
    first = run_corrections(spark, settings, D, run_id="r1")
    assert (first.mode, first.windows, first.finalized) == ("full", 3, 0)
    assert statuses(spark, settings) == {(0, "final", 0), (1, "open", 0), (2, "open", 0)}

    # The stream moves on (rows of the next date only): its watermark closes 10:01.
    stream_append(spark, settings, 2, [("n1", T + timedelta(days=1))], T + 2 * minute)
    second = run_corrections(spark, settings, D, run_id="r2")
    assert second.mode == "incremental"
    assert (second.windows_recomputed, second.finalized, second.corrected) == (1, 1, 0)
    assert statuses(spark, settings) == {(0, "final", 0), (1, "final", 0), (2, "open", 0)}
    assert read_table(spark, settings, CORRECTIONS).count() == 0  # finalizing is no correction

    # Nothing new at all: no window recomputed, no commit to gold.
    version = delta_log.version(settings, RECONCILED.name)
    third = run_corrections(spark, settings, D, run_id="r3")
    assert (third.windows_recomputed, third.windows) == (0, 3)
    assert delta_log.version(settings, RECONCILED.name) == version

