"""The fast path: one checkpointed Structured Streaming query, one pass per event.

The `ingest` query is the stream's only Kafka consumer. Each micro-batch classifies its records
once (cached) and, from that one classification, writes:

- `quarantined_events`: malformed records with a reason (only when there are some);
- `late_events`: valid events at or below the batch's watermark (only when there are some);
- `bronze_events`: every valid event, one commit stamped with the batch's Kafka end offsets,
  the query and batch id, and the watermark the batch used and the one after it;
- `streaming_aggregates`: the windows of the events that count (valid, above the watermark,
  first copy of their event_id among the events still above it), folded into the open windows
  and written in place of the open partitions by one commit that also lands the windows the new
  watermark closes in their final partitions (`publish_windows`).

The watermark is explicit and comes from committed state: the watermark a batch judges
lateness by is the `next_watermark_ms` stamped on the previous bronze stream commit
(max event time so far minus WATERMARK_DELAY). So the late lane is exact by construction (it is
the predicate that excludes events from the aggregates), and a re-run batch, or a new
checkpoint, computes the same watermark. No Spark stateful operator is involved.

Exactly once: a batch can be re-run after a crash (foreachBatch is at-least-once). The appends
are found by their tag (query id + batch id in the commit's userMetadata; the stream is the one
writer of these tables, under the checkpoint lock), and so is the aggregates commit. A re-run
batch therefore writes nothing twice.

It runs with `trigger(availableNow=True)` (Dagster catch-up) or a processing-time trigger (the
service); both use the checkpoint under `$LAKEHOUSE_ROOT/_checkpoints/ingest`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery

from lakehouse.config.settings import Settings
from lakehouse.events.schema_registry import SchemasChanged, registered, with_registry_schemas
from lakehouse.kafka.admin import topic_id, topic_offsets
from lakehouse.tables import checkpoints as ckpt
from lakehouse.tables import delta_log
from lakehouse.tables.batch_plan import RECENT_COMMITS, BatchPlan, tagged
from lakehouse.tables.catalog import BRONZE, INGEST_QUERY, LATE, OPEN, QUARANTINE, SKIPPED, STREAMING
from lakehouse.tables.commit_tags import (
    StreamCommit,
    batch_tag,
    newest_stream_commit,
    stream_commit_of,
)
from lakehouse.tables.generations import pending_change
from lakehouse.tables.local_writes import partition_rows_of, plain_table
from lakehouse.tables.locks import Fence, checkpoint_lock
from lakehouse.tables.progress_reports import BatchReport, as_dict
from lakehouse.tables.reads import DRIVER_ROWS_MAX
from spark_jobs.generations import apply_spec
from spark_jobs.progress import record_progress
from spark_jobs.recent_ids import CHUNK_COLUMNS, RecentIds, free_checkpointed
from spark_jobs.tables import read_changes, read_table, sql_string
from spark_jobs.transforms.avro import schema_id
from spark_jobs.transforms.ingest import counted_events, fold_into_open, late_projection, next_watermark_ms
from spark_jobs.transforms.parse import classify, quarantine_projection, valid_columns
from spark_jobs.transforms.windows import aggregate_windows
from spark_jobs.writer import Writer, add_missing_columns, ensure_tables, limit_stats, migrate_layout

# `streaming_aggregates`' timestamps on whole milliseconds (the window grid, the watermark):
# their file statistics are exact when the driver writes the table (`replace_partitions`).
WHOLE_MS_COLUMNS = ("window_start", "window_end", "watermark")
# How Spark says a locally checkpointed block is gone (its executor died).
LOST_BLOCK = "Checkpoint block"


@dataclass
class Trigger:
    """`available_now` for a catch-up run, else a processing-time interval."""

    available_now: bool = True
    interval: str = "10 seconds"

    def apply(self, writer):
        if self.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=self.interval)


@dataclass
class _Query:
    """Per-query facts resolved lazily inside foreachBatch."""

    spark: SparkSession
    checkpoint: str
    topic_id: str | None = None
    fence: Fence = field(default_factory=Fence)  # checked before every commit of a batch
    _app_id: str | None = field(default=None)
    recent: RecentIds = field(default_factory=RecentIds)

    @property
    def app_id(self) -> str:
        # The query's id from its checkpoint: a new checkpoint is a new id, so its batch ids
        # are never mistaken for those of commits made before.
        if self._app_id is None:
            self._app_id = ckpt.query_id(self.checkpoint)
        return self._app_id


# ---------------------------------------------------------------------------------------------
# Where the query starts, and its source
# ---------------------------------------------------------------------------------------------
class TopicReplaced(RuntimeError):
    """The topic bronze was ingested from is gone, and one of the same name stands in its
    place: its offsets start again, so records at offsets bronze already holds would be
    skipped."""


def check_topic(settings: Settings) -> str | None:
    """The topic's id, checked against the one stamped on bronze's newest stream commit (a
    stream commit without one, from an older release, is taken as it is)."""
    current = topic_id(settings)
    if current is None:
        raise RuntimeError(f"topic {settings.events_topic!r} does not exist")
    previous = newest_stream_commit(settings)
    if previous is not None and previous.topic_id and previous.topic_id != current:
        raise TopicReplaced(
            f"topic {settings.events_topic!r} was deleted and re-created: its id is now {current}, "
            f"bronze (version {previous.version}) was ingested from topic id {previous.topic_id}. "
            "Its offsets restart at 0, so the stream would skip records at offsets bronze "
            "already holds. Refusing to start: ingest the new topic into a new LAKEHOUSE_ROOT, "
            "or restore the old topic.")
    return current


def start_positions(settings: Settings) -> dict[int, int | None]:
    """Where a query with a new checkpoint starts, per partition: the Kafka position stamped on
    bronze's newest stream commit, else (None: a new instance, a partition the stream has not
    read) the earliest retained offset. So a reset or lost checkpoint never ingests a record
    twice and misses none produced meanwhile."""
    position = newest_stream_commit(settings)
    ends = position.end_offsets if position is not None else {}
    return {p: ends.get(p) for p in sorted({*ends, *(o.partition for o in topic_offsets(settings))})}


def starting_offsets(positions: dict[int, int | None], settings: Settings,
                     skipped: Collection[int] = ()) -> str:
    """`startingOffsets` for a new checkpoint (-2: the earliest retained offset, also for the
    `skipped` partitions); Spark ignores it once the checkpoint has offsets."""
    if not positions:
        return "earliest"
    return json.dumps({settings.events_topic: {
        str(p): -2 if o is None or p in skipped else o for p, o in positions.items()}})


class DataLost(RuntimeError):
    """Retention deleted records the stream had not read yet."""


def retention_gaps(settings: Settings, positions: dict[int, int | None]
                   ) -> dict[int, tuple[int, int]]:
    """Per partition, [position, earliest retained offset) when retention has passed the
    stream's position."""
    earliest = {o.partition: o.earliest for o in topic_offsets(settings)}
    return {p: (o, earliest[p]) for p, o in positions.items()
            if o is not None and p in earliest and o < earliest[p]}


