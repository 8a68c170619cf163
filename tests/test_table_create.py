"""Tables created with delta-rs from their DDL (`lakehouse.table_create`, what `ensure_tables`
does) are what Spark would have created: same schema (types, nullability) and partitioning,
the change data feed on exactly where declared, NOT NULL enforced by Spark's writes; concurrent
creators do not fail; a DDL it cannot map is an error."""

import threading
from datetime import date

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from lakehouse import delta_log
from lakehouse.settings import Settings
from lakehouse.table_create import create_if_missing, schema_of
from spark_jobs.tables import ALL_TABLES, CORRECTIONS_STATE, RECONCILED, ensure_tables


def test_spark_reads_and_writes_the_tables_as_declared(spark, tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lakehouse")})
    ensure_tables(spark, settings)
    ensure_tables(spark, settings)  # idempotent: no second commit
    for table in ALL_TABLES:
        assert delta_log.version(settings, table.name) == 0, table.name
        path = settings.table_path(table.name)
        assert spark.read.format("delta").load(path).schema == \
            spark.createDataFrame([], table.ddl).schema, table.name
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail.partitionColumns == [table.partition_by], table.name
        assert detail.properties.get("delta.enableChangeDataFeed") == \
            ("true" if table.change_data_feed else "false"), table.name

    # Spark enforces NOT NULL on a table it did not create.
    state = settings.table_path(CORRECTIONS_STATE.name)
    row = spark.createDataFrame([(date(2026, 1, 2), 1, 0, "full", None)],
                                "event_date DATE, bronze_version BIGINT, "
                                "reconciled_version BIGINT, mode STRING, run_id STRING")
    with pytest.raises(Exception, match="(?i)null"):
        row.withColumn("updated_at", F.lit(None).cast("timestamp")) \
            .write.format("delta").mode("append").save(state)
    # ... and writes the change feed where it is on.
    gold = settings.table_path(RECONCILED.name)
    spark.createDataFrame(
        [(date(2026, 1, 2), "2026-01-02 00:00:00", "2026-01-02 00:01:00", "k", 1, "1.5", "1.5",
          "1.5", "7", 0, "open", "2026-01-02 00:02:00")],
        "event_date DATE, ws STRING, we STRING, key STRING, event_count BIGINT, s STRING, "
        "mn STRING, mx STRING, fp STRING, revision INT, status STRING, u STRING",
    ).selectExpr(
        "event_date", "CAST(ws AS TIMESTAMP) window_start", "CAST(we AS TIMESTAMP) window_end",
        "key", "event_count", "CAST(s AS DECIMAL(38,6)) value_sum",
        "CAST(mn AS DECIMAL(38,6)) value_min", "CAST(mx AS DECIMAL(38,6)) value_max",
        "CAST(fp AS DECIMAL(38,0)) event_fingerprint", "revision", "status",
        "CAST(u AS TIMESTAMP) updated_at",
    ).write.format("delta").mode("append").save(gold)
    changes = spark.read.format("delta").option("readChangeFeed", "true") \
        .option("startingVersion", 1).load(gold).collect()
    assert [(r.key, r._change_type) for r in changes] == [("k", "insert")]


def test_concurrent_creators_of_one_table_do_not_fail(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lakehouse")})
    table = CORRECTIONS_STATE
    start, created, errors = threading.Barrier(6), [], []

    def create():
        start.wait()
        try:
            created.append(create_if_missing(settings, table.name, table.ddl,
                                             table.partition_by, {}))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and created.count(True) == 1
    assert delta_log.version(settings, table.name) == 0


def test_a_column_it_cannot_map_is_an_error():
    with pytest.raises(ValueError, match="unsupported type 'FLOAT' of column 'f'"):
        schema_of("a STRING NOT NULL, f FLOAT")
    with pytest.raises(ValueError, match="unsupported column definition"):
        schema_of("a STRING NOT NULL DEFAULT 'x'")
    fields = schema_of("d DECIMAL(38, 6) NOT NULL, t TIMESTAMP").fields
    assert [(f.name, f.type.type, f.nullable) for f in fields] == [
        ("d", "decimal(38,6)", False), ("t", "timestamp", True)]
