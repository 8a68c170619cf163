"""`stream_progress` gets one row per batch: recording the same reports again (a retried call)
writes nothing, a batch reported twice in one call keeps its last report."""

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import PartitionOffsets, consumer_lag
from lakehouse.tables.catalog import INGEST_QUERY, PROGRESS
from spark_jobs.progress import progress_row, record_progress
from spark_jobs.tables import read_table
from spark_jobs.writer import Writer, ensure_tables


def report(batch: int, rows: int, query_id: str = "q-1") -> dict:
    return {"id": query_id, "batchId": batch, "timestamp": "2026-11-23T10:00:00.000Z",
            "numInputRows": rows, "sources": [{"endOffset": {"events": {"0": batch * 10}}}]}


def test_progress_rows_are_recorded_once_per_batch(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    ensure_tables(spark, settings)

    def rows() -> dict[int, int]:
        got = read_table(spark, settings, PROGRESS).where("query = 'bronze'").collect()
        assert len(got) == len({r.batch_id for r in got}), "a batch recorded twice"
        return {r.batch_id: r.input_rows for r in got}

    assert record_progress(Writer(spark, settings), "bronze", [report(0, 5), report(1, 1), report(1, 7)],
                           [PartitionOffsets(0, 0, 10)]) == 2
    assert rows() == {0: 5, 1: 7}
    record_progress(Writer(spark, settings), "bronze", [report(0, 5), report(1, 7)],
                    [PartitionOffsets(0, 0, 10)])
    assert rows() == {0: 5, 1: 7}
    record_progress(Writer(spark, settings), "bronze", [report(2, 3)], [PartitionOffsets(0, 0, 30)])
    assert rows() == {0: 5, 1: 7, 2: 3}
    # A new checkpoint (a reprocess from scratch) is a new query id: its batch 0 is recorded.
    record_progress(Writer(spark, settings), "bronze", [report(0, 9, query_id="q-2")],
                    [PartitionOffsets(0, 0, 40)])
    assert sorted(r.input_rows for r in read_table(spark, settings, PROGRESS)
                  .where("query = 'bronze' AND batch_id = 0").collect()) == [5, 9]


def test_lag_after_a_retention_cut_counts_from_the_earliest_retained_offset():
    """One formula everywhere (progress rows, metrics, topic status): a partition the stream has
    not read yet is behind by what is retained in it, not by its end offset."""
    offsets = [PartitionOffsets(0, 0, 40), PartitionOffsets(1, 1_000, 1_050)]
    assert consumer_lag(offsets, {0: 30}) == {0: 10, 1: 50}
    assert consumer_lag(offsets, {0: 45, 1: 1_050}) == {0: 0, 1: 0}  # never negative
    row = progress_row(INGEST_QUERY, report(3, 1), offsets)  # the report read partition 0 to 30
    assert row["kafka_lag"] == 60
    assert progress_row(INGEST_QUERY, report(3, 1), None)["kafka_lag"] is None
