"""What the pipeline's commits say in their userMetadata, and how to read it back: the pipeline's
tag on gold commits, the Kafka position and watermark stamped on each bronze commit of the
stream (`StreamCommit`), the batch tag of the ingest's other commits. Read from the Delta log
through delta-rs (no Spark)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE

# Commits the pipeline makes to the gold tables carry this tag in their userMetadata; any other
# commit touching a date is a change from outside (a manual fix, a bad job) and makes the next
# corrections run recompute that whole date.
PIPELINE_TAG = "lakehouse-pipeline"


# Each bronze commit of the stream carries, in its userMetadata, the Kafka end offsets of the
# batch it wrote: bronze at that version holds exactly the valid records below those offsets.
# That is how the replay reads the same log prefix the gold rows were computed from.
BRONZE_POSITION_TAG = "lakehouse-stream:kafka-end-offsets="


# Bronze commits of the one-pass ingest query carry more: the query and batch that made them
# (their idempotency key: a re-run batch finds its own commit and does not write again) and the
# watermark the batch judged lateness by and the one after it. The watermark is thus part of
# committed state: a re-run batch, or a new checkpoint, computes exactly the same one.
INGEST_TAG = "lakehouse-ingest:"


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


# The commits of a quarantine redrive (spark_jobs.redrive: its late-lane and bronze appends and
# its quarantine MERGE) carry the quarantine date and the run: `lakehouse-redrive:<date>:<run id>`.
REDRIVE_TAG = "lakehouse-redrive:"


def redrive_tag(quarantine_date, run_id: str) -> str:
    return f"{REDRIVE_TAG}{quarantine_date.isoformat()}:{run_id}"


def redrive_of(user_metadata: str | None) -> tuple[str, str] | None:
    """(quarantine date, run id) of a redrive's commit, from its userMetadata."""
    meta = user_metadata or ""
    if not meta.startswith(REDRIVE_TAG):
        return None
    day, _, run = meta[len(REDRIVE_TAG):].partition(":")
    return day, run


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
    return None if log is None else stream_commit_in(log, version)


def stream_commit_of(settings: Settings, query: str, batch_id: int,
                     after: int) -> StreamCommit | None:
    """Batch `batch_id` of `query`'s stream commit among bronze's commits after version `after`
    (None when it is not there), read commit file by commit file: no snapshot of bronze, whose
    file list (which opening the table loads) grows with the table."""
    found = None
    for commit in delta_log.LogFollower(settings.table_path(BRONZE.name), after).new_commits():
        c = StreamCommit.parse({**commit.info, "version": commit.version})
        if c is not None and (c.query, c.batch_id) == (query, batch_id):
            found = c
    return found


def stream_commit_in(log, version: int | None = None) -> StreamCommit | None:
    """`newest_stream_commit` on bronze's log already opened (a delta-rs `DeltaTable`)."""
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


def bronze_position(settings: Settings, version: int | None = None) -> LogPosition | None:
    """The position of bronze at `version` (default: its newest): the offsets stamped on the
    newest stream commit at or below it, however far back (a commit made outside the stream,
    such as a manual fix or a compaction, moves no offset). None when bronze does not exist yet
    or holds no stream commit."""
    found = newest_stream_commit(settings, version)
    if found is None:
        return None
    at = delta_log.version(settings, BRONZE.name) if version is None else version
    return LogPosition(at, found.end_offsets, found.committed_at)


def stream_watermark(settings: Settings) -> datetime | None:
    """The stream's watermark: the one its newest batch left (stamped on bronze's newest stream
    commit; None before the first batch with an event)."""
    commit = newest_stream_commit(settings)
    if commit is None or commit.next_watermark_ms <= 0:
        return None
    return datetime.fromtimestamp(commit.next_watermark_ms / 1000, tz=UTC)
