"""A/B of one ingest step's variants on a cached batch, interleaved round by round, priced in the
driver JVM's CPU seconds (its /proc utime + stime), which a loaded machine distorts much less
than wall time. The batch is BENCH_STEP_EVENTS generated records (default 200,000: a steady
batch at 20,000 events/s), classified once and cached; medians of BENCH_STEP_ROUNDS (5) after
the first (JIT warm-up). Written to bench/results/step-ab-<experiment>-<timestamp>.json.

    python -m bench.step_ab bronze      # bronze's append: the catalog's statistics columns vs
                                        # Delta's default (every column), codecs
    python -m bench.step_ab windows     # dedup + windows: the fingerprint as two long sums vs a
                                        # decimal per row; dedup's share
    python -m bench.step_ab classify    # the first job: classify + cache + counts, and its parts
    python -m bench.step_ab fields      # reading the event's fields: the VARIANT's per-field
                                        # gets (each a Cast built per row) against one struct
                                        # get and a typed from_json
    python -m bench.step_ab index       # the dedup's join against the earlier batches' ids:
                                        # as held today, hash-partitioned, from the dedup
    python -m bench.step_ab plan        # building the classification's and the quarantine's
                                        # expressions (wall time too: mostly the Python driver
                                        # and py4j, not the JVM)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import write_result  # noqa: E402
from bench.step_costs import _raw_frame, jvm_cpu_s, jvm_pid  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from testkit.results import commit_of  # noqa: E402


def _bronze(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    from pyspark.sql import functions as F

    from lakehouse.tables.catalog import BRONZE
    from spark_jobs.writer import STATS_COLUMNS

    rows = valid.select("*", F.current_timestamp().alias("ingested_at"),
                        F.lit(0).cast("long").alias("bronze_batch_id"))
    made = [0]

    def table(properties: dict[str, str], options: dict[str, str] | None = None,
              conf: dict[str, str] | None = None):
        made[0] += 1
        path = f"{tmp}/bronze-{made[0]}"
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        spark.sql(f"CREATE TABLE delta.`{path}` ({BRONZE.ddl}) USING delta PARTITIONED BY "
                  f"(event_date)" + (f" TBLPROPERTIES ({props})" if props else ""))

        def run():
            kept = {k: spark.conf.get(k, None) for k in (conf or {})}
            for k, v in (conf or {}).items():
                spark.conf.set(k, v)
            try:
                writer = rows.write.format("delta").mode("append")
                for k, v in (options or {}).items():
                    writer = writer.option(k, v)
                writer.save(path)
            finally:
                for k, v in kept.items():
                    if v is None:
                        spark.conf.unset(k)
                    else:
                        spark.conf.set(k, v)
        return run

    catalog = {STATS_COLUMNS: ",".join(BRONZE.stats_columns)}
    return {
        "statistics of every column (Delta's default)": lambda: table({}),
        "statistics of the catalog's columns": lambda: table(catalog),
        "no statistics": lambda: table({"delta.dataSkippingNumIndexedCols": "0"}),
        "catalog's columns, zstd": lambda: table(catalog, {"compression": "zstd"}),
        # A task writing several dates' files at once instead of sorting its rows by date first.
        "catalog's columns, concurrent writers (no sort by date)": lambda: table(
            catalog, conf={"spark.sql.maxConcurrentOutputFileWriters": "4"}),
        "catalog's columns, TIMESTAMP_MICROS": lambda: table(
            catalog, conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}),
        # A unique column's dictionary is built, overflows the page, and is thrown away.
        "catalog's columns, no dictionary for the unique columns": lambda: table(
            catalog, {f"parquet.enable.dictionary#{c}": "false"
                      for c in ("event_id", "offset", "attributes", "record_key")}),
    }


def _windows(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    from pyspark.sql import functions as F

    import spark_jobs.transforms.windows as W
    from spark_jobs.transforms.ingest import counted_events
    from spark_jobs.transforms.windows import aggregate_windows

    shape = settings.shape

    def aggregate(events, fingerprint_sum=None):
        def run():
            kept = W.fingerprint_sum
            if fingerprint_sum is not None:
                W.fingerprint_sum = fingerprint_sum
            try:
                aggregate_windows(events, settings).write.format("noop").mode("overwrite").save()
            finally:
                W.fingerprint_sum = kept
        return run

    def decimal_per_row(c):
        return F.sum(W.fingerprint(c)).cast("decimal(38,0)")

    deduped = counted_events(valid, None, shape)

    def repartitioned(order=("kafka_timestamp", "topic", "partition", "offset")):
        kept = (*shape.dimension_names, "event_time", *shape.measure_fields)
        first = F.min(F.struct(*order, *kept)).alias("f")
        return (valid.repartition("event_date", "event_id").groupBy("event_date", "event_id")
                .agg(first).select("event_date", "event_id",
                                   *[F.col(f"f.{c}").alias(c) for c in kept]))

    def twins_only():
        """Only the ids with a twin in the batch go through the dedup's shuffle: a narrow
        shuffle of (date, id) finds them (broadcast back), every other row is its own first
        copy and goes straight to the windows' map-side aggregation."""
        from spark_jobs.transforms.ingest import first_copies

        keys = ["event_date", "event_id"]
        twins = valid.groupBy(*keys).count().where(F.col("count") > 1).drop("count")
        singles = valid.join(F.broadcast(twins), keys, "left_anti").select(
            *keys, *shape.dimension_names, "event_time", *shape.measure_fields)
        return singles.unionByName(
            first_copies(valid.join(F.broadcast(twins), keys, "left_semi"), shape))

    return {
        "dedup of the ids with a twin only + windows": lambda: aggregate(twins_only()),
        "dedup (shuffled, then one sort) + windows":
            lambda: aggregate(repartitioned()),
        "dedup (shuffled, then one sort, no topic in the order) + windows":
            lambda: aggregate(repartitioned(("kafka_timestamp", "partition", "offset"))),
        "dedup + windows (fingerprint: two long sums)": lambda: aggregate(deduped),
        "dedup + windows (fingerprint: a decimal per row)":
            lambda: aggregate(deduped, decimal_per_row),
        "windows without the dedup": lambda: aggregate(valid),
    }


