"""The event ids the ingest query landed above its watermark, kept in Spark memory between
micro-batches: the dedup's lookup without reading bronze back.

Reading them back from bronze costs every batch a time-travel snapshot of bronze and a scan of
everything above the watermark (the watermark delay plus a batch of events: ~1M ids at
20,000 events/s), and that cost grows with the batch, which grows with it: seconds per batch.
Here each batch adds its own chunk (its on-time ids, cut from their lineage so nothing is read
from Kafka again) and chunks are dropped once the watermark passes their newest event.

The index stands for bronze at one stream commit. It is used only when that commit is the one
the batch follows; otherwise (a new process, a re-run batch, another writer, a lost block) it is
rebuilt from bronze at the pinned version, so the lookup always answers exactly what a bronze
read would: the (event_date, event_id) of bronze rows with event_time above the watermark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

ID_COLUMNS = ("event_date", "event_id")
CHUNK_COLUMNS = (*ID_COLUMNS, "event_time")


def free_checkpointed(frame: DataFrame) -> None:
    """Drop a locally checkpointed frame's blocks (its DataFrame is not in the cache manager, so
    `unpersist()` would not reach them)."""
    try:
        frame._jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception:  # noqa: BLE001 - not a checkpointed frame, or its blocks are gone already
        pass


@dataclass
class _Chunk:
    frame: DataFrame  # locally checkpointed: CHUNK_COLUMNS of every copy
    newest_ms: int  # an upper bound of its event times: dropped once the watermark reaches it


@dataclass
class RecentIds:
    """Chunks of (event_date, event_id, event_time) standing for bronze's rows above the
    watermark at stream commit `version` (-1: nothing held)."""

    version: int = -1
    chunks: list[_Chunk] = field(default_factory=list)
    keep: bool = True  # False: hold nothing (every lookup reads bronze)

    def holds(self, version: int) -> bool:
        return self.version >= 0 and self.version == version

    def clear(self) -> None:
        for chunk in self.chunks:
            free_checkpointed(chunk.frame)
        self.chunks, self.version = [], -1

    def rebuild(self, bronze_above: DataFrame, version: int, newest_ms: int) -> None:
        """From bronze's rows above the watermark at `version`; `newest_ms` bounds their event
        times."""
        self.clear()
        chunk = bronze_above.select(*CHUNK_COLUMNS).localCheckpoint(eager=True)
        self.chunks = [_Chunk(chunk, newest_ms)]
        self.version = version

    def lookup(self, watermark_ms: int) -> DataFrame | None:
        """(event_date, event_id) held above `watermark_ms`; None when nothing is held."""
        live = [c.frame for c in self.chunks if c.newest_ms > watermark_ms]
        if not live:
            return None
        frame = live[0]
        for more in live[1:]:
            frame = frame.unionByName(more)
        return frame.where(F.col("event_time") > F.timestamp_millis(F.lit(watermark_ms))).select(
            *ID_COLUMNS)

    def advance(self, version: int, chunk: DataFrame | None, newest_ms: int | None,
                next_watermark_ms: int) -> None:
        """After the batch's bronze commit `version`: add its chunk (already checkpointed), drop
        the chunks the next watermark has passed."""
        if chunk is not None and newest_ms is not None:
            self.chunks.append(_Chunk(chunk, newest_ms))
        for gone in (c for c in self.chunks if c.newest_ms <= next_watermark_ms):
            free_checkpointed(gone.frame)
        self.chunks = [c for c in self.chunks if c.newest_ms > next_watermark_ms]
        self.version = version
