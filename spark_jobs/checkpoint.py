"""Read what Spark's streaming checkpoint records about each micro-batch.

`offsets/<batchId>` is the write-ahead log of a batch: written before the batch runs, it holds
the watermark the batch uses (`batchWatermarkMs`) and the end offset of each source; the start
is the previous batch's end (docs/design.md §12). Files are read through `lakehouse.config.storage` (local
disk, or pyarrow's object-store clients), never the driver's JVM: a run that finds nothing to do
reads the checkpoint without starting one (`spark_jobs.stream.caught_up`), and a Spark Connect run
(no JVM in its process) reads it too. The `spark` arguments stay for the callers; only
`move_aside` (the catch-up's, which always runs classic) renames through Hadoop's FileSystem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.config import storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def read_text(_spark: SparkSession | None, path: str) -> str | None:
    return storage.read_text(path)


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    watermark_ms: int
    sources: list[dict | None]


def batch_offsets(spark: SparkSession | None, checkpoint: str, batch_id: int) -> BatchOffsets | None:
    text = read_text(spark, f"{checkpoint}/offsets/{batch_id}")
    if text is None:
        return None
    lines = text.strip().splitlines()
    meta = json.loads(lines[1])
    sources = [None if s.strip() == "-" else json.loads(s) for s in lines[2:]]
    return BatchOffsets(batch_id, int(meta.get("batchWatermarkMs", 0)), sources)


def query_id(spark: SparkSession, checkpoint: str) -> str | None:
    """The query's persistent id: new with a new checkpoint, stable across restarts."""
    text = read_text(spark, f"{checkpoint}/metadata")
    return json.loads(text)["id"] if text else None


def batch_ids(_spark: SparkSession | None, checkpoint: str, log: str) -> list[int]:
    """The batch ids of the checkpoint's `log` (`offsets`: started, `commits`: completed)."""
    return sorted(int(n) for n in storage.list_names(f"{checkpoint}/{log}") if n.isdigit())


def last_committed_batch(_spark: SparkSession | None, checkpoint: str) -> int | None:
    ids = batch_ids(None, checkpoint, "commits")
    return ids[-1] if ids else None


def committed_position(spark: SparkSession | None, checkpoint: str, topic: str) -> dict[int, int]:
    """The end offsets of the checkpoint's last committed batch: where it resumes ({} when no
    batch committed)."""
    last = last_committed_batch(spark, checkpoint)
    found = batch_offsets(spark, checkpoint, last) if last is not None else None
    if found is None or not found.sources or not found.sources[0]:
        return {}
    return {int(p): int(o) for p, o in (found.sources[0].get(topic) or {}).items()}


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


def last_commit_time(_spark: SparkSession | None, checkpoint: str) -> float | None:
    """Modification time (epoch seconds) of the newest batch commit: the checkpoint's age."""
    last = last_committed_batch(None, checkpoint)
    return None if last is None else storage.modified_at(f"{checkpoint}/commits/{last}")
