"""The quarantine redrive: give a date's quarantined records a second chance with today's spec and
schema registry, and land those that now pass exactly once.

A record is quarantined by the classification of the batch that read it. Some reasons are fixed
upstream later (a schema id registered under the subject after the batch ran: `unknown_schema_id`);
the replay, which classifies the log again with today's registry, then counts the record while
bronze does not hold it, and the date's proof fails. The redrive closes that gap:

1. The quarantine date's records not yet redriven (of the chosen reasons; all by default), below
   the stream's position (the Kafka end offsets stamped on bronze's newest stream commit: a row
   beyond it is an orphan of a batch that has not finished, whose re-run or a new checkpoint
   decides it), are rebuilt as Kafka rows from their raw bytes (key, value, topic, partition,
   offset, broker timestamp) and classified by `classify`, the stream's own code, with the
   pipeline's spec and the registry's schemas fetched now.
2. Those that now pass land in the late lane, then in bronze (the stream's columns; the batch
   id is the ingest batch that quarantined the record). They are late events: the fast path
   never counted them and never will (the stream does not read them again), so the late lane
   holds them with the watermark of the redrive (the stream's, `stream_watermark`), and a
   corrections run applies them to gold from bronze, like any late event.
3. They are marked in the quarantine (`redriven_at`, `redrive_run_id`, `redriven_to`): one MERGE,
   never a delete.

Exactly once: each append skips the records its table already holds, by (topic, partition,
offset) among the event dates concerned (a record is in bronze or in the quarantine, never
both, until a redrive), so a re-run after a crash anywhere in between lands nothing twice and
marks what the crashed run landed. The redrive's commits carry its tag
(`lakehouse-redrive:<date>:<run id>`, `lakehouse.tables.commit_tags.redrive_tag`). A second
redrive of a date finds nothing unmarked that passes: it commits nothing.

The proof stays true: the replay recounts the date from the log with the same spec and registry
(its records at the same offsets, its broker times, the same dedup and horizon rules), and
corrections recompute the date's windows from bronze, which now holds the redriven records.
Runs under the quarantine date's writer lock (`date_lock`). On an object store it also holds the
stream's (`checkpoint_lock`): it appends to the stream's tables, and Delta's log store there takes
one writing driver. While the service or a catch-up holds that lock, the redrive is refused at
once, naming the holder (run it when the stream is stopped, or between its catch-ups).
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.config.storage import local_path
from lakehouse.events.schema_registry import with_registry_schemas
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE, LATE, QUARANTINE, REDRIVEN_TO
from lakehouse.tables.commit_tags import newest_stream_commit, redrive_tag
from lakehouse.tables.generations import require_applied
from lakehouse.tables.locks import CheckpointBusy, Fence, Fences, checkpoint_lock, date_lock
from lakehouse.tables.stats import all_null
from spark_jobs.tables import missing_columns, read_table, retry_on_conflict, sql_string
from spark_jobs.transforms.ingest import late_projection
from spark_jobs.transforms.parse import classify, valid_columns
from spark_jobs.writer import Writer, add_missing_columns, ensure_tables

KEY = ["topic", "partition", "offset"]


@dataclass
class RedriveResult:
    quarantine_date: date
    reasons: list[str] | None  # the reasons selected (None: all)
    run_id: str = ""
    considered: dict[str, int] = field(default_factory=dict)  # per reason: records re-classified
    redriven: dict[str, int] = field(default_factory=dict)  # per reason: now in bronze, marked
    landed_now: int = 0  # appended to bronze by this run (the rest: by a run that crashed)
    still_failing: dict[str, dict[str, int]] = field(default_factory=dict)  # reason -> new -> n
    beyond_position: int = 0  # unmarked rows past the stream's position, left for later
    event_dates: list[date] = field(default_factory=list)  # dates of the redriven records
    columns_added: list[str] = field(default_factory=list)

    @property
    def total_redriven(self) -> int:
        return sum(self.redriven.values())

    @property
    def total_still_failing(self) -> int:
        return sum(n for v in self.still_failing.values() for n in v.values())

    def per_reason(self) -> list[dict]:
        """One row per original reason: considered, redriven, still failing (and as what)."""
        return [{"reason": r, "considered": n, "redriven": self.redriven.get(r, 0),
                 "still_failing": sum(self.still_failing.get(r, {}).values()),
                 "now_failing_as": ", ".join(f"{k}: {v}" for k, v in sorted(
                     self.still_failing.get(r, {}).items()))}
                for r, n in sorted(self.considered.items())]

    def as_metadata(self) -> dict:
        return {"quarantine_date": self.quarantine_date.isoformat(),
                "reasons": self.reasons or "all", "run_id": self.run_id,
                "redriven": self.total_redriven, "landed_now": self.landed_now,
                "still_failing": self.total_still_failing,
                "beyond_position": self.beyond_position,
                "event_dates": [d.isoformat() for d in self.event_dates],
                "per_reason": self.per_reason(), "columns_added": self.columns_added}


def run_redrive(spark: SparkSession, settings: Settings, d: date, run_id: str,
                reasons: list[str] | None = None) -> RedriveResult:
    """Redrive the records quarantined on `d` (their broker date: the quarantine's partition),
    of `reasons` (None or empty: every reason). Idempotent; see the module's docstring."""
    with ExitStack() as held:
        fences = Fences()
        stream = None
        if local_path(str(settings.root)) is None:  # one writing driver per table there
            stream = held.enter_context(_stream_lock(settings))
            fences.add(stream)
        require_applied(settings)
        settings = with_registry_schemas(settings)  # an Avro spec's registry: its schemas now
        result = RedriveResult(d, sorted(reasons) if reasons else None, run_id)
        ensure_tables(spark, settings)
        result.columns_added = _redrive_columns(spark, settings, stream)
        fences.add(held.enter_context(date_lock(settings, d)))
        writer = Writer(spark, settings, fences)
        # A concurrent commit (the stream appending to today's quarantine partition while the
        # MERGE marks it): the redrive is idempotent, so it runs again.
        return retry_on_conflict(
            lambda: _redrive(writer, d, run_id, result),
            lambda exc: print(f"redrive {d}: a concurrent commit ({type(exc).__name__}); again",
                              file=sys.stderr, flush=True))


@contextmanager
def _stream_lock(settings: Settings):
    """The stream's lock, for a redrive on an object store: refused at once while held."""
    try:
        with checkpoint_lock(settings, role="a quarantine redrive") as fence:
            yield fence
    except CheckpointBusy as exc:
        raise CheckpointBusy(
            f"redrive refused: on an object store it appends to the stream's tables, which take "
            f"one writing driver, and the stream holds their lock ({exc}). Run it while the "
            "stream is stopped (or between its catch-ups); nothing was written") from exc


def _redrive_columns(spark: SparkSession, settings: Settings, stream: Fence | None) -> list[str]:
    """Tables the redrive appends to, created by an older release, gain this release's columns
    (the quarantine's redrive columns, bronze's `record_key_base64`) under the stream's lock
    (`stream`: held by the redrive already, on an object store; the stream appends to them, and
    a metadata change beside a batch's append would fail that batch). The stream's own start
    adds them too."""
    tables = [t for t in (QUARANTINE, BRONZE) if missing_columns(spark, settings, t)]
    if not tables:
        return []
    if stream is not None:
        writer = Writer(spark, settings, stream)
        return [c for t in tables for c in add_missing_columns(writer, t)]
    names = " and ".join(t.name for t in tables)
    try:
        with checkpoint_lock(settings, role="a quarantine redrive") as fence:
            writer = Writer(spark, settings, fence)
            return [c for t in tables for c in add_missing_columns(writer, t)]
    except CheckpointBusy as exc:
        raise CheckpointBusy(
            f"{names} predate this release's columns; the stream holds their lock ({exc}). The "
            "stream adds them at its next start: restart it (or stop it and run the redrive "
            "once), then run the redrive") from exc


def _redrive(writer: Writer, d: date, run_id: str, result: RedriveResult) -> RedriveResult:
    spark, settings = writer.spark, writer.settings
    topic = settings.events_topic
    tag = redrive_tag(d, run_id)
    quarantine = read_table(spark, settings, QUARANTINE).where(
        (F.col("quarantine_date") == F.lit(d)) & (F.col("topic") == topic)
        & F.col("redriven_at").isNull())
    if result.reasons:
        quarantine = quarantine.where(F.col("reason").isin(result.reasons))
    position = newest_stream_commit(settings)
    ends = position.end_offsets if position is not None else {}
    within = F.lit(False)
    for p, o in ends.items():
        within = within | ((F.col("partition") == p) & (F.col("offset") < o))
    counts = quarantine.groupBy(within.alias("within")).count().collect()
    result.beyond_position = sum(r["count"] for r in counts if not r.within)
    if not any(r.within for r in counts):
        return result
    # The Kafka rows the stream read, rebuilt from what the quarantine kept of them.
    pending = quarantine.where(within)
    raw = pending.select(
        F.unbase64("raw_key").alias("key"), F.unbase64("raw_value").alias("value"),
        "topic", "partition", "offset", F.col("kafka_timestamp").alias("timestamp"))
    was = pending.select(*KEY, F.col("reason").alias("_was"),
                         F.col("bronze_batch_id").alias("_batch"))
    # Classified once (cut from its lineage): the counts and every write below read it.
    classified = (classify(raw, settings).join(was, KEY)
                  .localCheckpoint(eager=True))
    try:
        verdicts = classified.groupBy("_was", "reason").count().collect()
        considered, redriven = Counter(), Counter()
        for r in verdicts:
            considered[r._was] += r["count"]
            if r.reason is None:
                redriven[r._was] += r["count"]
            else:
                result.still_failing.setdefault(r._was, {})[r.reason] = r["count"]
        result.considered = dict(considered)
        valid = classified.where(F.col("reason").isNull())
        dates = sorted(r.event_date for r in valid.select("event_date").distinct().collect())
        result.event_dates = dates
        if not dates:
            return result
        events = valid.select(*valid_columns(settings.shape), "_batch")

        def held_by(table) -> DataFrame:
            return (read_table(spark, settings, table)
                    .where(F.col("event_date").isin(dates) & (F.col("topic") == topic))
                    .select(*KEY))

        # The late lane first, bronze last (as in an ingest batch): each skips what it holds.
        watermark_ms = position.next_watermark_ms if position is not None else 0
        late = events.join(held_by(LATE), KEY, "left_anti")
        late = late_projection(late, settings, watermark_ms, 0).drop("batch_id").join(
            events.select(*KEY, F.col("_batch").alias("batch_id")), KEY).select(
            *read_table(spark, settings, LATE).columns)
        if not late.isEmpty():
            writer.append(late, LATE, tag)
        new = events.join(held_by(BRONZE), KEY, "left_anti").select(
            *valid_columns(settings.shape), F.current_timestamp().alias("ingested_at"),
            F.col("_batch").alias("bronze_batch_id")).localCheckpoint(eager=True)
        result.landed_now = new.count()
        if result.landed_now:
            writer.append(new, BRONZE, tag)
        # Every record that passes is in bronze now (this run's or a crashed run's append).
        _mark(writer, d, valid.select(*KEY), run_id, tag)
        result.redriven = dict(redriven)
        return result
    finally:
        classified.unpersist()


def _mark(writer: Writer, d: date, landed: DataFrame, run_id: str, tag: str) -> None:
    """Mark `landed` (topic, partition, offset) redriven in the quarantine's partition `d`: one
    MERGE (a MERGE that changes no row commits nothing)."""
    landed = landed.select(*KEY, F.lit(datetime.now(UTC)).alias("_at"))
    writer.merge(
        QUARANTINE, landed,
        f"t.quarantine_date = DATE'{d.isoformat()}' AND t.topic = s.topic "
        "AND t.partition = s.partition AND t.offset = s.offset AND t.redriven_at IS NULL",
        "WHEN MATCHED THEN UPDATE SET t.redriven_at = s._at, "
        f"t.redrive_run_id = {sql_string(run_id)}, "
        f"t.redriven_to = {sql_string(REDRIVEN_TO)}", tag)


def redriven_counts(spark: SparkSession, settings: Settings, dates: list[date]) -> dict[str, int]:
    """Per event date, how many of bronze's records came in by a redrive (marked redriven in
    the quarantine): what the date's proof counts besides what the stream ingested."""
    if not dates or not all(delta_log.exists(settings, t.name) for t in (QUARANTINE, BRONZE)) \
            or missing_columns(spark, settings, QUARANTINE) \
            or all_null(settings, QUARANTINE.name, "redriven_at"):  # no redrive yet: no Spark job
        return {d.isoformat(): 0 for d in dates}
    marked = (read_table(spark, settings, QUARANTINE)
              .where(F.col("redriven_at").isNotNull() & (F.col("topic") == settings.events_topic))
              .select(*KEY))
    rows = (read_table(spark, settings, BRONZE)
            .where(F.col("event_date").isin(dates) & (F.col("topic") == settings.events_topic))
            .join(marked, KEY, "left_semi").groupBy("event_date").count().collect())
    found = {r.event_date.isoformat(): r["count"] for r in rows}
    return {d.isoformat(): found.get(d.isoformat(), 0) for d in dates}