def handle_data_loss(writer: Writer, gaps: dict[int, tuple[int, int]]) -> None:
    """ON_DATA_LOSS=fail: refuse to start, naming the ranges. skip_and_record: record them in
    `skipped_offsets` (once, however often the start is retried)."""
    spark, settings = writer.spark, writer.settings
    ranges = ", ".join(f"partition {p}: offsets {a}-{b - 1} ({b - a} records)"
                       for p, (a, b) in sorted(gaps.items()))
    if settings.on_data_loss != "skip_and_record":
        raise DataLost(
            f"retention deleted records of topic {settings.events_topic!r} before the stream "
            f"read them: {ranges}. Nothing was skipped. To go on from the earliest retained "
            "offsets, set ON_DATA_LOSS=skip_and_record: the ranges are recorded in "
            "skipped_offsets, and the dates they may belong to are never reported as proven.")
    known = {(r.partition, r.from_offset) for r in read_table(spark, settings, SKIPPED)
             .where(F.col("topic") == settings.events_topic)
             .select("partition", "from_offset").collect()}
    now = datetime.now(UTC)
    rows = [(settings.events_topic, p, a, b, b - a, now, now.date(), "retention")
            for p, (a, b) in sorted(gaps.items()) if (p, a) not in known]
    if rows:
        writer.append(spark.createDataFrame(rows, SKIPPED.ddl), SKIPPED)
    print(f"warning: skipped records deleted by retention ({ranges}); recorded in "
          "skipped_offsets (ON_DATA_LOSS=skip_and_record)", file=sys.stderr, flush=True)


