"""The Delta tables through Spark: creation, reads (a version, the change feed) and the
pipeline's tag on a block of commits. Names and columns are `lakehouse.tables.catalog`'s."""

from __future__ import annotations

import json
from contextlib import contextmanager

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import ALL_TABLES, BRONZE, Table
from lakehouse.tables.commit_tags import PIPELINE_TAG
from lakehouse.tables.generations import SPEC_PROPERTY, VERSION_PROPERTY


def ensure_tables(spark: SparkSession, settings: Settings) -> None:
    """Create every table that does not exist yet (idempotent; safe under concurrent runs of
    different tables, since each creation is one Delta commit)."""
    for table in ALL_TABLES:
        if delta_log.exists(settings, table.name):
            continue
        path = settings.table_path(table.name)
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(spark.createDataFrame([], table.ddl_for(settings.shape)).schema)
            .partitionedBy(*table.partition_columns)
        )
        if table.change_data_feed:
            builder = builder.property("delta.enableChangeDataFeed", "true")
        if table is BRONZE:  # the spec version the tables are created under
            builder = (builder.property(SPEC_PROPERTY, json.dumps(settings.results_inputs,
                                                                  sort_keys=True))
                       .property(VERSION_PROPERTY, settings.results_version))
        builder.execute()


def migrate_layout(spark: SparkSession, settings: Settings, table: Table) -> bool:
    """Rewrite a table created by an older release with other partition columns (before
    2026-11-25, `streaming_aggregates` was partitioned by date alone and MERGEd into with
    deletion vectors) into the catalog's layout, once, in one overwrite commit. Callers hold
    the table's writer lock. True when it rewrote."""
    found = delta_log.partition_columns(settings, table.name)
    if found is None or found == table.partition_columns:
        return False
    path = settings.table_path(table.name)
    rows = read_table(spark, settings, table).localCheckpoint(eager=True)
    (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .partitionBy(*table.partition_columns).save(path))
    print(f"{table.name}: rewritten, partitioned by {', '.join(table.partition_columns)} "
          f"(was {', '.join(found)})", flush=True)
    return True


def read_table(spark: SparkSession, settings: Settings, table: Table, version: int | None = None):
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(settings.table_path(table.name))



def read_changes(spark: SparkSession, settings: Settings, table: Table, first: int, last: int):
    """Delta Change Data Feed rows of commits `first`..`last` (inclusive)."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", first)
        .option("endingVersion", last)
        .load(settings.table_path(table.name))
    )


@contextmanager
def tagged_commits(spark: SparkSession, detail: str):
    key = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(key, f"{PIPELINE_TAG}:{detail}")
    try:
        yield
    finally:
        spark.conf.unset(key)
