"""The catalog: every Delta table's name, columns (DDL) and layout, and the stream's query
names. Pure data: the Spark jobs create and read the tables from it (`spark_jobs.tables`), the
Delta-log readers and the reports name them from it. Every table lives at
`$LAKEHOUSE_ROOT/<name>`, beside the pipeline's other folders (`SPECIAL_FOLDERS`): together
they are `ROOT_FOLDERS`, the names no spec pipeline's folder may take."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lakehouse.events.shape import DEFAULT_SHAPE, EventShape

# The ingest query's name: its checkpoint is `$LAKEHOUSE_ROOT/_checkpoints/<name>`.
INGEST_QUERY = "ingest"

# The folders a pipeline keeps at its root beside its tables, named once here and used where
# they are written (so `ROOT_FOLDERS` cannot miss one):
CHECKPOINTS_DIR = "_checkpoints"  # the stream queries' checkpoints (Settings.checkpoint_path)
LOCKS_DIR = "_locks"  # the writer locks' files on a local root (lakehouse.tables.locks)
REPORTS_DIR = "reports"  # the timeline report and the checks' Data Docs (reports/quality)
WAREHOUSE_DIR = "_warehouse"  # Spark SQL's warehouse dir (spark_jobs.session)
GENERATIONS_REGISTRY = "spec_generations"  # the spec generations' registry table
GENERATIONS_DIR = "_generations"  # generations built under another spec version
SPECIAL_FOLDERS = (CHECKPOINTS_DIR, LOCKS_DIR, REPORTS_DIR, WAREHOUSE_DIR, GENERATIONS_REGISTRY,
                   GENERATIONS_DIR)

# The tables' columns come from a pipeline's event shape (lakehouse.events.shape): its window key
# (`shape.window_id`: one row per window and dimension values in every aggregate table) and
# measure columns. The default shape's are the contract's: `key` the one dimension, `value`
# decimal(38,6) with its sum, min and max.


@dataclass(frozen=True)
class Table:
    name: str
    columns: Callable[[EventShape], str]  # DDL of its columns for a pipeline's event shape
    partition_by: str  # the date column every table is partitioned by first
    change_data_feed: bool = False
    # Partition columns after the date (`streaming_aggregates`: its status, see STREAMING).
    sub_partitions: tuple[str, ...] = ()
    # The columns whose min/max Delta records per file (`delta.dataSkippingStatsColumns`);
    # empty: Delta's default (the first 32 columns).
    stats_columns: tuple[str, ...] = ()

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return (self.partition_by, *self.sub_partitions)

    def ddl_for(self, shape: EventShape) -> str:
        return self.columns(shape)

    @property
    def ddl(self) -> str:
        """The default pipeline's columns."""
        return self.columns(DEFAULT_SHAPE)


def fixed(ddl: str) -> Callable[[EventShape], str]:
    """Columns that are the same in every pipeline."""
    return lambda _shape: ddl


def _typed(shape: EventShape, names: tuple[str, ...]) -> list[str]:
    return [f"{n} {shape.column_type(n)} NOT NULL" for n in names]


def _bronze(shape: EventShape) -> str:
    return ", ".join([
        "event_id STRING NOT NULL", *_typed(shape, shape.dimension_names),
        "event_time TIMESTAMP NOT NULL", "payload_event_time TIMESTAMP NOT NULL",
        *_typed(shape, shape.measure_fields), "attributes STRING", "record_key STRING",
        "record_key_base64 STRING",
        "topic STRING NOT NULL", "partition INT NOT NULL", "offset BIGINT NOT NULL",
        "kafka_timestamp TIMESTAMP NOT NULL", "event_date DATE NOT NULL",
        "ingested_at TIMESTAMP NOT NULL", "bronze_batch_id BIGINT NOT NULL"])


def _late(shape: EventShape) -> str:
    return ", ".join([
        "event_id STRING NOT NULL", *_typed(shape, shape.dimension_names),
        "event_time TIMESTAMP NOT NULL", *_typed(shape, shape.measure_fields),
        "event_date DATE NOT NULL", "window_start TIMESTAMP NOT NULL",
        "window_end TIMESTAMP NOT NULL", "lateness_ms BIGINT NOT NULL", "batch_id BIGINT NOT NULL",
        "batch_watermark TIMESTAMP NOT NULL", "topic STRING NOT NULL", "partition INT NOT NULL",
        "offset BIGINT NOT NULL", "kafka_timestamp TIMESTAMP NOT NULL",
        "recorded_at TIMESTAMP NOT NULL"])


def _changes(shape: EventShape) -> str:
    # A correction's before and after image of the measures (null: the window did not exist).
    images = ", ".join(f"{side}_{name} {kind.upper()}" for side in ("before", "after")
                       for name, kind in shape.measure_columns_typed())
    return f"""{shape.window_key_ddl}, revision INT NOT NULL, cause STRING NOT NULL, {images},
    corrected_at TIMESTAMP NOT NULL, run_id STRING"""