def drop_orphans(writer: Writer, positions: dict[int, int | None]) -> None:
    """Before a new checkpoint's first batch: delete the quarantine and late rows at or beyond
    the start positions (all of a partition no stream commit has read). They can only be
    orphans of a batch that crashed before its bronze commit (bronze's commit is a batch's last
    append, and it stamps the position), and the new checkpoint reads those records again under
    new tags: without this they would land twice."""
    if not positions:
        return
    beyond = " OR ".join(f"(`partition` = {p}" + ("" if o is None else f" AND `offset` >= {o}")
                         + ")" for p, o in positions.items())
    for table in (QUARANTINE, LATE):
        found = delta_log.open_table(writer.settings, table.name)
        if found is None or not found.file_uris():
            continue  # no row at all (a new root): nothing to delete, and no Delta job for it
        writer.delete(table, f"topic = {sql_string(writer.settings.events_topic)} AND ({beyond})")


def complete_pending_aggregates(writer: Writer) -> bool:
    """Before a new checkpoint's first batch: add bronze's newest stream batch into
    `streaming_aggregates` if its aggregates commit was never made (the runner died between the
    batch's bronze commit and that commit, then the checkpoint was lost). The new checkpoint starts after
    that batch's offsets, so nothing else would ever add it: the fast path would miss it for
    good. Its rows are the bronze commit's own (Change Data Feed of that one version), judged
    by the watermark stamped on it, deduplicated against bronze before it, exactly as the batch
    would have been; the commit's tag makes a repeat a no-op. True when it published."""
    spark, settings = writer.spark, writer.settings
    commit = newest_stream_commit(settings)
    if commit is None or commit.query is None or commit.batch_id is None:
        return False
    tag = (commit.query, commit.batch_id)
    if tagged(delta_log.commits(settings, STREAMING.name, RECENT_COMMITS), *tag):
        return False
    wm = F.timestamp_millis(F.lit(commit.watermark_ms))
    rows = (read_changes(spark, settings, BRONZE, commit.version, commit.version)
            .where(F.col("_change_type") == "insert").select(*valid_columns(settings.shape)))
    on_time = rows.where(F.col("event_time") > wm)
    dates = sorted(r.event_date for r in on_time.select("event_date").distinct().collect())
    earlier = (_bronze_above(spark, settings, commit.version - 1, commit.watermark_ms)
               if commit.version > 0 and newest_stream_commit(settings, commit.version - 1)
               else None)
    deltas = (aggregate_windows(counted_events(on_time, earlier, settings.shape), settings)
              if dates else None)
    publish_windows(writer, deltas, commit, commit.batch_id)
    print(f"completed the aggregates of ingest batch {commit.batch_id} (bronze version "
          f"{commit.version}): their commit had not been made", file=sys.stderr, flush=True)
    return True


def kafka_source(spark: SparkSession, settings: Settings, start: str = "earliest") -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_options)
        .option("subscribe", settings.events_topic)
        .option("startingOffsets", start)
        # Records deleted by retention before the stream read them fail the query loudly.
        .option("failOnDataLoss", "true")
        .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
        .load()
    )


