"""Delta table names, schemas and creation. Every table lives at `$LAKEHOUSE_ROOT/<name>`."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from lakehouse import delta_log
from lakehouse.settings import Settings

MEASURES = """
    event_count BIGINT NOT NULL,
    value_sum DECIMAL(38,6) NOT NULL,
    value_min DECIMAL(38,6) NOT NULL,
    value_max DECIMAL(38,6) NOT NULL,
    event_fingerprint DECIMAL(38,0) NOT NULL
"""
WINDOW_KEY = """
    event_date DATE NOT NULL,
    window_start TIMESTAMP NOT NULL,
    window_end TIMESTAMP NOT NULL,
    key STRING NOT NULL
"""
MEASURE_COLUMNS = ("event_count", "value_sum", "value_min", "value_max", "event_fingerprint")
WINDOW_COLUMNS = ("event_date", "window_start", "window_end", "key")


@dataclass(frozen=True)
class Table:
    name: str
    ddl: str
    partition_by: str
    change_data_feed: bool = False
    # Deletion vectors: a MERGE marks the rows it replaces instead of rewriting their files, so
    # its cost follows the rows it touches, not the files they sit in.
    deletion_vectors: bool = False


BRONZE = Table(
    "bronze_events",
    """event_id STRING NOT NULL, key STRING NOT NULL, event_time TIMESTAMP NOT NULL,
    payload_event_time TIMESTAMP NOT NULL, value DECIMAL(38,6) NOT NULL, attributes STRING,
    record_key STRING, topic STRING NOT NULL, partition INT NOT NULL, offset BIGINT NOT NULL,
    kafka_timestamp TIMESTAMP NOT NULL, event_date DATE NOT NULL,
    ingested_at TIMESTAMP NOT NULL, bronze_batch_id BIGINT NOT NULL""",
    "event_date",
    # The late lane reads bronze by commit-version range (the aggregation batch's source range).
    change_data_feed=True,
)
QUARANTINE = Table(
    "quarantined_events",
    """reason STRING NOT NULL, detail STRING, topic STRING NOT NULL, partition INT NOT NULL,
    offset BIGINT NOT NULL, kafka_timestamp TIMESTAMP NOT NULL, value_bytes INT,
    raw_key STRING, raw_value STRING, quarantine_date DATE NOT NULL,
    ingested_at TIMESTAMP NOT NULL, bronze_batch_id BIGINT NOT NULL""",
    "quarantine_date",
)
STREAMING = Table(
    "streaming_aggregates",
    # bronze_version: the bronze commit of the last batch added into the row (the additive
    # MERGE's guard: a re-run batch adds nothing twice).
    f"""{WINDOW_KEY}, {MEASURES}, status STRING NOT NULL, watermark TIMESTAMP,
    batch_id BIGINT NOT NULL, updated_at TIMESTAMP NOT NULL, bronze_version BIGINT""",
    "event_date",
    deletion_vectors=True,
)
LATE = Table(
    "late_events",
    """event_id STRING NOT NULL, key STRING NOT NULL, event_time TIMESTAMP NOT NULL,
    value DECIMAL(38,6) NOT NULL, event_date DATE NOT NULL, window_start TIMESTAMP NOT NULL,
    window_end TIMESTAMP NOT NULL, lateness_ms BIGINT NOT NULL, batch_id BIGINT NOT NULL,
    batch_watermark TIMESTAMP NOT NULL, topic STRING NOT NULL, partition INT NOT NULL,
    offset BIGINT NOT NULL, kafka_timestamp TIMESTAMP NOT NULL, recorded_at TIMESTAMP NOT NULL""",
    "event_date",
)
RECONCILED = Table(
    "reconciled_aggregates",
    f"""{WINDOW_KEY}, {MEASURES}, revision INT NOT NULL, status STRING NOT NULL,
    updated_at TIMESTAMP NOT NULL""",
    "event_date",
    change_data_feed=True,
)
REPLAY = Table(
    "replay_aggregates",
    f"{WINDOW_KEY}, {MEASURES}, replayed_at TIMESTAMP NOT NULL",
    "event_date",
)
CORRECTIONS = Table(
    "late_corrections",
    f"""{WINDOW_KEY}, revision INT NOT NULL, cause STRING NOT NULL,
    before_event_count BIGINT, before_value_sum DECIMAL(38,6), before_value_min DECIMAL(38,6),
    before_value_max DECIMAL(38,6), before_event_fingerprint DECIMAL(38,0),
    after_event_count BIGINT, after_value_sum DECIMAL(38,6), after_value_min DECIMAL(38,6),
    after_value_max DECIMAL(38,6), after_event_fingerprint DECIMAL(38,0),
    corrected_at TIMESTAMP NOT NULL, run_id STRING""",
    "event_date",
)
PROGRESS = Table(
    "stream_progress",
    """query STRING NOT NULL, batch_id BIGINT NOT NULL, batch_timestamp TIMESTAMP,
    input_rows BIGINT, input_rows_per_second DOUBLE, processed_rows_per_second DOUBLE,
    start_offsets STRING, end_offsets STRING, watermark TIMESTAMP,
    rows_dropped_by_watermark BIGINT, state_rows BIGINT, state_memory_bytes BIGINT,
    duration_ms STRING, trigger_ms BIGINT, kafka_end_offsets STRING, kafka_lag BIGINT,
    progress_date DATE NOT NULL""",
    "progress_date",
)
SKIPPED = Table(
    "skipped_offsets",
    # Offset ranges [from_offset, to_offset) the stream skipped because retention deleted them
    # before it read them (ON_DATA_LOSS=skip_and_record): the broker times around the gap bound
    # when they were produced; dates they may belong to are never reported as proven.
    """topic STRING NOT NULL, partition INT NOT NULL, from_offset BIGINT NOT NULL,
    to_offset BIGINT NOT NULL, records BIGINT NOT NULL, recorded_at TIMESTAMP NOT NULL,
    recorded_date DATE NOT NULL, reason STRING NOT NULL""",
    "recorded_date",
)
CORRECTIONS_STATE = Table(
    "corrections_state",
    # Per date: the bronze version the gold rows were last computed from, and the gold version
    # before that run's own commits (a later commit without the pipeline's tag is foreign).
    """event_date DATE NOT NULL, bronze_version BIGINT NOT NULL, reconciled_version BIGINT NOT NULL,
    mode STRING NOT NULL, run_id STRING, updated_at TIMESTAMP NOT NULL""",
    "event_date",
)
REPLAY_STATE = Table(
    "replay_state",
    # Per replay of a date: the bronze version whose log position (`bronze_position`) capped it.
    """event_date DATE NOT NULL, bronze_version BIGINT, run_id STRING,
    replayed_at TIMESTAMP NOT NULL""",
    "event_date",
)
ALL_TABLES = (BRONZE, QUARANTINE, STREAMING, LATE, RECONCILED, REPLAY, CORRECTIONS, PROGRESS,
              CORRECTIONS_STATE, REPLAY_STATE, SKIPPED)


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
            .addColumns(spark.createDataFrame([], table.ddl).schema)
            .partitionedBy(table.partition_by)
        )
        if table.change_data_feed:
            builder = builder.property("delta.enableChangeDataFeed", "true")
        if table.deletion_vectors:
            builder = builder.property("delta.enableDeletionVectors", "true")
        builder.execute()


def read_table(spark: SparkSession, settings: Settings, table: Table, version: int | None = None):
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(settings.table_path(table.name))


def table_version(settings: Settings, table: Table) -> int:
    """The table's newest version, from its Delta log (delta-rs: no Spark job)."""
    return delta_log.version(settings, table.name)


