"""What a Spark job cost, measured around it in the driver's JVM: CPU seconds of the JVM process
and the Hadoop file systems' counters (`FileSystem.getGlobalStorageStatistics`: per scheme, the
bytes and operations; on `s3a://` also S3A's requests by kind, such as `object_get_request`,
`object_put_request`, `object_list_request`).

On a local master the executors are threads of the driver's JVM, so both cover the whole job.
On a cluster they cover the driver only (the executors' work is in the Spark UI's stages), and
over Spark Connect nothing is measured here (the server's JVM is another process): `measured`
then holds `{"measured_in": "spark_connect: not measured"}`."""

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


def _cpu_ms(jvm) -> int | None:
    duration = jvm.java.lang.ProcessHandle.current().info().totalCpuDuration()
    return int(duration.get().toMillis()) if duration.isPresent() else None


@contextmanager
def measured(spark: SparkSession) -> Iterator[dict]:
    """A dict filled when the block ends: `wall_s`, `jvm_cpu_s` (the driver JVM's process CPU),
    `storage` (the counters that moved), `measured_in` (`local` or `driver`)."""
    jvm = getattr(spark, "_jvm", None)
    out: dict = {}
    t0 = time.monotonic()
    if jvm is None:
        out["measured_in"] = "spark_connect: not measured"
        yield out
        out["wall_s"] = round(time.monotonic() - t0, 3)
        return
    before, cpu0 = _counters(jvm), _cpu_ms(jvm)
    yield out
    after, cpu1 = _counters(jvm), _cpu_ms(jvm)
    master = spark.sparkContext.master
    out.update(
        wall_s=round(time.monotonic() - t0, 3),
        jvm_cpu_s=round((cpu1 - cpu0) / 1000, 3) if cpu0 is not None and cpu1 is not None else None,
        storage={k: v - before.get(k, 0) for k, v in sorted(after.items())
                 if v != before.get(k, 0)},
        measured_in="local" if master.startswith("local") else "driver",
    )