# ---------------------------------------------------------------------------------------------
# One micro-batch
# ---------------------------------------------------------------------------------------------
def _label(spark: SparkSession, what: str) -> None:
    """Name the Spark jobs that follow (`make profile` groups them by this)."""
    spark.sparkContext.setJobDescription(f"ingest:{what}")


def _quarantined_by(spark: SparkSession, settings: Settings, batch_id: int, first_day: date,
                    last_day: date) -> DataFrame:
    """(partition, offset) of the records batch `batch_id` quarantined, read from the
    quarantine's partitions (dates of the Kafka timestamps) its records fall in."""
    return (read_table(spark, settings, QUARANTINE)
            .where(F.col("quarantine_date").between(first_day, last_day)
                   & (F.col("topic") == settings.events_topic)
                   & (F.col("bronze_batch_id") == batch_id))
            .select("partition", "offset"))


def publish_windows(writer: Writer, deltas: DataFrame | None, commit: StreamCommit,
                    batch_id: int, published: bool | None = None,
                    on_time: int | None = None) -> None:
    """Publish the batch into `streaming_aggregates` in one commit: its window deltas added into
    the open windows, and the windows the next watermark closes marked final.

    No MERGE: the table is partitioned by (event_date, status), and every window the batch can
    change is open (its events lie above the watermark, so its end does too). The open
    partitions (a few minutes of windows) are read, folded with the deltas, and written back in
    their place by a `replaceWhere` on the partition column: Delta removes the open files by
    their partition values (no scan, no deletion vectors) and adds the new open rows, and the
    rows that closed land in their `final` partition, never rewritten by the stream again.

    Exactly once: the stream is the one writer (under the checkpoint lock), and the commit
    carries the batch's tag; a re-run batch finds it and publishes nothing twice (`published`:
    whether it is there, when the caller has read the log already; `on_time`: the batch's
    on-time records, a bound of the rows `deltas` holds; None: not known, Spark writes)."""
    spark, settings = writer.spark, writer.settings
    window_ms = int(settings.window_size.total_seconds() * 1000)
    closes = commit.next_watermark_ms // window_ms > commit.watermark_ms // window_ms
    if deltas is None and not closes:
        return  # nothing added, and no window end in (watermark, next watermark]
    if published is None:
        published = tagged(delta_log.commits(settings, STREAMING.name, RECENT_COMMITS),
                           commit.query, batch_id)
    if published:
        return
    _label(spark, "aggregates")
    tag = batch_tag(commit.query, batch_id)
    table = delta_log.open_table(settings, STREAMING.name) if settings.local_root else None
    # On a local root, when the open rows and the batch's windows (at most one per on-time
    # record) fit DRIVER_ROWS_MAX: the open rows read and the commit made from the driver
    # (delta-rs, the table's log opened once), the fold and the batch's windows computed by one
    # Spark job that returns the rows.
    rows = (partition_rows_of(table, "status", OPEN, DRIVER_ROWS_MAX - on_time)
            if on_time is not None and plain_table(settings, table) else None)
    if rows is not None:
        open_rows = spark.createDataFrame(rows, schema=from_arrow_schema(rows.schema))
        published = fold_into_open(open_rows, deltas, settings.shape, commit, batch_id)
        writer.replace_partitions(table, "status", OPEN, published.toArrow(), tag,
                                  exact_ms=WHOLE_MS_COLUMNS)
        return
    open_rows = read_table(spark, settings, STREAMING).where(F.col("status") == OPEN)
    published = fold_into_open(open_rows, deltas, settings.shape, commit, batch_id)
    # The rows that closed go to their final partitions in the same commit: the overwrite's
    # check that every written row matches the condition is off for this write.
    writer.replace(published, STREAMING, f"status = '{OPEN}'", tag, check=False)


def _bronze_above(spark: SparkSession, settings: Settings, version: int,
                  watermark_ms: int) -> DataFrame:
    """Bronze's rows above the watermark at a pinned version (a recomputation after the batch's
    own bronze append, should a block be lost, reads the same rows)."""
    wm = F.timestamp_millis(F.lit(watermark_ms))
    return (spark.read.format("delta").option("versionAsOf", version)
            .load(settings.table_path(BRONZE.name))
            .where((F.col("event_date") >= F.to_date(wm)) & (F.col("event_time") > wm))
            .select("event_date", "event_id", "event_time"))


