"""What a Spark job cost, measured around it in the driver's JVM: CPU seconds of the JVM process,
the executors' CPU seconds of the stages that ran meanwhile (the driver's live status store,
which Spark keeps with or without its UI, for `spark.ui.retainedStages` stages), and the Hadoop
file systems' counters (`FileSystem.getGlobalStorageStatistics`: per scheme, the
bytes and operations; on `s3a://` also S3A's requests by kind, such as `object_get_request`,
`object_put_request`, `object_list_request`).

On a local master the executors are threads of the driver's JVM, so its CPU covers the whole
job; on a cluster it covers the driver, and `executors_cpu_s` the tasks on the executors
(the file systems' counters stay the driver's: the executors' are theirs). Over Spark Connect
nothing is measured here (the server's JVM is another process): `measured` then holds
`{"measured_in": "spark_connect: not measured"}`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession


def _counters(jvm) -> dict[str, int]:
    """Every long counter of the JVM's Hadoop storage statistics, as `<scheme>.<name>`."""
    out: dict[str, int] = {}
    stats = jvm.org.apache.hadoop.fs.FileSystem.getGlobalStorageStatistics().iterator()
    while stats.hasNext():
        st = stats.next()
        scheme = st.getScheme() or st.getName()
        values = st.getLongStatistics()
        while values.hasNext():
            v = values.next()
            out[f"{scheme}.{v.getName()}"] = int(v.getValue())
    return out


def _next_stage(spark: SparkSession) -> int | None:
    """The id the driver's scheduler gives its next stage; None where it cannot be read (the
    scheduler's and the status store's calls here are Spark's own API, not a public one: a
    release that changes them costs the figure, never the job)."""
    try:
        return int(spark.sparkContext._jsc.sc().dagScheduler().nextStageId())
    except Exception:  # noqa: BLE001 - the figure is optional, the job is not
        return None


def _executors_cpu_s(spark: SparkSession, first: int | None, end: int | None) -> float | None:
    """The executors' CPU seconds of stages `first`..`end - 1` (their last attempts), from the
    driver's live status store; a stage it no longer holds counts nothing."""
    if first is None or end is None:
        return None
    try:
        store = spark.sparkContext._jsc.sc().statusStore()
    except Exception:  # noqa: BLE001
        return None
    ns = 0
    for stage in range(first, end):
        try:
            ns += int(store.lastStageAttempt(stage).executorCpuTime())
        except Exception:  # noqa: BLE001 - evicted (spark.ui.retainedStages), or never ran
            continue
    return round(ns / 1e9, 3)


def _cpu_ms(jvm) -> int | None:
    duration = jvm.java.lang.ProcessHandle.current().info().totalCpuDuration()
    return int(duration.get().toMillis()) if duration.isPresent() else None


@contextmanager
def measured(spark: SparkSession) -> Iterator[dict]:
    """A dict filled when the block ends: `wall_s`, `jvm_cpu_s` (the driver JVM's process CPU),
    `executors_cpu_s` (the tasks' CPU of the block's stages, wherever they ran), `storage` (the
    counters that moved), `measured_in` (`local` or `driver`)."""
    jvm = getattr(spark, "_jvm", None)
    out: dict = {}
    t0 = time.monotonic()
    if jvm is None:
        out["measured_in"] = "spark_connect: not measured"
        yield out
        out["wall_s"] = round(time.monotonic() - t0, 3)
        return
    before, cpu0, stage0 = _counters(jvm), _cpu_ms(jvm), _next_stage(spark)
    yield out
    after, cpu1, stage1 = _counters(jvm), _cpu_ms(jvm), _next_stage(spark)
    master = spark.sparkContext.master
    out.update(
        wall_s=round(time.monotonic() - t0, 3),
        jvm_cpu_s=round((cpu1 - cpu0) / 1000, 3) if cpu0 is not None and cpu1 is not None else None,
        executors_cpu_s=_executors_cpu_s(spark, stage0, stage1),
        storage={k: v - before.get(k, 0) for k, v in sorted(after.items())
                 if v != before.get(k, 0)},
        measured_in="local" if master.startswith("local") else "driver",
    )
