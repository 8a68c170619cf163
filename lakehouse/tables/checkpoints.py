"""Read what Spark's streaming checkpoint records about each micro-batch.

`offsets/<batchId>` is the write-ahead log of a batch: written before the batch runs, it holds
the watermark the batch uses (`batchWatermarkMs`) and the end offset of each source; the start
is the previous batch's end (docs/design.md §12). Files are read through `lakehouse.config.storage` (local
disk, or pyarrow's object-store clients), never the driver's JVM: a run that finds nothing to do
reads the checkpoint without starting one (`spark_jobs.stream.caught_up`), and a Spark Connect run
(no JVM in its process) reads it too. (Moving a checkpoint aside renames through Hadoop's
FileSystem: the catch-up's, `spark_jobs.stream`.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lakehouse.config import storage


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    watermark_ms: int
    sources: list[dict | None]


def batch_offsets(checkpoint: str, batch_id: int) -> BatchOffsets | None:
    text = storage.read_text(f"{checkpoint}/offsets/{batch_id}")
    if text is None:
        return None
    lines = text.strip().splitlines()
    meta = json.loads(lines[1])
    sources = [None if s.strip() == "-" else json.loads(s) for s in lines[2:]]
    return BatchOffsets(batch_id, int(meta.get("batchWatermarkMs", 0)), sources)


def query_id(checkpoint: str) -> str | None:
    """The query's persistent id: new with a new checkpoint, stable across restarts."""
    text = storage.read_text(f"{checkpoint}/metadata")
    return json.loads(text)["id"] if text else None


def batch_ids(checkpoint: str, log: str) -> list[int]:
    """The batch ids of the checkpoint's `log` (`offsets`: started, `commits`: completed)."""
    return sorted(int(n) for n in storage.list_names(f"{checkpoint}/{log}") if n.isdigit())


def last_committed_batch(checkpoint: str) -> int | None:
    ids = batch_ids(checkpoint, "commits")
    return ids[-1] if ids else None


def committed_position(checkpoint: str, topic: str) -> dict[int, int]:
    """The end offsets of the checkpoint's last committed batch: where it resumes ({} when no
    batch committed)."""
    last = last_committed_batch(checkpoint)
    found = batch_offsets(checkpoint, last) if last is not None else None
    if found is None or not found.sources or not found.sources[0]:
        return {}
    return {int(p): int(o) for p, o in (found.sources[0].get(topic) or {}).items()}


def last_commit_time(checkpoint: str) -> float | None:
    """Modification time (epoch seconds) of the newest batch commit: the checkpoint's age."""
    last = last_committed_batch(checkpoint)
    return None if last is None else storage.modified_at(f"{checkpoint}/commits/{last}")
