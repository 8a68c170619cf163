"""The one way the pipeline commits to its Delta tables. Every commit of every writer (an ingest
batch, a catch-up, corrections, the replay, the redrive, the spec registry, maintenance, and the
tables' own creation and migrations) is one call on a `Writer`; nothing else in the product
calls Delta's write or commit APIs (`tests/unit/test_one_writer.py` holds it to that). A call:

- checks the writer's lock (its `Fence`: `checkpoint_lock`, `date_lock` or `registry_lock`) as
  its last step before the commit. What the commit writes from the driver (delta-rs: rows built
  or collected before the call) is checked after it was computed, milliseconds before the
  commit; a Spark write is checked before Spark computes and commits it;
- on an s3a:// root, hands the lock's fence to the commit itself: the session setting
  `spark.lakehouse.fence.<table path>` (`commit_log.fence_key`) for the call's duration, which
  Delta's log store there checks in the lock server's transaction that is the commit point
  (`lakehouse.tables.commit_log`). A lock lost while Spark writes (a pause, a broken
  connection, a takeover) so fails that commit itself: `WriterLockLost`, nothing committed;
- tags the commit (`userMetadata`: the writer, its run or batch) when the caller gives a tag; an
  idempotent append carries Delta's own (application id, version) (`app`);
- picks the engine: delta-rs from the driver for small data on a local root (milliseconds, no
  snapshot of the table rebuilt by Spark jobs), Spark everywhere else (on an object store
  Delta's log store takes one writing driver: Spark's, under the lock).

Whether a commit is already there (a re-run batch, a repeated run) is the caller's plan, read
once before it writes (`lakehouse.tables.batch_plan`, `commit_tags`)."""

from __future__ import annotations

import json
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.tables import commit_log, delta_log, local_writes
from lakehouse.tables.catalog import ALL_TABLES, BRONZE, Table
from lakehouse.tables.commit_tags import PIPELINE_TAG
from lakehouse.tables.generations import SPEC_PROPERTY, VERSION_PROPERTY
from lakehouse.tables.locks import Fence, LockUnavailable, WriterLockLost
from spark_jobs.tables import missing_columns, quoted, read_table, sql_string, table_ref

USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
# A `replaceWhere` overwrite's check that every written row matches its condition.
REPLACE_WHERE_CHECK = "spark.databricks.delta.replaceWhere.constraintCheck.enabled"
# Delta skips an append of no rows; a batch of only quarantined records still stamps bronze.
SKIP_EMPTY_COMMITS = "spark.databricks.delta.skipRecordingEmptyCommits"


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str):
    """`key` set to `value` in the session for the block's writes (Delta has no per-write option
    for it), unset after."""
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key)


_FENCED_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def _require_fenced_store(spark: SparkSession) -> None:
    """A session whose commits to s3a:// tables go through the fenced log store (`spark_conf`
    sets it for an s3a root; a session built otherwise, e.g. a Spark Connect server started for
    another root, would commit past the fence): checked once per session."""
    if spark in _FENCED_SESSIONS:
        return
    found = spark.conf.get(commit_log.SCHEME_KEY, None)
    if found != commit_log.LOG_STORE_CLASS:
        raise LockUnavailable(f"this Spark session commits to s3a:// tables through "
                              f"{found or 'Delta default log store'}, not the log store the "
                              f"writer locks fence ({commit_log.LOG_STORE_CLASS}): start it "
                              "with the project's settings for an s3a:// root "
                              "(spark_jobs.session.spark_conf)")
    _FENCED_SESSIONS.add(spark)


def tagged_commits(spark: SparkSession, detail: str):
    """The block's Delta commits carry `<PIPELINE_TAG>:<detail>` as their userMetadata."""
    return session_conf(spark, USER_METADATA, f"{PIPELINE_TAG}:{detail}")


def _name(table: Table | str) -> str:
    return table if isinstance(table, str) else table.name


