"""The Delta tables through Spark: reads (a version, a date, the change feed), the SQL forms of
a table's name and values, and the retry of a run that met another writer's commit. Names and
columns are `lakehouse.tables.catalog`'s; every commit goes through `spark_jobs.writer`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import Table
from lakehouse.tables.reads import DRIVER_ROWS_MAX, read
from lakehouse.tables.stats import partition_rows

# Delta's DML and utilities in their SQL forms on a path table (`table_ref`): they run
# the same in a classic session and over Spark Connect, where Delta's Python `DeltaTable` needs
# a Delta Connect plugin on the server (CONNECT_INVALID_PLAN.NO_HANDLER_FOR_EXTENSION without).


def table_ref(path: str) -> str:
    """A Delta table by its path, for SQL."""
    return "delta.`{}`".format(path.replace("`", "``"))


def quoted(name: str) -> str:
    return "`{}`".format(name.replace("`", "``"))


def sql_string(text: str) -> str:
    return "'{}'".format(text.replace("\\", "\\\\").replace("'", "\\'"))


T = TypeVar("T")

# Delta's optimistic concurrency: another writer committed to the same files meanwhile.
_CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException",
              "ConcurrentDeleteDeleteException", "ConcurrentTransactionException",
              "ProtocolChangedException", "MetadataChangedException", "DELTA_CONCURRENT_")
MAX_ATTEMPTS = 3


def is_conflict(exc: BaseException) -> bool:
    return any(name in f"{type(exc).__name__} {exc}" for name in _CONFLICTS)


def retry_on_conflict(attempt: Callable[[], T], on_retry: Callable[[BaseException], None]
                      = lambda exc: None) -> T:
    """`attempt()` again (at most MAX_ATTEMPTS times in all) while it fails on a concurrent
    Delta commit; each try recomputes from the tables as they are then. Any other error, or a
    conflict on the last try, is raised."""
    for n in range(1, MAX_ATTEMPTS + 1):
        try:
            return attempt()
        except Exception as exc:
            if not is_conflict(exc) or n == MAX_ATTEMPTS:
                raise
            on_retry(exc)
    raise AssertionError("unreachable")


def missing_columns(spark: SparkSession, settings: Settings, table: Table) -> list:
    """The catalog's columns of `table` that the existing table lacks (fields of a StructType;
    none when the table does not exist)."""
    found = delta_log.open_table(settings, table.name)
    if found is None:
        return []
    have = {f.name for f in found.schema().fields}
    target = spark.createDataFrame([], table.ddl_for(settings.shape)).schema
    return [f for f in target.fields if f.name not in have]


def read_table(spark: SparkSession, settings: Settings, table: Table, version: int | None = None):
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(settings.table_path(table.name))


def read_date(spark: SparkSession, settings: Settings, table: Table, d: date) -> DataFrame:
    """`table`'s rows of event date `d` (its partition column). A partition of at most
    DRIVER_ROWS_MAX rows by the log's statistics, on a local root, is read with delta-rs and
    handed to Spark as Arrow: no snapshot of the table rebuilt by Spark jobs (1-3 s per table in
    a one-run process). Others through Spark's Delta reader."""
    if settings.local_root is not None:
        rows = partition_rows(settings, table.name, table.partition_by, d)
        if rows is not None and rows <= DRIVER_ROWS_MAX:
            data = read(settings, table.name, d)
            # The schema given: over Connect an empty table's cannot be inferred.
            return spark.createDataFrame(data, schema=from_arrow_schema(data.schema))
    return read_table(spark, settings, table).where(F.col(table.partition_by) == F.lit(d))


def date_rows(spark: SparkSession, settings: Settings, table: Table, d: date,
              version: int | None = None, above: tuple[str, datetime] | None = None) -> int:
    """Rows of `table` (at `version`) in date `d`'s partition, with `above` = (column, bound)
    only those whose timestamp column is > bound: from the log's file statistics when they tell
    (`partition_rows`: no Spark job), else counted by a query."""
    rows = partition_rows(settings, table.name, table.partition_by, d, version, above)
    if rows is not None:
        return rows
    df = read_table(spark, settings, table, version).where(F.col(table.partition_by) == F.lit(d))
    if above is not None:
        df = df.where(F.col(above[0]) > F.lit(above[1]))
    return df.count()


def read_changes(spark: SparkSession, settings: Settings, table: Table, first: int, last: int):
    """Delta Change Data Feed rows of commits `first`..`last` (inclusive)."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", first)
        .option("endingVersion", last)
        .load(settings.table_path(table.name))
    )
