"""The Delta tables through Spark: creation, reads (a version, the change feed) and the
pipeline's tag on a block of commits. Names and columns are `lakehouse.tables.catalog`'s."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import date, datetime
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import ALL_TABLES, BRONZE, Table
from lakehouse.tables.commit_tags import PIPELINE_TAG
from lakehouse.tables.generations import SPEC_PROPERTY, VERSION_PROPERTY
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


def merge_into(spark: SparkSession, path: str, source: DataFrame, on: str, clauses: str) -> None:
    """`MERGE INTO <path> AS t USING <source> AS s ON <on> <clauses>`; `source` as a temporary
    view of this session, dropped afterwards."""
    view = f"merge_source_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        spark.sql(f"MERGE INTO {table_ref(path)} AS t USING {view} AS s ON {on} {clauses}")
    finally:
        spark.catalog.dropTempView(view)


STATS_COLUMNS = "delta.dataSkippingStatsColumns"
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


def ensure_tables(spark: SparkSession, settings: Settings) -> None:
    """Create every table that does not exist yet (idempotent; safe under concurrent runs of
    different tables, since each creation is one Delta commit).

    The missing tables are created side by side, one thread each: a creation is driver round
    trips and Delta log work, not cores, so a new root's eleven took 2.88 s instead of 11.28 s
    in a warm JVM (medians of 4, interleaved, loaded machine; 2026-11-28, commit
    c8cb13d): the first run of every root, and each test's new root."""
    missing = [t for t in ALL_TABLES if not delta_log.exists(settings, t.name)]
    if not missing:
        return
    with ThreadPoolExecutor(max_workers=len(missing), thread_name_prefix="ensure-tables") as pool:
        list(pool.map(lambda t: _create(spark, settings, t), missing))  # raises the first error


def _create(spark: SparkSession, settings: Settings, table: Table) -> None:
    properties = {}
    if table.change_data_feed:
        properties["delta.enableChangeDataFeed"] = "true"
    if table.stats_columns:
        properties[STATS_COLUMNS] = ",".join(table.stats_columns)
    if table is BRONZE:  # the spec version the tables are created under
        properties[SPEC_PROPERTY] = json.dumps(settings.results_inputs, sort_keys=True)
        properties[VERSION_PROPERTY] = settings.results_version
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {table_ref(settings.table_path(table.name))} "
        f"({table.ddl_for(settings.shape)}) USING delta "
        f"PARTITIONED BY ({', '.join(map(quoted, table.partition_columns))})"
        + (" TBLPROPERTIES ({})".format(", ".join(
            f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items()))
           if properties else ""))


def limit_stats(spark: SparkSession, settings: Settings, table: Table) -> bool:
    """Give a table created before its `stats_columns` were declared the catalog's statistics
    columns (one property commit; later files only). Callers hold the table's writer lock.
    True when it changed them."""
    found = delta_log.open_table(settings, table.name)
    wanted = ",".join(table.stats_columns)
    if found is None or not wanted or found.metadata().configuration.get(STATS_COLUMNS) == wanted:
        return False
    spark.sql(f"ALTER TABLE {table_ref(settings.table_path(table.name))} SET TBLPROPERTIES "
              f"({sql_string(STATS_COLUMNS)} = {sql_string(wanted)})")
    return True


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


def missing_columns(spark: SparkSession, settings: Settings, table: Table) -> list:
    """The catalog's columns of `table` that the existing table lacks (fields of a StructType;
    none when the table does not exist)."""
    found = delta_log.open_table(settings, table.name)
    if found is None:
        return []
    have = {f.name for f in found.schema().fields}
    target = spark.createDataFrame([], table.ddl_for(settings.shape)).schema
    return [f for f in target.fields if f.name not in have]


def add_missing_columns(spark: SparkSession, settings: Settings, table: Table) -> list[str]:
    """Add the catalog's columns a table created by an older release lacks (one ALTER TABLE
    commit; old rows read null in them; a DataFrame without them still appends). Callers hold
    the table's writer lock. The names added."""
    missing = missing_columns(spark, settings, table)
    if missing:
        columns = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE {table_ref(settings.table_path(table.name))} "
                  f"ADD COLUMNS ({columns})")
        print(f"{table.name}: columns added: {', '.join(f.name for f in missing)}", flush=True)
    return [f.name for f in missing]


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


USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str):
    """`key` set to `value` in the session for the block's writes (Delta has no per-write option
    for it), unset after."""
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key)


def tagged_commits(spark: SparkSession, detail: str):
    """The block's Delta commits carry `<PIPELINE_TAG>:<detail>` as their userMetadata."""
    return session_conf(spark, USER_METADATA, f"{PIPELINE_TAG}:{detail}")