@dataclass(frozen=True)
class Writer:
    """Commits to the tables under `settings`' root, by a writer holding the lock `fence` is
    of (the default `Fence`: a writer that holds none, as a table's creation)."""

    spark: SparkSession
    settings: Settings
    fence: Fence = field(default_factory=Fence)

    def path(self, table: Table | str) -> str:
        return self.settings.table_path(_name(table))

    @contextmanager
    def _fenced(self, table: Table | str, df: DataFrame | None = None):
        """The lock checked, then the block's commit to `table` fenced in the commit itself on
        an s3a:// root: the fence's tokens in the session setting the log store reads (in the
        writer's session and in `df`'s, the one Spark's write runs in), unset after; a commit
        it refused raises `WriterLockLost`. A lock without tokens (a file lock; no lock, as a
        table's creation) sets nothing."""
        self.fence.check()
        tokens = self.fence.tokens()
        if not tokens or storage.scheme(str(self.settings.root)) != "s3a":
            yield
            return
        key = commit_log.fence_key(self.path(table))
        sessions = [self.spark]
        if df is not None and df.sparkSession is not self.spark:
            sessions.append(df.sparkSession)
        for session in sessions:
            _require_fenced_store(session)
            session.conf.set(key, ",".join(tokens))
        try:
            yield
        except Exception as exc:
            refused = next((line.strip() for line in str(exc).splitlines()
                            if commit_log.LOST in line), None)
            if refused is None:
                raise
            raise WriterLockLost(f"{_name(table)}: the commit was refused: "
                                 f"{refused[:500]}") from exc
        finally:
            for session in sessions:
                session.conf.unset(key)

    # --- appends ---------------------------------------------------------------------------
    def append(self, df: DataFrame, table: Table | str, tag: str | None = None, *,
               app: tuple[str, int] | None = None, empty_commit: bool = False) -> None:
        """`df` appended in one Spark commit. `app` = (application id, version): nothing is
        written when the table records that version of the id or a newer one.
        `empty_commit`: commit even when `df` holds no row (Delta skips such an append)."""
        writer = df.write.format("delta").mode("append")
        if tag is not None:
            writer = writer.option("userMetadata", tag)
        if app is not None:
            writer = writer.option("txnAppId", app[0]).option("txnVersion", app[1])
        with self._fenced(table, df), (
                session_conf(self.spark, SKIP_EMPTY_COMMITS, "false") if empty_commit
                else nullcontext()):
            writer.save(self.path(table))

    def append_rows(self, table: Table, rows: list[dict],
                    app: tuple[str, int] | None = None) -> None:
        """`rows` (column -> value) appended in one commit: by delta-rs on a local root (a few
        milliseconds, where a Spark append of a row took 1-4 s here), else by Spark in the
        catalog's declared columns (a table created by an older release with more nullable
        columns still takes them). `app` as for `append`."""
        self.fence.check()
        if local_writes.append_rows(self.settings, table.name, rows, app):
            return
        schema = self.spark.createDataFrame([], table.ddl_for(self.settings.shape)).schema
        self.append(self.spark.createDataFrame(
            [tuple(r.get(f.name) for f in schema) for r in rows], schema), table, app=app)

    # --- overwrites ------------------------------------------------------------------------
    def replace(self, df: DataFrame, table: Table | str, where: str, tag: str | None = None, *,
                check: bool = True) -> None:
        """The rows of `table` matching `where` replaced by `df`, in one Spark commit (Delta's
        `replaceWhere`). `check=False`: `df` may hold rows outside `where` (they are added)."""
        writer = df.write.format("delta").mode("overwrite").option("replaceWhere", where)
        if tag is not None:
            writer = writer.option("userMetadata", tag)
        with self._fenced(table, df), (
                session_conf(self.spark, REPLACE_WHERE_CHECK, "false") if not check
                else nullcontext()):
            writer.save(self.path(table))

    def replace_date(self, table: Table, d: date, data: pa.Table | None) -> None:
        """Date `d`'s rows of `table` replaced by `data` (None: no rows), in one delta-rs commit
        from the driver, on a local root (`local_writes.replace_date`)."""
        self.fence.check()
        local_writes.replace_date(self.settings, table.name, d, data)

    def replace_partitions(self, opened, column: str, value: str, data: pa.Table, tag: str,
                           exact_ms: tuple[str, ...] = ()) -> None:
        """The partitions of `opened` (the table's delta-rs handle) where `column` = `value`
        replaced by `data`, in one delta-rs commit tagged `tag`, on a local root
        (`local_writes.replace_partitions`)."""
        self.fence.check()
        local_writes.replace_partitions(self.settings, opened, column, value, data, tag,
                                        exact_ms=exact_ms)

    def rewrite(self, df: DataFrame, table: Table) -> None:
        """All of `table` replaced by `df`, in the catalog's partitioning and `df`'s schema."""
        with self._fenced(table, df):
            (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
             .partitionBy(*table.partition_columns).save(self.path(table)))

    # --- DML and utilities (SQL: the same in a classic session and over Spark Connect) ------
    def merge(self, table: Table | str, source: DataFrame, on: str, clauses: str,
              tag: str | None = None) -> None:
        """`MERGE INTO <table> AS t USING <source> AS s ON <on> <clauses>`; `source` as a
        temporary view of this session, dropped afterwards."""
        view = f"merge_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            with self._fenced(table, source), (
                    session_conf(self.spark, USER_METADATA, tag) if tag is not None
                    else nullcontext()):
                self.spark.sql(f"MERGE INTO {table_ref(self.path(table))} AS t USING {view} "
                               f"AS s ON {on} {clauses}")
        finally:
            self.spark.catalog.dropTempView(view)

    def delete(self, table: Table | str, condition: str) -> None:
        """`table`'s rows matching `condition` deleted, in one commit."""
        with self._fenced(table):
            self.spark.sql(f"DELETE FROM {table_ref(self.path(table))} WHERE {condition}")

    def optimize(self, table: Table | str, where: str):
        """Bin-packing of the files in `where`'s partitions: OPTIMIZE's metrics row."""
        with self._fenced(table):
            return self.spark.sql(f"OPTIMIZE {table_ref(self.path(table))} WHERE {where}").first()

    def vacuum(self, table: Table | str, hours: float) -> None:
        """Files no longer referenced for longer than `hours` deleted."""
        with self._fenced(table):
            self.spark.sql(f"VACUUM {table_ref(self.path(table))} RETAIN {hours!r} HOURS")

    def alter(self, table: Table | str, change: str) -> None:
        """`ALTER TABLE <table> <change>`: one metadata commit."""
        with self._fenced(table):
            self.spark.sql(f"ALTER TABLE {table_ref(self.path(table))} {change}")

    def create(self, table: Table) -> None:
        """`table` created in the catalog's columns and partitioning, unless it exists."""
        properties = {}
        if table.change_data_feed:
            properties["delta.enableChangeDataFeed"] = "true"
        if table.stats_columns:
            properties[STATS_COLUMNS] = ",".join(table.stats_columns)
        if table is BRONZE:  # the spec version the tables are created under
            properties[SPEC_PROPERTY] = json.dumps(self.settings.results_inputs, sort_keys=True)
            properties[VERSION_PROPERTY] = self.settings.results_version
        with self._fenced(table):
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {table_ref(self.path(table))} "
                f"({table.ddl_for(self.settings.shape)}) USING delta "
                f"PARTITIONED BY ({', '.join(map(quoted, table.partition_columns))})"
                + (" TBLPROPERTIES ({})".format(", ".join(
                    f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items()))
                   if properties else ""))


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
    writer = Writer(spark, settings)
    with ThreadPoolExecutor(max_workers=len(missing), thread_name_prefix="ensure-tables") as pool:
        list(pool.map(writer.create, missing))  # raises the first error


