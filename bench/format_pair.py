"""The Avro orders pipeline's catch-up next to the JSON one, interleaved across the two: a topic of
BENCH_EVENTS (default 300,000) generated events each (`examples/orders.yaml`,
`examples/orders_avro.yaml`), every job warmed on a small topic, then BENCH_ROUNDS (3) rounds of
product, naive peer and fair peer (`bench/handwritten.py`: `from_json`, or `from_avro` for the Avro
topic), each job run on one pipeline then the other. Medians to bench/results/format-pair-<date>.json,
with the product's Spark job seconds by step (Spark's REST API: the UI is on) in its last round.

    python -m bench.format_pair      (a broker at KAFKA_BOOTSTRAP_SERVERS; `make kafka-up`)
"""

from __future__ import annotations

import os
import platform
import statistics
import uuid
from collections import Counter
from datetime import UTC, datetime

from bench import handwritten, spark_ui, write_result
from bench.ratios import WORK, records, settings_for, timed
from lakehouse.specs.pipeline import load_spec


def main() -> int:
    from lakehouse.kafka.admin import ensure_topic
    from spark_jobs import stream
    from spark_jobs.session import get_spark
    from spark_jobs.writer import ensure_tables
    from testkit.generator import produce

    n = int(os.environ.get("BENCH_EVENTS", "300000"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    specs = {k: load_spec(f"examples/{k}.yaml") for k in ("orders", "orders_avro")}
    os.environ["SPARK_UI"] = "true"  # the product's steps, from Spark's REST API
    spark = get_spark(settings_for("bench", "base"))
    ui = spark.sparkContext.uiWebUrl
    steps = {}
    topics = {}
    for k, spec in specs.items():
        for kind, count in (("warm", 20_000), ("main", n)):
            topic = f"pair-{kind}-{k.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
            s = settings_for(topic, "produce", spec)
            ensure_topic(s)
            produce(s, records(count, 7, spec))
            topics[k, kind] = topic
    runs = Counter()

    def fresh() -> None:
        spark.catalog.clearCache()
        spark.sparkContext._jvm.System.gc()

    def product(k: str, topic: str) -> float:
        fresh()
        runs["n"] += 1
        s = settings_for(topic, f"product-{runs['n']}", specs[k])
        ensure_tables(spark, s)
        before = {j["jobId"] for j in spark_ui.jobs(ui)}
        seconds = timed(lambda: stream.catch_up(spark, s))
        steps[k] = spark_ui.by_step([j for j in spark_ui.jobs(ui) if j["jobId"] not in before])
        return seconds

    def peer(job):
        def run(k: str, topic: str) -> float:
            fresh()
            runs["n"] += 1
            out = str(WORK / f"peer-{runs['n']}")
            return timed(lambda: job(spark, settings_for(topic, "peer", specs[k]), out + "/out",
                                     out + "/ck", n))
        return run

    jobs = {"product": product, "naive_peer": peer(handwritten.streaming_job),
            "fair_peer": peer(handwritten.fair_streaming_job)}
    for k in specs:
        for job in jobs.values():
            job(k, topics[k, "warm"])
    times = {k: {j: [] for j in jobs} for k in specs}
    for _ in range(rounds):
        for j, job in jobs.items():
            for k in specs:
                times[k][j].append(round(job(k, topics[k, "main"]), 2))
    medians = {k: {j: statistics.median(v) for j, v in t.items()} for k, t in times.items()}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "events": n, "rounds": rounds, "catch_up_s": times, "catch_up_median_s": medians,
        "ratio_vs_naive_peer": {k: round(m["naive_peer"] / m["product"], 2)
                                for k, m in medians.items()},
        "avro_over_json_product": round(medians["orders_avro"]["product"]
                                        / medians["orders"]["product"], 2),
        "product_steps_last_round": steps,
    }
    print(result, flush=True)
    write_result("format-pair", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
