"""`make bench-commits`: what one small Delta commit costs on this machine, by kind, and how many
Spark jobs it runs. The stream's per-batch fixed cost is mostly such commits.

The finding it reproduces: an idempotent append (txnAppId/txnVersion, how every stream batch
writes exactly once) runs 4 Spark jobs where a plain append runs 1, because Delta 4.3 reads the
table's SetTransactions from the reconstructed snapshot state (`txnVersion` ->
`snapshot.transactions` -> `computedState`), not from the version checksum that also holds them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime

from bench import write_result

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

REPEAT = 4


def main() -> int:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from lakehouse.config.settings import Settings
    from spark_jobs.session import get_spark

    root = f"/tmp/lakehouse-commits-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env({**os.environ, "LAKEHOUSE_ROOT": root})
    spark = get_spark(settings)
    sc = spark.sparkContext
    path = f"{root}/t"
    spark.range(100_000).selectExpr(
        "id", "date_add(date'2026-11-01', cast(id % 5 as int)) as d", "'open' as status",
    ).write.format("delta").partitionBy("d").save(path)
    rows = spark.range(3).selectExpr("id", "date'2026-11-05' as d", "'open' as status")
    table = DeltaTable.forPath(spark, path)

    def plain(_):
        rows.write.format("delta").mode("append").save(path)

    def idempotent(i):
        rows.write.format("delta").mode("append").option("txnAppId", "bench") \
            .option("txnVersion", i).save(path)

    def update_nothing(_):
        table.update(condition=(F.col("d") == F.lit("2026-11-05")) & (F.col("id") < 0),
                     set={"status": F.lit("final")})

    def update_one_row(_):
        table.update(condition=(F.col("d") == F.lit("2026-11-05")) & (F.col("id") == 4),
                     set={"status": F.lit("final")})

    out = {}
    for name, op in (("append_3_rows", plain), ("idempotent_append_3_rows", idempotent),
                     ("update_matching_nothing", update_nothing),
                     ("update_one_row_of_20k", update_one_row)):
        seconds, jobs = [], 0
        for i in range(REPEAT):
            sc.setJobGroup(f"{name}-{i}", name)
            t0 = time.perf_counter()
            op(i)
            seconds.append(round(time.perf_counter() - t0, 2))
            jobs = len(sc.statusTracker().getJobIdsForGroup(f"{name}-{i}"))
        # The first call pays JIT and caches: the median of the rest.
        warm = sorted(seconds[1:])
        out[name] = {"seconds": seconds, "warm_median_s": warm[len(warm) // 2],
                     "spark_jobs": jobs}
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": f"{os.cpu_count()} cores", **out}
    print(json.dumps(result, indent=2))
    write_result("commits", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