def _earlier_ids(spark: SparkSession, settings: Settings, recent: RecentIds,
                 previous: StreamCommit | None, earlier_version: int,
                 watermark_ms: int) -> DataFrame | None:
    """(event_date, event_id) of the copies earlier batches landed above the watermark: from
    the recent-id index (rebuilt from bronze when it does not stand for the previous stream
    commit) or, for a re-run batch or a catch-up, from bronze at the version before this batch.
    None before the stream's first commit (nothing earlier counts)."""
    if earlier_version < 0:
        return None
    if previous is None or not recent.keep:
        return _bronze_above(spark, settings, earlier_version, watermark_ms)
    if not recent.holds(previous.version):
        # Every event time so far is at most the previous next watermark plus the delay.
        delay_ms = int(settings.watermark_delay.total_seconds() * 1000)
        recent.rebuild(_bronze_above(spark, settings, earlier_version, watermark_ms),
                       previous.version, previous.next_watermark_ms + delay_ms)
    return recent.lookup(watermark_ms)


def ingest_batch(settings: Settings, query: _Query) -> Callable[[DataFrame, int], None]:
    """The micro-batch, top to bottom: where it stands (a re-run finds its bronze commit), one
    job that classifies and caches the batch and counts what the writes depend on, the appends
    (quarantine, late lane, bronze last: its commit stamps the position), the batch's ids kept
    for the next batches' dedup, then its windows published in one commit."""
    shape = settings.shape
    # An Avro spec's registry: the batch's unknown schema ids are asked about before it writes.
    from_registry = shape.avro is not None and shape.avro.registry is not None
    unknown_ids = ([F.array_sort(F.collect_set(F.when(
        F.col("reason") == "unknown_schema_id", schema_id(F.col("__raw_value"))))
    ).alias("unknown_ids")] if from_registry else [])

    def run(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        # This batch's session is the query's own: adaptive execution would split each
        # shuffle into a job of its own (twice the jobs of a small batch, for nothing to
        # coalesce at a few shuffle partitions).
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        writer = Writer(spark, settings, query.fence)
        app = query.app_id
        # The batch's end offsets, from its write-ahead log entry: they stamp the bronze commit.
        ends = (ckpt.batch_offsets(query.checkpoint, batch_id).sources[0] or {}).get(
            settings.events_topic) or {}
        # Where the batch stands, from the logs, read once (a re-run finds its bronze commit).
        plan = BatchPlan.read(settings, app, batch_id)
        done, previous = plan.done, plan.previous
        watermark_ms, earlier_version = plan.watermark_ms, plan.earlier_version
        if done is not None:  # a re-run whose appends all committed (bronze is the last)
            query.recent.clear()
        wm = F.timestamp_millis(F.lit(watermark_ms))
        stamp = [F.current_timestamp().alias("ingested_at"),
                 F.lit(batch_id).cast("long").alias("bronze_batch_id")]

        _label(spark, "classify")
        # `batch` is already classified (in the query's plan: built once, not per batch).
        classified = batch.persist()
        chunk = None
        try:
            valid = classified.where(F.col("reason").isNull()).select(*valid_columns(shape))
            is_valid, is_late = F.col("reason").isNull(), F.col("event_time") <= wm
            # One job: builds the cache and answers every question the writes depend on.
            facts = classified.agg(
                F.count(F.when(~is_valid, 1)).alias("bad"),
                F.count(F.when(is_valid & is_late, 1)).alias("late"),
                F.count(F.when(is_valid & ~is_late, 1)).alias("on_time"),
                F.max(F.when(is_valid, F.unix_millis("event_time"))).alias("newest_ms"),
                # The quarantine's partitions the batch's records fall in.
                F.min(F.to_date("kafka_timestamp")).alias("first_day"),
                F.max(F.to_date("kafka_timestamp")).alias("last_day"),
                *unknown_ids,
            ).first()
            if not (facts.bad or facts.late or facts.on_time):
                # No record (a new checkpoint's first batch at the end of the topic, or only
                # transaction markers): nothing to write, and Delta commits no empty append.
                # Bronze's stamped position stays valid: nothing visible lies past it.
                return
            commit = done or StreamCommit(
                version=-1, end_offsets={int(p): int(o) for p, o in ends.items()},
                query=app, batch_id=batch_id, watermark_ms=watermark_ms,
                next_watermark_ms=next_watermark_ms(watermark_ms, facts.newest_ms, settings),
                late=facts.late, quarantined=facts.bad, topic_id=query.topic_id)

            # A re-run after its first attempt's quarantine commit (a crash before bronze's).
            # Only a registry changes a record's verdict between attempts (an id registered in
            # between); without one, a re-run that finds no bad record has none committed.
            quarantined_before = done is None and bool(facts.bad or from_registry) and \
                plan.appended(settings, QUARANTINE.name)
            if from_registry and done is None and facts.unknown_ids and not quarantined_before:
                # Before any write: ids registered since the query started are decoded, not
                # quarantined; the runner restarts the query with them and the batch re-runs.
                if known := registered(shape.avro, facts.unknown_ids):
                    raise SchemasChanged(
                        f"{settings.pipeline}: ingest batch {batch_id}: schema ids {known} were "
                        f"registered under subject {shape.avro.registry.subject} after the "
                        "query started; restarting it with the registry's schemas")
            if done is None:
                tag = batch_tag(app, batch_id)
                if quarantined_before:
                    # The first attempt's verdicts stand: a record it quarantined under a schema
                    # id registered since then never also lands in the late lane or bronze.
                    taken = _quarantined_by(spark, settings, batch_id, facts.first_day,
                                            facts.last_day)
                    valid = valid.join(F.broadcast(taken), ["partition", "offset"], "left_anti")
                elif facts.bad:
                    _label(spark, "quarantine")
                    bad = quarantine_projection(classified.where(~is_valid), settings)
                    writer.append(bad.select("*", *stamp), QUARANTINE, tag)
                if facts.late and not plan.appended(settings, LATE.name):
                    _label(spark, "late")
                    writer.append(late_projection(valid.where(is_late), settings, watermark_ms,
                                                  batch_id), LATE, tag)
                _label(spark, "bronze")
                # Last of the appends: its commit says the batch's appends are all done. A batch
                # of only quarantined records still stamps its position: an empty commit.
                writer.append(valid.select("*", *stamp), BRONZE, commit.metadata(),
                              empty_commit=not (facts.late or facts.on_time))
                commit = stream_commit_of(settings, app, batch_id, plan.bronze_version)
                if commit is None:
                    raise RuntimeError(f"bronze commit of ingest batch {batch_id} not found "
                                       "after appending it: another writer on bronze?")

            on_time = valid.where(~is_late)
            if facts.on_time and query.recent.keep and done is None:
                _label(spark, "dedup")
                # The batch's ids, cut from its lineage: the next batches' dedup index.
                chunk = on_time.select(*CHUNK_COLUMNS).localCheckpoint(eager=True)

            def publish(earlier: DataFrame | None, published: bool | None) -> None:
                deltas = (aggregate_windows(counted_events(on_time, earlier, shape), settings)
                          if facts.on_time else None)
                publish_windows(writer, deltas, commit, batch_id, published, facts.on_time)

            earlier = (_earlier_ids(spark, settings, query.recent, previous, earlier_version,
                                    watermark_ms) if facts.on_time else None)
            from_index = earlier is not None and previous is not None and query.recent.keep
            try:
                publish(earlier, plan.published)
            except Exception as exc:
                if not from_index or LOST_BLOCK not in str(exc):
                    raise
                # A lost block of the index (an executor gone): once more, from bronze. The
                # publication is one commit, found by its tag (read again) should it have landed.
                query.recent.clear()
                publish(_bronze_above(spark, settings, earlier_version, watermark_ms), None)

            if done is None and previous is None:
                query.recent.clear()  # bronze's first stream commit: nothing before it counts
            if done is None and (previous is None or query.recent.holds(previous.version)):
                query.recent.advance(commit.version, chunk, facts.newest_ms,
                                     commit.next_watermark_ms)
                chunk = None  # the index owns it now
        finally:
            if chunk is not None:
                free_checkpointed(chunk)
            classified.unpersist()
            spark.sparkContext.setJobDescription(None)

    return run


def move_aside(spark: SparkSession, checkpoint: str, suffix: str) -> str:
    """Rename the checkpoint to `<checkpoint>.<suffix>` (kept for inspection); returns the new
    path. The next start is a new checkpoint."""
    jvm = spark.sparkContext._jvm
    src = jvm.org.apache.hadoop.fs.Path(checkpoint)
    dst = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}.{suffix}")
    fs = src.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.rename(src, dst):
        raise RuntimeError(f"could not move the checkpoint {checkpoint} aside")
    return str(dst)