BRONZE = Table(
    "bronze_events", _bronze, "event_date",
    # The late lane reads bronze by commit-version range (the aggregation batch's source range).
    change_data_feed=True,
    # What reads skip files by: event time (the dedup's lookups above the watermark, the newest
    # event in run metadata), the log position, the batch. Statistics of the id, the
    # dimensions, the measures and the JSON attributes cost ~24% of the append's CPU
    # (bench/results/step-ab-bronze-2026-11-27T084423.json) and no read uses them.
    stats_columns=("event_time", "kafka_timestamp", "partition", "offset", "ingested_at",
                   "bronze_batch_id"),
)
QUARANTINE = Table(
    "quarantined_events",
    fixed("""reason STRING NOT NULL, detail STRING, topic STRING NOT NULL, partition INT NOT NULL,
    offset BIGINT NOT NULL, kafka_timestamp TIMESTAMP NOT NULL, value_bytes INT,
    raw_key STRING, raw_value STRING, quarantine_date DATE NOT NULL,
    ingested_at TIMESTAMP NOT NULL, bronze_batch_id BIGINT NOT NULL,
    redriven_at TIMESTAMP, redrive_run_id STRING, redriven_to STRING"""),
    "quarantine_date",
)
# A quarantined record a redrive (spark_jobs.redrive) found valid is marked, never deleted:
# `redriven_at`, the run (`redrive_run_id`) and where it landed (`redriven_to`, REDRIVEN_TO: bronze
# and the late lane). Null in all three: still quarantined. Added to tables created before
# 2026-11-27 by `spark_jobs.writer.add_missing_columns` (nullable, old rows null).
REDRIVEN_TO = "bronze_events+late_events"
# `streaming_aggregates` statuses: a window is open until the watermark passes its end.
OPEN, FINAL = "open", "final"
STREAMING = Table(
    "streaming_aggregates",
    # bronze_version: the bronze commit of the last batch added into the row. Partitioned by
    # status as well: each ingest batch replaces the open partitions whole (the few minutes of
    # windows still open) and final rows are never rewritten by the stream, so a batch's
    # publication is one commit with no scan of the table (spark_jobs.stream.publish_windows).
    lambda shape: f"""{shape.window_key_ddl}, {shape.measures_ddl}, status STRING NOT NULL,
    watermark TIMESTAMP, batch_id BIGINT NOT NULL, updated_at TIMESTAMP NOT NULL,
    bronze_version BIGINT""",
    "event_date",
    sub_partitions=("status",),
)
LATE = Table("late_events", _late, "event_date")
RECONCILED = Table(
    "reconciled_aggregates",
    lambda shape: f"""{shape.window_key_ddl}, {shape.measures_ddl}, revision INT NOT NULL,
    status STRING NOT NULL, updated_at TIMESTAMP NOT NULL""",
    "event_date",
    change_data_feed=True,
)
REPLAY = Table(
    "replay_aggregates",
    lambda shape: f"{shape.window_key_ddl}, {shape.measures_ddl}, replayed_at TIMESTAMP NOT NULL",
    "event_date",
)
CORRECTIONS = Table("late_corrections", _changes, "event_date")
PROGRESS = Table(
    "stream_progress",
    fixed("""query STRING NOT NULL, batch_id BIGINT NOT NULL, batch_timestamp TIMESTAMP,
    input_rows BIGINT, input_rows_per_second DOUBLE, processed_rows_per_second DOUBLE,
    start_offsets STRING, end_offsets STRING, watermark TIMESTAMP,
    rows_dropped_by_watermark BIGINT, state_rows BIGINT, state_memory_bytes BIGINT,
    duration_ms STRING, trigger_ms BIGINT, kafka_end_offsets STRING, kafka_lag BIGINT,
    progress_date DATE NOT NULL"""),
    "progress_date",
)
SKIPPED = Table(
    "skipped_offsets",
    # Offset ranges [from_offset, to_offset) the stream skipped because retention deleted them
    # before it read them (ON_DATA_LOSS=skip_and_record): the broker times around the gap bound
    # when they were produced; dates they may belong to are never reported as proven.
    fixed("""topic STRING NOT NULL, partition INT NOT NULL, from_offset BIGINT NOT NULL,
    to_offset BIGINT NOT NULL, records BIGINT NOT NULL, recorded_at TIMESTAMP NOT NULL,
    recorded_date DATE NOT NULL, reason STRING NOT NULL"""),
    "recorded_date",
)
CORRECTIONS_STATE = Table(
    "corrections_state",
    # Per date: the bronze version the gold rows were last computed from, and the gold version
    # before that run's own commits (a later commit without the pipeline's tag is foreign).
    fixed("""event_date DATE NOT NULL, bronze_version BIGINT NOT NULL, reconciled_version BIGINT NOT NULL,
    mode STRING NOT NULL, run_id STRING, updated_at TIMESTAMP NOT NULL"""),
    "event_date",
)
REPLAY_STATE = Table(
    "replay_state",
    # Per replay of a date: the bronze version whose log position (`bronze_position`) capped it.
    fixed("""event_date DATE NOT NULL, bronze_version BIGINT, run_id STRING,
    replayed_at TIMESTAMP NOT NULL"""),
    "event_date",
)
ALL_TABLES = (BRONZE, QUARANTINE, STREAMING, LATE, RECONCILED, REPLAY, CORRECTIONS, PROGRESS,
              CORRECTIONS_STATE, REPLAY_STATE, SKIPPED)

# Every top-level folder the default pipeline writes under $LAKEHOUSE_ROOT: its tables and its
# special folders. A spec pipeline's `name` or `tables` may be none of them (lakehouse.specs.pipeline).
ROOT_FOLDERS = frozenset({*(t.name for t in ALL_TABLES), *SPECIAL_FOLDERS})
