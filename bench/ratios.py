"""`make bench` (first part): the product against the jobs a user would write by hand
(`bench/handwritten.py`) on the same topic, fairly.

- One warm SparkSession; the product and every peer first run on a small topic (JIT, codegen,
  the Kafka consumer pool), so neither side pays the start-up the other skipped.
- The stream catch-up of a BENCH_EVENTS-event topic (default 2,000,000) and its peers run
  interleaved (product, naive peer, fair peer, product, ...), each run on a fresh lakehouse root
  and checkpoint, BENCH_ROUNDS times (default 3); reported: the medians and their ratios.
- Every run counts the same events: the peers' parsed events are checked against bronze.
- The replay of the larger date against the hand-written batch job on the same offset range,
  interleaved the same way.
- The same catch-up comparison for specs' pipelines (BENCH_PIPELINE, comma-separated, default
  examples/orders.yaml and examples/orders_avro.yaml; empty to skip): their events from `testkit.spec_events`, the peers
  written for their fields (`handwritten.schema`; an Avro spec's peers decode with `from_avro`),
  reported next to the default pipeline's ratios.
Results: bench/results/bench-<date>.json. Compare ratios within a run, not across runs.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from bench import handwritten, write_result  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from lakehouse.specs.pipeline import PipelineSpec, load_spec  # noqa: E402
from testkit.generator import GeneratorConfig, generate, produce  # noqa: E402
from testkit.spec_events import generate_for_spec  # noqa: E402

WORK = Path("/tmp") / f"lakehouse-bench-{uuid.uuid4().hex[:6]}"


def records(count: int, seed: int, spec: PipelineSpec | None = None) -> list:
    """`count` events over two dates (a fifth on the first): ISO and epoch-ms times, late,
    duplicate and malformed records as the generator mixes them (a spec's: its own fields)."""
    end = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=1)
    cfg = GeneratorConfig(count=count, seed=seed, end=end, span=timedelta(hours=30),
                          keys=max(50, count // 200))
    return (generate_for_spec(spec, cfg) if spec else generate(cfg)).records


def settings_for(topic: str, run: str, spec: PipelineSpec | None = None) -> Settings:
    base = Settings.from_env({**os.environ, "EVENTS_TOPIC": topic,
                              "LAKEHOUSE_ROOT": str(WORK / run)})
    if spec is None:
        return base
    return spec.settings(base, os.environ).model_copy(update={"events_topic": topic})


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def catch_up_ratios(spark, n: int, rounds: int, counter: Counter,
                    spec: PipelineSpec | None = None) -> tuple[dict, Settings, Settings]:
    """The catch-up of an n-event topic by the product and its two peers, warmed, interleaved,
    `rounds` times each on fresh roots: (the medians, their ratios and both sides' event counts;
    the last product run's settings; the topic's settings)."""
    from lakehouse.kafka.admin import ensure_topic
    from spark_jobs import stream
    from spark_jobs.writer import ensure_tables

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    warm_topic = f"bench-warm-{uuid.uuid4().hex[:8]}"
    base = settings_for(topic, "base", spec)
    for t, count in ((warm_topic, 20_000), (topic, n)):
        s = settings_for(t, "produce", spec)
        ensure_topic(s)
        t0 = time.perf_counter()
        produce(s, records(count, seed=7, spec=spec))
        if t == topic:
            produce_s = time.perf_counter() - t0

    def fresh_memory() -> None:
        """Each run starts with the same free memory (no cached blocks of the previous one)."""
        spark.catalog.clearCache()
        spark.sparkContext._jvm.System.gc()

    def product(t: str) -> float:
        fresh_memory()
        counter["run"] += 1
        s = settings_for(t, f"product-{counter['run']}", spec)
        ensure_tables(spark, s)  # creating ten tables is set-up, not catch-up
        return timed(lambda: stream.catch_up(spark, s))

    def peer(t: str, job) -> float:
        fresh_memory()
        counter["run"] += 1
        out = str(WORK / f"peer-{counter['run']}")
        return timed(lambda: job(spark, settings_for(t, "peer", spec), out + "/out", out + "/ck",
                                 n))

    naive = handwritten.streaming_job
    fair = handwritten.fair_streaming_job
    # Warm-up on the small topic: every job once.
    product(warm_topic), peer(warm_topic, naive), peer(warm_topic, fair)

    catch_up = {"product": [], "naive_peer": [], "fair_peer": []}
    for _ in range(rounds):
        catch_up["product"].append(product(topic))
        catch_up["naive_peer"].append(peer(topic, naive))
        catch_up["fair_peer"].append(peer(topic, fair))
    last_product = settings_for(topic, f"product-{counter['run'] - 2}", spec)

    # Same events on both sides: the peer's parsed events vs the product's bronze.
    bronze_rows = spark.read.format("delta").load(last_product.table_path("bronze_events")).count()
    raw = spark.read.format("kafka").options(**base.spark_kafka_options).option(
        "subscribe", topic).option("startingOffsets", "earliest").load()
    peer_events = handwritten.events(raw, base.shape).count()
    med = {k: statistics.median(v) for k, v in catch_up.items()}
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "pipeline": base.pipeline,
        "events": n, "rounds": rounds, "produce_records_per_s": round(n / produce_s),
        "same_events": {"product_bronze_rows": bronze_rows, "peer_parsed_events": peer_events},
        "catch_up_s": {k: [round(x, 2) for x in v] for k, v in catch_up.items()},
        "catch_up_median_s": {k: round(v, 2) for k, v in med.items()},
        "catch_up_records_per_s": {k: round(n / v) for k, v in med.items()},
        "catch_up_ratio_vs_naive_peer": round(med["naive_peer"] / med["product"], 2),
        "catch_up_ratio_vs_fair_peer": round(med["fair_peer"] / med["product"], 2),
    }, last_product, base


def main() -> int:
    from pyspark.sql import functions as F

    from lakehouse.kafka.log_ranges import offset_ranges
    from spark_jobs.replay import run_replay
    from spark_jobs.session import get_spark

    n = int(os.environ.get("BENCH_EVENTS", "2000000"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    specs = [load_spec(p.strip()) for p in os.environ.get(
        "BENCH_PIPELINE", "examples/orders.yaml,examples/orders_avro.yaml").split(",")
        if p.strip()]
    spark = get_spark(settings_for("bench", "base"))
    counter = Counter()
    result, last_product, base = catch_up_ratios(spark, n, rounds, counter)
    bronze = spark.read.format("delta").load(last_product.table_path("bronze_events"))

    # Replay of the larger date, on the range the product's own replay reads.
    sizes = {r.event_date: r.n for r in bronze.groupBy("event_date").agg(
        F.count("*").alias("n")).collect()}
    day = max(sizes, key=sizes.get)
    ranges, _ = offset_ranges(last_product, day)
    replay = {"product": [], "batch_peer": []}
    run_replay(spark, last_product, day)  # warm
    handwritten.batch_job(spark, base, str(WORK / "batch-warm"), day, ranges)
    for i in range(rounds):
        replay["product"].append(timed(lambda: run_replay(spark, last_product, day)))
        replay["batch_peer"].append(timed(lambda i=i: handwritten.batch_job(
            spark, base, str(WORK / f"batch-{i}"), day, ranges)))

    rmed = {k: statistics.median(v) for k, v in replay.items()}
    result.update({
        "replay_date": day.isoformat(), "replay_date_events": sizes[day],
        "replay_s": {k: [round(x, 2) for x in v] for k, v in replay.items()},
        "replay_median_s": {k: round(v, 2) for k, v in rmed.items()},
        "replay_ratio_vs_batch_peer": round(rmed["batch_peer"] / rmed["product"], 2),
    })
    if specs:  # the same catch-up comparison for specs' pipelines, next to it
        result["pipelines"] = {
            "default": {k: result[k] for k in ("catch_up_median_s", "catch_up_ratio_vs_naive_peer",
                                               "catch_up_ratio_vs_fair_peer")},
            **{spec.name: catch_up_ratios(spark, n, rounds, counter, spec)[0] for spec in specs},
        }
    print(result, flush=True)
    write_result("bench", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