def start_ingest(spark: SparkSession, settings: Settings, trigger: Trigger,
                 recent: RecentIds | None = None, fence: Fence | None = None) -> StreamingQuery:
    """Start the ingest query, under the caller's `checkpoint_lock` (`fence`: its check runs
    before every commit). `recent`: the caller's recent-id index, kept across restarts (it
    checks itself against bronze) and cleared by the caller when done. An Avro spec's registry
    schemas are fetched here, at every start (a restart after `SchemasChanged` gets the new
    ones)."""
    settings = with_registry_schemas(settings)
    writer = Writer(spark, settings, fence or Fence())
    ensure_tables(spark, settings)
    migrate_layout(writer, STREAMING)
    limit_stats(writer, BRONZE)
    for table in (QUARANTINE, BRONZE):  # this release's columns (the redrive's, the exact key)
        add_missing_columns(writer, table)
    if applied := apply_spec(writer):  # a spec edit takes effect here, under the lock
        print(f"{settings.pipeline}: {applied}", flush=True)
    topic = check_topic(settings)
    checkpoint = settings.checkpoint_path(INGEST_QUERY)
    fresh = (ckpt.last_committed_batch(checkpoint) is None
             and ckpt.batch_offsets(checkpoint, 0) is None)
    start = "earliest"
    if not fresh:
        gaps = retention_gaps(settings, ckpt.committed_position(
            checkpoint, settings.events_topic))
        if gaps:
            handle_data_loss(writer, gaps)
            # The checkpoint would resume inside the gap: a new one starts from bronze's
            # position (the same place: bronze stamps every batch), past the gap.
            moved = move_aside(spark, checkpoint, f"data-loss-{int(time.time())}")
            print(f"checkpoint moved aside to {moved}", file=sys.stderr, flush=True)
            fresh = True
    if fresh:
        positions = start_positions(settings)
        gaps = retention_gaps(settings, positions)
        if gaps:
            handle_data_loss(writer, gaps)
        drop_orphans(writer, positions)
        complete_pending_aggregates(writer)
        start = starting_offsets(positions, settings, skipped=gaps)
    stream = (
        classify(kafka_source(spark, settings, start), settings)
        .writeStream.queryName(INGEST_QUERY)
        .foreachBatch(ingest_batch(settings, _Query(spark, checkpoint, topic,
                                                    fence=writer.fence,
                                                    recent=recent or RecentIds())))
        .option("checkpointLocation", checkpoint)
    )
    return trigger.apply(stream).start()


