"""Tables of an older release gain this release's columns: a quarantine created before the
redrive existed its redrive columns (nullable, old rows null; the stream's append of a frame
without them still lands), bronze its `record_key_base64` (its change feed read across)."""

from datetime import UTC, date, datetime
from decimal import Decimal


def test_an_old_quarantine_gains_the_redrive_columns_and_still_takes_appends(spark, tmp_path):
    from lakehouse.config.settings import Settings
    from lakehouse.tables.catalog import QUARANTINE
    from spark_jobs.tables import missing_columns, table_ref
    from spark_jobs.writer import Writer, add_missing_columns, ensure_tables

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    old_ddl = QUARANTINE.ddl.split("redriven_at")[0].rstrip().rstrip(",")  # before 2026-11-27
    assert "redrive" not in old_ddl
    path = settings.table_path(QUARANTINE.name)
    spark.sql(f"CREATE TABLE {table_ref(path)} ({old_ddl}) USING delta "
              "PARTITIONED BY (quarantine_date)")
    now = datetime.now(UTC)
    row = ("invalid_json", None, "t", 0, 5, now, 3, None, "e30=", date(2026, 11, 27), now, 1)
    spark.createDataFrame([row], old_ddl).write.format("delta").mode("append").save(path)
    ensure_tables(spark, settings)  # creates the other tables, leaves this one as it is
    assert [f.name for f in missing_columns(spark, settings, QUARANTINE)] == [
        "redriven_at", "redrive_run_id", "redriven_to"]

    assert add_missing_columns(Writer(spark, settings), QUARANTINE) == [
        "redriven_at", "redrive_run_id", "redriven_to"]
    assert missing_columns(spark, settings, QUARANTINE) == []
    assert add_missing_columns(Writer(spark, settings), QUARANTINE) == []  # once
    # The stream's append: a frame of the old columns.
    spark.createDataFrame([(*row[:4], 6, *row[5:])], old_ddl).write.format("delta").mode(
        "append").save(path)
    rows = spark.read.format("delta").load(path).orderBy("offset").collect()
    assert [r.offset for r in rows] == [5, 6]
    assert all(r.redriven_at is None and r.redrive_run_id is None and r.redriven_to is None
               for r in rows)


def test_the_proof_counts_no_redriven_record_where_there_are_no_tables(spark, tmp_path):
    from lakehouse.config.settings import Settings
    from spark_jobs.redrive import redriven_counts
    from spark_jobs.writer import ensure_tables

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    d = date(2026, 11, 27)
    assert redriven_counts(spark, settings, [d]) == {"2026-11-27": 0}
    ensure_tables(spark, settings)
    assert redriven_counts(spark, settings, [d]) == {"2026-11-27": 0}


def test_an_old_bronze_gains_the_exact_key_column_and_its_change_feed_reads_across(spark,
                                                                                 tmp_path):
    """Bronze of a release before `record_key_base64`: the stream's start adds the column; rows
    before it read null there, and the late lane's change-feed read spans the ALTER."""
    from lakehouse.config.settings import Settings
    from lakehouse.tables.catalog import BRONZE
    from lakehouse.tables.reads import read
    from spark_jobs.tables import missing_columns, table_ref
    from spark_jobs.writer import Writer, add_missing_columns

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    old_ddl = BRONZE.ddl.replace(", record_key_base64 STRING", "")
    assert old_ddl != BRONZE.ddl
    path = settings.table_path(BRONZE.name)
    spark.sql(f"CREATE TABLE {table_ref(path)} ({old_ddl}) USING delta PARTITIONED BY "
              "(event_date) TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    at = datetime(2026, 11, 27, 8, tzinfo=UTC)
    row = ("e-1", "k", at, at, Decimal(1), None, "k", "events", 0, 7, at, date(2026, 11, 27),
           at, 3)
    spark.createDataFrame([row], old_ddl).write.format("delta").mode("append").save(path)
    assert add_missing_columns(Writer(spark, settings), BRONZE) == ["record_key_base64"]
    assert missing_columns(spark, settings, BRONZE) == []
    new = ("e-2", "k", at, at, Decimal(2), None, None, "/w==", "events", 0, 8, at, date(2026, 11, 27),
           at, 4)
    spark.createDataFrame([new], BRONZE.ddl).write.format("delta").mode("append").save(path)
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", 0).load(path).where("_change_type = 'insert'")
               .orderBy("offset").collect())
    assert [(c.offset, c.record_key, c.record_key_base64) for c in changes] == [
        (7, "k", None), (8, None, "/w==")]
    assert read(settings, BRONZE.name).num_rows == 2  # delta-rs reads it
