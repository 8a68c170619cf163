"""Where an ingest batch's per-record cost goes, step by step, on a cached in-memory batch (no
Kafka, no Delta log work): each step's wall time over BENCH_STEP_EVENTS generated records
(default 400,000: a steady batch at 20,000/s is 150-200k), medians of BENCH_STEP_ROUNDS (3),
in µs per record. The steps are the batch's own functions (`transforms`), so a change to them
shows here first; `make profile` prices the whole batch with its commits.

    python -m bench.step_costs          (writes bench/results/step-costs-<timestamp>.json)
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import handwritten, write_result  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from testkit.generator import GeneratorConfig, generate  # noqa: E402


def _raw_frame(spark, n: int):
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

    now = datetime.now(UTC).replace(microsecond=0)
    recs = generate(GeneratorConfig(count=n, seed=5, end=now - timedelta(minutes=1),
                                    span=timedelta(minutes=10), keys=max(50, n // 200))).records
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                         StructField("topic", StringType()), StructField("partition", IntegerType()),
                         StructField("offset", LongType()), StructField("timestamp", TimestampType()),
                         StructField("timestampType", IntegerType())])
    rows = [(r.key, r.value, "events", i % 4, i, now, 1) for i, r in enumerate(recs)]
    return spark.createDataFrame(rows, schema).repartition(2).cache()


def main() -> int:
    from pyspark.sql import functions as F

    from spark_jobs.session import get_spark
    from spark_jobs.tables import ensure_tables
    from spark_jobs.transforms.ingest import counted_events
    from spark_jobs.transforms.parse import classify, valid_columns
    from spark_jobs.transforms.windows import aggregate_windows

    n = int(os.environ.get("BENCH_STEP_EVENTS", "400000"))
    rounds = int(os.environ.get("BENCH_STEP_ROUNDS", "3"))
    tmp = tempfile.mkdtemp(prefix="step-costs-")
    settings = Settings(lakehouse_root=tmp)
    spark = get_spark(settings)
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    raw = _raw_frame(spark, n)
    raw.count()
    shape = settings.shape

    def classified():
        return classify(raw, settings)

    def cached_valid():
        c = classified().persist()
        c.agg(F.count(F.when(F.col("reason").isNull(), 1))).first()
        return c

    steps = {}

    def time_it(name, fn, prepare=None):
        seconds = []
        for _ in range(rounds):
            state = prepare() if prepare else None
            t0 = time.perf_counter()
            fn(state)
            seconds.append(time.perf_counter() - t0)
            if state is not None and hasattr(state, "unpersist"):
                state.unpersist()
        steps[name] = {"median_s": round(statistics.median(seconds), 3),
                       "us_per_record": round(statistics.median(seconds) / n * 1e6, 2)}
        print(name, steps[name], flush=True)

    time_it("scan (cached input)", lambda _: raw.write.format("noop").mode("overwrite").save())
    time_it("classify", lambda _: classified().write.format("noop").mode("overwrite").save())
    time_it("classify + cache + counts", lambda _: cached_valid().unpersist())
    ensure_tables(spark, settings)  # bronze as the stream writes it (its statistics columns)

    def write_bronze(c):
        (c.where(F.col("reason").isNull()).select(
            *valid_columns(shape), F.current_timestamp().alias("ingested_at"),
            F.lit(0).cast("long").alias("bronze_batch_id"))
         .write.format("delta").mode("append").save(settings.table_path("bronze_events")))

    time_it("bronze write (from the cache)", write_bronze, cached_valid)

    def windows(c):
        on_time = c.where(F.col("reason").isNull()).select(*valid_columns(shape))
        aggregate_windows(counted_events(on_time, None, shape), settings).write.format(
            "noop").mode("overwrite").save()

    time_it("dedup + windows (from the cache)", windows, cached_valid)

    def ids_chunk(c):
        c.where(F.col("reason").isNull()).select("event_date", "event_id", "event_time") \
            .localCheckpoint(eager=True)

    time_it("ids chunk (from the cache)", ids_chunk, cached_valid)
    # The floor the service is compared with: what the hand-written live query does per record
    # (`bench.handwritten`: `from_json` into the declared types, 1-minute windows by key).
    time_it("hand-written peer: from_json",
            lambda _: handwritten.events(raw, shape).write.format("noop").mode("overwrite").save())
    time_it("hand-written peer: from_json + windows",
            lambda _: handwritten.windows(handwritten.events(raw, shape), shape).write.format(
                "noop").mode("overwrite").save())
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "events": n,
           "rounds": rounds, "load_avg": os.getloadavg(), "steps": steps}
    write_result("step-costs", out)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