def limit_stats(writer: Writer, table: Table) -> bool:
    """Give a table created before its `stats_columns` were declared the catalog's statistics
    columns (one property commit; later files only), by a writer holding the table's lock.
    True when it changed them."""
    found = delta_log.open_table(writer.settings, table.name)
    wanted = ",".join(table.stats_columns)
    if found is None or not wanted or found.metadata().configuration.get(STATS_COLUMNS) == wanted:
        return False
    writer.alter(table, f"SET TBLPROPERTIES ({sql_string(STATS_COLUMNS)} = {sql_string(wanted)})")
    return True


def migrate_layout(writer: Writer, table: Table) -> bool:
    """Rewrite a table created by an older release with other partition columns (before
    2026-11-25, `streaming_aggregates` was partitioned by date alone and MERGEd into with
    deletion vectors) into the catalog's layout, once, in one overwrite commit, by a writer
    holding the table's lock. True when it rewrote."""
    found = delta_log.partition_columns(writer.settings, table.name)
    if found is None or found == table.partition_columns:
        return False
    rows = read_table(writer.spark, writer.settings, table).localCheckpoint(eager=True)
    writer.rewrite(rows, table)
    print(f"{table.name}: rewritten, partitioned by {', '.join(table.partition_columns)} "
          f"(was {', '.join(found)})", flush=True)
    return True


def add_missing_columns(writer: Writer, table: Table) -> list[str]:
    """Add the catalog's columns a table created by an older release lacks (one ALTER TABLE
    commit; old rows read null in them; a DataFrame without them still appends), by a writer
    holding the table's lock. The names added."""
    missing = missing_columns(writer.spark, writer.settings, table)
    if missing:
        columns = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in missing)
        writer.alter(table, f"ADD COLUMNS ({columns})")
        print(f"{table.name}: columns added: {', '.join(f.name for f in missing)}", flush=True)
    return [f.name for f in missing]