def read_changes(spark: SparkSession, settings: Settings, table: Table, first: int, last: int):
    """Delta Change Data Feed rows of commits `first`..`last` (inclusive)."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", first)
        .option("endingVersion", last)
        .load(settings.table_path(table.name))
    )


# Commits the pipeline makes to the gold tables carry this tag in their userMetadata; any other
# commit touching a date is a change from outside (a manual fix, a bad job) and makes the next
# corrections run recompute that whole date.
PIPELINE_TAG = "lakehouse-pipeline"


@contextmanager
def tagged_commits(spark: SparkSession, detail: str):
    key = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(key, f"{PIPELINE_TAG}:{detail}")
    try:
        yield
    finally:
        spark.conf.unset(key)


# Each bronze commit of the stream carries, in its userMetadata, the Kafka end offsets of the
# batch it wrote: bronze at that version holds exactly the valid records below those offsets.
# That is how the replay reads the same log prefix the gold rows were computed from.
BRONZE_POSITION_TAG = "lakehouse-stream:kafka-end-offsets="


# Bronze commits of the one-pass ingest query carry more: the query and batch that made them
# (their idempotency key: a re-run batch finds its own commit and does not write again) and the
# watermark the batch judged lateness by and the one after it. The watermark is thus part of
# committed state: a re-run batch, or a new checkpoint, computes exactly the same one.
INGEST_TAG = "lakehouse-ingest:"


def position_metadata(end_offsets: dict[int, int]) -> str:
    return BRONZE_POSITION_TAG + json.dumps({str(p): o for p, o in sorted(end_offsets.items())})


@dataclass(frozen=True)
class StreamCommit:
    """What a stream commit of bronze says about the batch that made it."""

    version: int
    end_offsets: dict[int, int]
    committed_at: datetime | None = None
    query: str | None = None  # the ingest query's id (its checkpoint's); None: an older release
    batch_id: int | None = None
    watermark_ms: int = 0  # lateness was judged by this watermark (event_time <= it: late)
    next_watermark_ms: int = 0  # after the batch: max(watermark, newest event time - delay)
    late: int = 0  # the batch's valid events at or below the watermark (its late_events rows)
    quarantined: int = 0
    topic_id: str | None = None  # the Kafka topic's id: offsets mean nothing in a re-created one

    def metadata(self) -> str:
        return INGEST_TAG + json.dumps({
            "kafka_end_offsets": {str(p): o for p, o in sorted(self.end_offsets.items())},
            "query": self.query, "batch_id": self.batch_id,
            "watermark_ms": self.watermark_ms, "next_watermark_ms": self.next_watermark_ms,
            "late": self.late, "quarantined": self.quarantined, "topic_id": self.topic_id,
        }, sort_keys=True)

    @staticmethod
    def parse(commit: dict) -> StreamCommit | None:
        """From a commit info (delta-rs `history()` row); None for a commit the stream did not
        make."""
        meta = commit.get("userMetadata") or ""
        at = datetime.fromtimestamp(commit["timestamp"] / 1000, tz=UTC) \
            if commit.get("timestamp") is not None else None
        if meta.startswith(INGEST_TAG):
            d = json.loads(meta[len(INGEST_TAG):])
            return StreamCommit(
                commit["version"], {int(p): int(o) for p, o in d["kafka_end_offsets"].items()},
                at, d.get("query"), d.get("batch_id"), int(d.get("watermark_ms") or 0),
                int(d.get("next_watermark_ms") or 0), int(d.get("late") or 0),
                int(d.get("quarantined") or 0), d.get("topic_id"))
        if meta.startswith(BRONZE_POSITION_TAG):
            offsets = json.loads(meta[len(BRONZE_POSITION_TAG):])
            return StreamCommit(commit["version"], {int(p): int(o) for p, o in offsets.items()}, at)
        return None


def batch_tag(query: str, batch_id: int) -> str:
    """The userMetadata of the ingest batch's other commits (quarantine, late lane, aggregates)."""
    return f"{BATCH_TAG}{query}:{batch_id}"


