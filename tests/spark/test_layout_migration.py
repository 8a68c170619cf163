"""A `streaming_aggregates` table made by a release before 2026-11-25 (partitioned by date alone,
MERGEd into with deletion vectors) is rewritten once into the catalog's layout (date, status),
rows unchanged, before the stream publishes into it."""

from datetime import UTC, date, datetime
from decimal import Decimal

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import STREAMING
from lakehouse.tables.reads import read
from lakehouse.tables.stats import add_actions
from spark_jobs.writer import Writer, migrate_layout


def test_an_older_streaming_aggregates_layout_is_rewritten_once(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    schema = spark.createDataFrame([], STREAMING.ddl).schema
    start = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    rows = [(date(2026, 11, 20), start.replace(minute=m), start.replace(minute=m + 1), f"k{m}",
             m + 1, Decimal("1.5") * (m + 1), Decimal("1.5"), Decimal("1.5"), Decimal(m),
             "final" if m < 3 else "open", start, m, start, m) for m in range(5)]
    (spark.createDataFrame(rows, schema).write.format("delta").partitionBy("event_date")
     .option("delta.enableDeletionVectors", "true").save(settings.table_path(STREAMING.name)))
    before = sorted(read(settings, STREAMING.name).to_pylist(), key=lambda r: r["key"])
    assert delta_log.partition_columns(settings, STREAMING.name) == ("event_date",)

    assert migrate_layout(Writer(spark, settings), STREAMING)
    assert delta_log.partition_columns(settings, STREAMING.name) == ("event_date", "status")
    after = sorted(read(settings, STREAMING.name).to_pylist(), key=lambda r: r["key"])
    assert after == before
    assert not migrate_layout(Writer(spark, settings), STREAMING)  # once
    # Each status in its own partition: the stream's replaceWhere removes only open files.
    adds = add_actions(settings, STREAMING.name)
    assert set(adds["partition.status"].to_pylist()) == {"open", "final"}
