"""Replay: recompute a date's aggregates straight from the Kafka log, independently of bronze and
of the stream's state, with the same parsing, dedup and window rules.

With LogAppendTime the broker time is monotonic per partition, so the records that can hold
events of date D are those appended in [D start - future skew, D end + correction horizon]
(capped at now): an event of D appended earlier would be more than the allowed skew in the
future (quarantined), and one appended later is beyond the horizon (not applied).

The replay reads the log up to a position: the Kafka end offsets stamped on a bronze version
(`tables.bronze_position`), the run's log position that corrections compute from too, so both
sides of the proof cover the same input. Records the stream has not ingested yet are left for
the next run instead of failing the proof.

If the retained log may not hold every record of D (retention deleted records the pipeline
ingested, or cut the log after D could begin, or a partition was never read by the stream), the
replay raises `ReplayIncomplete` naming the missing offsets and since when: it never publishes a
partial replay.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings, day_bounds
from lakehouse.events.schema_registry import with_registry_schemas
from lakehouse.kafka.admin import PartitionOffsets, offsets_for_time, topic_offsets
from lakehouse.kafka.log_ranges import ReplayIncomplete, ReplayResult, offset_ranges
from lakehouse.kafka.topic_checks import require_log_append_time
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE, REPLAY, REPLAY_STATE
from lakehouse.tables.commit_tags import LogPosition, bronze_position
from lakehouse.tables.generations import require_applied
from lakehouse.tables.locks import date_lock
from lakehouse.tables.reads import DRIVER_ROWS_MAX
from lakehouse.tables.state_rows import latest_row
from spark_jobs.costs import measured
from spark_jobs.tables import read_table
from spark_jobs.transforms.counting import events_for_date
from spark_jobs.transforms.parse import classify, valid_columns
from spark_jobs.transforms.windows import aggregate_windows
from spark_jobs.writer import Writer, ensure_tables


def missing_offsets(spark: SparkSession, settings: Settings, d: date,
                    offsets: list[PartitionOffsets] | None = None,
                    position: LogPosition | None = None) -> ReplayIncomplete | None:
    """Why the retained log cannot prove `d`, per partition (None: it can). Partitions come from
    the topic's metadata, not from what bronze saw:

    - bronze holds offsets of `d` below the partition's log start (deleted after ingestion);
    - the log start is above 0 and no retained record was appended before the date's first
      possible append time (its start minus FUTURE_SKEW): deleted records may belong to `d`;
    - `position` (the stream's offsets) lacks a partition that has records in the date's range.
    """
    offsets = offsets if offsets is not None else topic_offsets(settings)
    if not offsets:
        return None
    log_start = {p.partition: p.earliest for p in offsets}
    first_possible = day_bounds(d)[0] - settings.future_skew
    missing: dict[int, tuple[int, int]] = {}
    why: dict[int, str] = {}
    cut = [p for p in offsets if p.earliest > 0]
    if cut:
        at = offsets_for_time(settings, int(first_possible.timestamp() * 1000), known=offsets)
        for p in cut:
            # The first retained record was appended at or after that time, so deleted ones may
            # have been too. (A partition retention emptied entirely gives no time to judge by.)
            if p.latest > p.earliest and at[p.partition] == p.earliest:
                missing[p.partition] = (0, p.earliest)
                why[p.partition] = ("retention cut the log after the date's first possible "
                                    f"append time {first_possible.isoformat()}")
    # Records below a partition's log start can only be missing if retention moved it.
    seen = [] if all(p.earliest == 0 for p in offsets) else (
        read_table(spark, settings, BRONZE)
        .where((F.col("event_date") == F.lit(d)) & (F.col("topic") == settings.events_topic))
        .groupBy("partition")
        .agg(F.min("offset").alias("lo"))
        .collect()
    )
    for r in seen:
        if r.partition in log_start and r.lo < log_start[r.partition]:
            missing[r.partition] = (r.lo, log_start[r.partition])
            why[r.partition] = "deleted by retention after ingestion"
    if position is not None:
        ranges, _ = offset_ranges(settings, d, None, offsets)
        for p, (lo, hi) in ranges.items():
            if p not in position.end_offsets and hi > lo and p not in missing:
                missing[p] = (lo, lo)
                why[p] = "the stream has not read this partition"
    if not missing:
        return None
    return ReplayIncomplete(d, missing, why, first_possible)


def run_replay(spark: SparkSession, settings: Settings, d: date, as_of: int | None = None,
               run_id: str = "") -> ReplayResult:
    """Replay `d` up to the log position of bronze version `as_of` (None: the newest). Refuses
    (ReplayIncomplete) when the retained log may not hold every record of the date."""
    require_applied(settings)
    settings = with_registry_schemas(settings)  # an Avro spec's registry: its schemas now
    with date_lock(settings, d) as fence:
        return _replay(Writer(spark, settings, fence), d, as_of, run_id)


def _replay(writer: Writer, d: date, as_of: int | None, run_id: str) -> ReplayResult:
    spark, settings = writer.spark, writer.settings
    ensure_tables(spark, settings)
    require_log_append_time(settings)  # offsets-for-times ranges need broker append times
    offsets = topic_offsets(settings)  # one broker round trip for the check and the ranges
    version = as_of if as_of is not None else delta_log.version(settings, BRONZE.name)
    position = bronze_position(settings, version)
    if incomplete := missing_offsets(spark, settings, d, offsets, position):
        raise incomplete
    ranges, until = offset_ranges(settings, d, position, offsets)
    result = ReplayResult(d, ranges=ranges, read_until=until, bronze_version=version)
    with measured(spark) as cost:
        fetched = _read_and_write(writer, d, ranges, result)
    result.cost = {"kafka_records_fetched": result.records_read, "kafka_bytes_fetched": fetched,
                   **_written(settings), **cost}
    writer.append_rows(REPLAY_STATE, [{"event_date": d, "bronze_version": version,
                                       "run_id": run_id, "replayed_at": datetime.now(UTC)}])
    return result


def _read_and_write(writer: Writer, d: date, ranges: dict[int, tuple[int, int]],
                    result: ReplayResult) -> int:
    """Read `ranges` of the topic, count `d`'s windows into `result` and replace the date's
    replay rows. Returns the bytes fetched (keys and values)."""
    spark, settings = writer.spark, writer.settings
    read = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not read:
        _write_replay(writer, None, d, 0)
        return 0
    topic = settings.events_topic
    raw = (
        spark.read.format("kafka")
        .options(**settings.spark_kafka_options)
        .option("assign", json.dumps({topic: sorted(read)}))  # only non-empty ranges
        .option("startingOffsets", json.dumps({topic: {str(p): lo for p, (lo, _) in read.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): hi for p, (_, hi) in read.items()}}))
        .option("failOnDataLoss", "true")
        .load()
    )
    # One pass: the counts ride along as observed metrics (no cache, no second read, no
    # read-back of what was written; the observation also keeps Spark from pushing the
    # validity filter into the parse).
    records, windows_seen = Observation("replay_records"), Observation("replay_windows")
    classified = classify(raw, settings).observe(
        records, F.count(F.when(F.col("reason").isNotNull(), 1)).alias("quarantined"),
        F.sum(F.coalesce(F.col("value_bytes"), F.lit(0)) + F.coalesce(F.octet_length("record_key"),
                                                F.octet_length(F.unbase64("record_key_base64")),
                                                F.lit(0))).alias("bytes"))
    valid = classified.where(F.col("reason").isNull()).select(*valid_columns(settings.shape))
    windows = aggregate_windows(events_for_date(valid, settings, d), settings).observe(
        windows_seen, F.count(F.lit(1)).alias("windows"), F.sum("event_count").alias("events"))
    result.records_read = sum(hi - lo for lo, hi in read.values())
    _write_replay(writer, windows, d, result.records_read)
    result.quarantined = int(records.get["quarantined"])
    result.windows = int(windows_seen.get["windows"])
    result.events = int(windows_seen.get["events"] or 0)
    return int(records.get["bytes"] or 0)


def _written(settings: Settings) -> dict:
    """Bytes and files the replay's commit of replay_aggregates added (its newest commit:
    replays of a date are serialized by the date lock)."""
    commit = delta_log.read_commit(settings.table_path(REPLAY.name),
                                   delta_log.version(settings, REPLAY.name))
    adds = commit.adds if commit is not None else []
    return {"bytes_written": sum(int(a.get("size", 0)) for a in adds), "files_written": len(adds)}


def latest_replay(settings: Settings, d: date, run_id: str | None = None):
    """The newest `replay_state` row of `d` (of run `run_id` if given): bronze_version, run_id,
    replayed_at; None when there is none. Replays of a date are serialized (`date_lock`), so
    the newest row describes the rows now in replay_aggregates."""
    match = {"run_id": run_id} if run_id is not None else {}
    return latest_row(settings, REPLAY_STATE.name, d, ("replayed_at",), **match)


def replayed_in_run(settings: Settings, d: date, run_id: str | None) -> int | None:
    """The bronze version the replay of `d` in run `run_id` (None: the latest replay) read up
    to (None: no such replay)."""
    row = latest_replay(settings, d, run_id)
    return row.bronze_version if row else None


def _write_replay(writer: Writer, windows: DataFrame | None, d: date, records: int) -> None:
    """Replace `d`'s rows of replay_aggregates with `windows` (+ replayed_at; None: no rows),
    one commit."""
    spark, settings = writer.spark, writer.settings
    rows = (None if windows is None
            else windows.withColumn("replayed_at", F.lit(datetime.now(UTC))))
    # Up to DRIVER_ROWS_MAX records read (a window per record at most), on a local root: the
    # windows collected and written with delta-rs, no snapshot of the table rebuilt by Spark
    # and no write jobs (bench/results/run-path-2026-11-29T004137.json). Else, and on an object store,
    # written by Spark.
    if settings.local_root is not None and records <= DRIVER_ROWS_MAX:
        # toArrow: the one action (the observed counts complete with it).
        writer.replace_date(REPLAY, d, None if rows is None else rows.toArrow())
        return
    if rows is None:
        rows = spark.createDataFrame([], read_table(spark, settings, REPLAY).schema)
    writer.replace(rows, REPLAY, f"event_date = DATE'{d.isoformat()}'")