def _classify(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    """The batch's first job (classify, cache, the batch's counts) against parts of it: what the
    cache, the VARIANT's type lookups and the parse itself each cost."""
    from pyspark.sql import functions as F

    import spark_jobs.transforms.parse as P

    raw = valid.sparkSession.table("step_ab_raw")

    def facts(df):
        return df.agg(F.count(F.when(F.col("reason").isNull(), 1)),
                      F.max(F.unix_millis("event_time"))).collect()

    def cached():
        def run():
            c = P.classify(raw, settings).persist()
            facts(c)
            c.unpersist()
        return run

    def uncached():
        return lambda: facts(P.classify(raw, settings))

    def cached_with(shape_of=lambda df: df, keep=lambda df: df.persist()):
        """The first job, then bronze's read of the cache (every valid column, no write)."""
        def make():
            def run():
                c = keep(shape_of(P.classify(raw, settings)))
                facts(c)
                c.where(F.col("reason").isNull()).select(*P.valid_columns(settings.shape)) \
                    .write.format("noop").mode("overwrite").save()
                c.unpersist()  # (none for a local checkpoint: its blocks go with the DataFrame)
            return run
        return make

    only = P.quarantine_columns_only(settings.shape)
    extra = ["reason", "value_bytes"]

    def without_quarantine(df):
        return df.select(*P.valid_columns(settings.shape), *extra)

    def packed(df):
        return df.select(*P.valid_columns(settings.shape), *extra,
                         F.when(F.col("reason").isNotNull(), F.struct(*only)).alias("q"))

    def untyped():
        def run():
            # The patch is read when the expressions are built: built anew, then dropped.
            kept = F.schema_of_variant
            P.F.schema_of_variant = lambda c: F.lit("STRING")
            P._BUILT.clear()
            try:
                facts(P.classify(raw, settings))
            finally:
                P.F.schema_of_variant = kept
                P._BUILT.clear()
        return run

    def parse_only():
        return lambda: raw.select(F.try_parse_json(F.col("value").cast("string")).alias("v")).agg(
            F.count(F.when(F.col("v").isNotNull(), 1))).collect()

    return {
        "classify + cache + counts (the batch's first job)": cached,
        "the first job, then a read of the valid rows": cached_with(),
        "the same, the cache without the quarantine's columns": cached_with(without_quarantine),
        "the same, the quarantine's columns in one struct": cached_with(packed),
        "the same, kept as rows (localCheckpoint) instead of the columnar cache":
            cached_with(keep=lambda df: df.localCheckpoint(eager=False)),
        "classify + counts, no cache": uncached,
        "classify + counts, no type lookups (schema_of_variant)": untyped,
        "the JSON parse alone (try_parse_json)": parse_only,
    }


def _fields(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    """Reading the default event's four fields (event_id, key, event_time, value), after the
    parse or as the parse: `try_variant_get` builds and evaluates a `Cast` (and a SQLConf, on an
    executor thread) per field per row, a `variant` target does not; one struct get casts each
    field too; `from_json` parses and types in one pass (the measure as a VARIANT field, exact)."""
    from pyspark.sql import functions as F

    raw = valid.sparkSession.table("step_ab_raw")
    text = F.col("value").cast("string")
    parsed = raw.select(F.try_parse_json(F.concat(F.lit("["), text, F.lit(",0]"))).alias("v"))
    fields = ("event_id", "key", "event_time", "value")

    def noop(df):
        return lambda: df.write.format("noop").mode("overwrite").save()

    def gets(kind):
        return noop(parsed.select(*[F.try_variant_get("v", f"$[0].{f}", kind).alias(f)
                                    for f in fields]))

    strings = ", ".join(f"{f} string" for f in fields)
    return {
        "the parse alone ([payload,0] into a VARIANT)": lambda: noop(parsed),
        "the parse + four string gets (today's)": lambda: gets("string"),
        "the parse + four variant gets (no Cast)": lambda: gets("variant"),
        "the parse + one struct get of the four": lambda: noop(parsed.select(F.try_variant_get(
            "v", "$[0]", f"struct<{strings.replace(' string', ':string')}>").alias("s"))),
        "from_json of four strings": lambda: noop(raw.select(F.from_json(text, strings)
                                                              .alias("s"))),
        "from_json of three strings and a VARIANT measure": lambda: noop(raw.select(F.from_json(
            text, "event_id string, key string, event_time string, value variant").alias("s"))),
    }


def _plan(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    """A run's `classify` on a new DataFrame (what a catch-up, replay or redrive calls once):
    its expressions built anew against the process's built ones applied."""
    import spark_jobs.transforms.parse as P

    raw = valid.sparkSession.table("step_ab_raw")

    def anew():
        P._BUILT.clear()
        return lambda: P.classify(raw, settings).schema

    def reused():
        return lambda: P.classify(raw, settings).schema

    classified = P.classify(raw, settings)

    def quarantine_anew():
        P._BUILT.clear()
        return lambda: P.quarantine_projection(classified, settings).schema

    def quarantine_reused():
        return lambda: P.quarantine_projection(classified, settings).schema

    return {"classify's expressions built anew": anew,
            "classify's built expressions applied": reused,
            # A service's batch with a rejected record builds it (the classification is the
            # query's, built once).
            "the quarantine's projection built anew": quarantine_anew,
            "the quarantine's built projection applied": quarantine_reused}


def _index(spark, settings: Settings, valid, tmp: str) -> dict[str, Callable[[], Callable]]:
    """The dedup's join against the earlier batches' ids (BENCH_STEP_EARLIER of them, default
    600,000: the watermark's reach at 20,000 events/s) with the batch's own chunk of ids, as the
    service holds them (unpartitioned chunks, the planner's broadcast) against chunks held
    hash-partitioned like the dedup's output (a shuffled hash join, no exchange on their side),
    and against a checkpoint of the dedup's output itself (each id's newest copy time: the
    chunk, without a job of its own)."""
    from datetime import UTC, datetime

    from pyspark.sql import functions as F

    from bench.step_costs import _earlier_ids
    from spark_jobs.recent_ids import CHUNK_COLUMNS, ID_COLUMNS, free_checkpointed
    from spark_jobs.transforms.counting import ARRIVAL_ORDER
    from spark_jobs.transforms.ingest import first_copies
    from spark_jobs.transforms.windows import aggregate_windows

    shape, n = settings.shape, int(os.environ.get("BENCH_STEP_EARLIER", "600000"))
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    held = _earlier_ids(spark, n, datetime.now(UTC).replace(microsecond=0))
    today = held.lookup(0)
    hashed = [c.frame.repartition(parts, *ID_COLUMNS).localCheckpoint(eager=True)
              for c in held.chunks]
    index = hashed[0]
    for more in hashed[1:]:
        index = index.unionByName(more)
    index = index.where(F.col("event_time") > F.timestamp_millis(F.lit(0))).select(
        *ID_COLUMNS).hint("shuffle_hash")
    keys = ["event_date", "event_id"]

    def windows(events) -> None:
        aggregate_windows(events, settings).write.format("noop").mode("overwrite").save()

    def as_today():
        def run():
            chunk = valid.select(*CHUNK_COLUMNS).localCheckpoint(eager=True)
            windows(first_copies(valid, shape).join(today, keys, "left_anti"))
            free_checkpointed(chunk)
        return run

    def partitioned():
        def run():
            chunk = valid.select(*CHUNK_COLUMNS).repartition(parts, *ID_COLUMNS).localCheckpoint(
                eager=True)
            windows(first_copies(valid, shape).join(index, keys, "left_anti"))
            free_checkpointed(chunk)
        return run

    def from_firsts():
        kept = (*shape.dimension_names, "event_time", *shape.measure_fields)

        def run():
            firsts = valid.groupBy(*keys).agg(
                F.min(F.struct(*ARRIVAL_ORDER, *kept)).alias("f"),
                F.max("event_time").alias("newest")).select(
                *keys, *[F.col(f"f.{c}").alias(c) for c in kept], "newest").localCheckpoint(
                eager=True)
            windows(firsts.drop("newest").join(index, keys, "left_anti"))
            free_checkpointed(firsts)
        return run

    return {
        "chunk + dedup against unpartitioned chunks (broadcast) + windows": as_today,
        "hash-partitioned chunk + dedup (shuffled hash join) + windows": partitioned,
        "checkpointed dedup output as the chunk + shuffled hash join + windows": from_firsts,
    }


EXPERIMENTS = {"bronze": _bronze, "windows": _windows, "classify": _classify, "fields": _fields,
               "plan": _plan, "index": _index}


def main() -> int:
    from pyspark.sql import functions as F

    from spark_jobs.session import get_spark
    from spark_jobs.transforms.parse import classify, valid_columns

    experiment = sys.argv[1] if len(sys.argv) > 1 else ""
    if experiment not in EXPERIMENTS:
        print(f"usage: python -m bench.step_ab {{{','.join(EXPERIMENTS)}}}", file=sys.stderr)
        return 2
    n = int(os.environ.get("BENCH_STEP_EVENTS", "200000"))
    rounds = int(os.environ.get("BENCH_STEP_ROUNDS", "5"))
    tmp = tempfile.mkdtemp(prefix="step-ab-")
    settings = Settings(lakehouse_root=tmp)
    spark = get_spark(settings)
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as the ingest query's session
    raw = _raw_frame(spark, n)
    raw.createOrReplaceTempView("step_ab_raw")
    classified = classify(raw, settings).persist()
    valid = classified.where(F.col("reason").isNull()).select(
        *valid_columns(settings.shape)).cache()
    valid.count()
    variants = EXPERIMENTS[experiment](spark, settings, valid, tmp)
    pid = jvm_pid(spark)

    def cpu_s() -> float:
        return jvm_cpu_s(pid)

    seconds: dict[str, list[float]] = {k: [] for k in variants}
    walls: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, make in variants.items():
            run = make()
            t0, w0 = cpu_s(), time.perf_counter()
            run()
            seconds[name].append(round(cpu_s() - t0, 3))
            walls[name].append(round(time.perf_counter() - w0, 3))

    def median(values: list[float]) -> float:
        return statistics.median(values[1:] if len(values) > 2 else values)

    steps = {}
    for name, values in seconds.items():
        steps[name] = {"cpu_s_median": round(median(values), 3),
                       "cpu_us_per_record": round(median(values) / n * 1e6, 2), "cpu_s": values,
                       "wall_s_median": round(median(walls[name]), 3), "wall_s": walls[name]}
        print(f"{name:55s} {steps[name]['cpu_us_per_record']:6.2f} µs CPU a record, "
              f"{steps[name]['wall_s_median']:.3f} s wall")
    write_result(f"step-ab-{experiment}", {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit_of(),
        "events": n, "rounds": rounds,
        "load_avg": os.getloadavg(), "valid_events": valid.count(), "steps": steps})
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
