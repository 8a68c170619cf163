"""Bronze records file statistics for the columns reads skip by only (`Table.stats_columns`):
a new table is created with them, an older one gets them at the stream's start."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE
from spark_jobs.tables import table_ref
from spark_jobs.writer import STATS_COLUMNS, Writer, ensure_tables, limit_stats


def append_row(spark, settings: Settings) -> None:
    at = datetime(2026, 11, 27, 8, tzinfo=UTC)
    row = ("e-1", "k", at, at, Decimal("1.5"), None, None, None, "events", 0, 7, at,
           date(2026, 11, 27), at, 3)
    spark.createDataFrame([row], BRONZE.ddl).write.format("delta").mode("append").save(
        settings.table_path(BRONZE.name))


def stats_of_newest_file(settings: Settings) -> set[str]:
    actions = pa.table(delta_log.open_table(settings, BRONZE.name).get_add_actions(flatten=True))
    newest = actions.sort_by([("modification_time", "descending")]).slice(0, 1)
    return {c.split(".", 1)[1] for c in newest.column_names
            if c.startswith("min.") and newest[c][0].is_valid}


def test_a_new_bronze_keeps_statistics_of_its_skipping_columns_only(spark, tmp_path):
    settings = Settings(lakehouse_root=str(tmp_path / "new"))
    ensure_tables(spark, settings)
    append_row(spark, settings)
    assert stats_of_newest_file(settings) == set(BRONZE.stats_columns)
    assert not limit_stats(Writer(spark, settings), BRONZE)  # nothing to change


def test_an_older_bronze_gets_them_once(spark, tmp_path):
    settings = Settings(lakehouse_root=str(tmp_path / "old"))
    spark.sql(f"CREATE TABLE {table_ref(settings.table_path(BRONZE.name))} ({BRONZE.ddl}) "
              "USING delta PARTITIONED BY (event_date)")
    append_row(spark, settings)
    assert "event_id" in stats_of_newest_file(settings)  # Delta's default: every column
    assert limit_stats(Writer(spark, settings), BRONZE)
    assert not limit_stats(Writer(spark, settings), BRONZE)
    config = delta_log.open_table(settings, BRONZE.name).metadata().configuration
    assert config[STATS_COLUMNS] == ",".join(BRONZE.stats_columns)
    append_row(spark, settings)
    assert stats_of_newest_file(settings) == set(BRONZE.stats_columns)
    assert spark.read.format("delta").load(settings.table_path(BRONZE.name)).where(
        F.col("offset") == 7).count() == 2