# Spark 4.1.1 bug (SPARK-55271): after a crash, the Kafka source's progress metrics throw this
# NullPointerException at the end of the first re-executed batch, *after* the batch committed.
# A restart continues correctly, so runners restart a query that died of exactly this. Spark
# 4.2.0's Kafka source no longer builds the Some(null) behind it (SPARK-57438); the restart
# stays as a safety net for any other build that still has it.
_SPARK_55271 = 'because the return value of "scala.Option.get()" is null'
MAX_RESTARTS = 3


def is_known_restart_bug(exc: BaseException | str | None) -> bool:
    return exc is not None and _SPARK_55271 in str(exc)


def schemas_changed(exc: BaseException | str | None) -> bool:
    """The query stopped before a batch wrote anything because ids it carries were registered
    since the start (`SchemasChanged`): a restart fetches them and re-runs the batch."""
    return exc is not None and SchemasChanged.__name__ in str(exc)


def run_available_now(spark: SparkSession, settings: Settings) -> list[dict]:
    """One checkpointed catch-up: every available record, then stop. Returns the progress
    reports of its batches (also recorded in `stream_progress`, once for the run)."""
    progresses: list[dict] = []
    # A catch-up's batches look earlier ids up in bronze: its index would die with the run,
    # and a run is mostly one batch (keeping a chunk of it cost ~5% of a 2M catch-up).
    recent = RecentIds(keep=False)
    with checkpoint_lock(settings, INGEST_QUERY) as fence:
        try:
            for attempt in range(MAX_RESTARTS + 1):
                q = start_ingest(spark, settings, Trigger(available_now=True), recent, fence)
                try:
                    q.awaitTermination()
                    progresses += [as_dict(p) for p in q.recentProgress]
                    break
                except Exception as exc:  # StreamingQueryException
                    progresses += [as_dict(p) for p in q.recentProgress]
                    if not (is_known_restart_bug(exc) or schemas_changed(exc)) \
                            or attempt == MAX_RESTARTS:
                        raise
                    if schemas_changed(exc):
                        print(f"{settings.pipeline}: ingest: restarting with the registry's "
                              "new schemas", flush=True)
        finally:
            recent.clear()
        # Only batches that ran: an idle trigger's report (no new records) is no batch, and as
        # the idempotent append's txnVersion it would take the id of the next real batch, whose
        # row would then never be written. A catch-up that ran none records nothing.
        executed = [p for p in progresses if BatchReport.of(p).executed]
        if executed:
            record_progress(Writer(spark, settings, fence), INGEST_QUERY, executed,
                            topic_offsets(settings))
    return progresses