BATCH_TAG = "lakehouse-ingest-batch:"


def batch_of(user_metadata: str | None) -> tuple[str, int] | None:
    """(query id, batch id) of a commit the ingest query made, from its userMetadata."""
    meta = user_metadata or ""
    if meta.startswith(BATCH_TAG):
        query, _, batch = meta[len(BATCH_TAG):].rpartition(":")
        return query, int(batch)
    if meta.startswith(INGEST_TAG):
        d = json.loads(meta[len(INGEST_TAG):])
        return d.get("query"), int(d.get("batch_id"))
    return None


def stream_commits(settings: Settings, limit: int) -> list[StreamCommit]:
    """The stream commits among bronze's newest `limit` commits, newest first."""
    return [c for c in map(StreamCommit.parse, delta_log.commits(settings, BRONZE.name, limit))
            if c is not None]


def newest_stream_commit(settings: Settings, version: int | None = None) -> StreamCommit | None:
    """The newest stream commit of bronze at or below `version` (default: the newest), however
    far back: the log is read backwards in growing pages (the stream's own commit is normally
    the newest one, so one page of a few commits is the usual cost). None when bronze does not
    exist or holds no stream commit."""
    log = delta_log.open_table(settings, BRONZE.name)
    if log is None:
        return None
    current = log.version()
    version = current if version is None else version
    limit = current - version + 8
    while True:
        history = log.history(limit)
        for commit in history:
            if commit["version"] <= version and (found := StreamCommit.parse(commit)):
                return found
        if len(history) < limit:
            return None
        limit *= 8


@dataclass(frozen=True)
class LogPosition:
    """The stream's Kafka position behind bronze version `version` (offsets exclusive)."""

    version: int
    end_offsets: dict[int, int]
    committed_at: datetime | None = None  # UTC time of the stream commit that stamped it


def bronze_position(spark: SparkSession, settings: Settings,
                    version: int | None = None) -> LogPosition | None:
    """The position of bronze at `version` (default: its newest): the offsets stamped on the
    newest stream commit at or below it, however far back (a commit made outside the stream,
    such as a manual fix or a compaction, moves no offset). None when bronze does not exist yet
    or holds no stream commit."""
    found = newest_stream_commit(settings, version)
    if found is None:
        return None
    at = delta_log.version(settings, BRONZE.name) if version is None else version
    return LogPosition(at, found.end_offsets, found.committed_at)