def caught_up(settings: Settings) -> bool:
    """True when a catch-up would find nothing to do, decided without Spark (checkpoint files,
    the topic's offsets and id): the checkpoint's last batch committed, its end offsets are
    the topic's end offsets on every partition, the topic is the one bronze was ingested
    from, and no in-place spec edit waits for the query's start to apply it (the corrections,
    replays and redrives of the edited spec refuse until then). Anything else (a new or lost
    checkpoint, a batch to re-run, new records, retention past the position, a replaced topic,
    a spec edit) is left to `run_available_now`, which handles it. Taken under the checkpoint's
    lock, like a run: it fails the same way while a runner holds it."""
    checkpoint = settings.checkpoint_path(INGEST_QUERY)
    with checkpoint_lock(settings, INGEST_QUERY):
        if pending_change(settings) is not None:
            return False
        started = ckpt.batch_ids(checkpoint, "offsets")
        if not started or ckpt.last_committed_batch(checkpoint) != started[-1]:
            return False
        position = ckpt.committed_position(checkpoint, settings.events_topic)
        offsets = topic_offsets(settings)
        if not position or not offsets or any(
                position.get(o.partition, 0) != o.latest or o.earliest > o.latest
                for o in offsets):
            return False
        newest = newest_stream_commit(settings)
        current = topic_id(settings)
        return current is not None and (newest is None or not newest.topic_id
                                        or newest.topic_id == current)


def catch_up(spark: SparkSession, settings: Settings) -> dict[str, list[dict]]:
    """The stream caught up to the end of the topic (one availableNow run of `ingest`)."""
    return {INGEST_QUERY: run_available_now(spark, settings)}
