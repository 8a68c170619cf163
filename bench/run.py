"""`make bench-stages`: throughput of each stage on this machine, written to bench/results/
(`stages-<date>.json`; the ratios against hand-written jobs are `bench/ratios.py`).

One run measures, on the same generated data and one warm SparkSession:
- the raw limit: a confluent-kafka consumer and Kafka's ConsumerPerformance on the topic
  (`bench/raw_consume.py`);
- parse: `classify` (exact values, all reason codes) vs. a bare `from_json` baseline (ratio);
- the stream catch-up (availableNow, the one-pass ingest), records/s;
- corrections on two dates of different sizes (a small one and one 8x larger): the first
  (whole-date) run vs. an incremental run after the same few late events. The whole-date cost
  grows with the date; the incremental cost should follow the windows touched, so its ratio
  between the two dates stays near 1;
- replay of the large date;
- the run metadata of an idle catch-up (nothing new) on this lakehouse vs. on a fresh one: it
  comes from the Delta log and the run's own rows, so the ratio should stay near 1;
- at scale (BENCH_AT_SCALE=1; history written by `bench/history.py`): an empty catch-up on a
  fresh lakehouse vs. this one plus 20M bronze rows, and corrections on a 5M-event date.
Compare the ratios within one run, not absolute numbers across machines or runs.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from bench import write_result  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from testkit.generator import GeneratorConfig, generate, produce  # noqa: E402

LATE_EVENTS = 50


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def day_at(days_ago: int, hour: int) -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days_ago) + timedelta(hours=hour)


def events_on(days_ago: int, count: int, seed: int) -> list:
    """`count` events between 06:00 and 18:00 of that day, keys spread so windows grow with it."""
    config = GeneratorConfig(count=count, seed=seed, end=day_at(days_ago, 18),
                             span=timedelta(hours=12), keys=max(50, count // 20))
    return generate(config).records


def late_events_for(days_ago: int, seed: int, count: int = LATE_EVENTS) -> list:
    config = GeneratorConfig(count=count, seed=seed, end=day_at(days_ago, 2),
                             span=timedelta(minutes=30), malformed_fraction=0,
                             duplicate_fraction=0, late_fraction=0)
    return generate(config).records


def idle_run_metadata(settings) -> None:
    from lakehouse.tables.run_metadata import bronze_summary, streaming_summary

    bronze_summary(settings, [])
    streaming_summary(settings, [])


def idle_run_metadata_seconds(spark, settings) -> dict:
    """Seconds of an idle run's metadata (best of 3) here and on a fresh, empty lakehouse."""
    from spark_jobs.writer import ensure_tables

    fresh = Settings.from_env({**os.environ,
                               "LAKEHOUSE_ROOT": f"{settings.lakehouse_root}-fresh"})
    ensure_tables(spark, fresh)
    return {name: round(min(timed(lambda s=s: idle_run_metadata(s))[1]
                            for _ in range(3)), 2)
            for name, s in (("fresh", fresh), ("history", settings))}


def idle_catch_up_seconds(spark, settings) -> float:
    """An empty catch-up: both queries with nothing new, then the run metadata (best of 2)."""
    from spark_jobs import stream

    def run():
        stream.catch_up(spark, settings)
        idle_run_metadata(settings)

    run()
    return round(min(timed(run)[1] for _ in range(2)), 2)


def at_scale(spark, settings) -> dict:
    """The idle catch-up on a fresh lakehouse vs. this one with BENCH_HISTORY_ROWS (20M) more
    bronze rows; corrections on a date of BENCH_BIG_DATE_EVENTS (5M): the whole date, a run
    with nothing new, and an incremental run after 0.1% late events."""
    from bench.history import add_bronze, add_history
    from lakehouse.kafka.admin import ensure_topic
    from spark_jobs import stream
    from spark_jobs.corrections import run_corrections
    from spark_jobs.writer import ensure_tables

    fresh = Settings.from_env({**os.environ, "LAKEHOUSE_ROOT": f"{settings.lakehouse_root}-empty",
                               "EVENTS_TOPIC": f"{settings.events_topic}-empty"})
    ensure_topic(fresh)
    ensure_tables(spark, fresh)
    history_rows = int(os.environ.get("BENCH_HISTORY_ROWS", "20000000"))
    _, history_s = timed(lambda: add_history(spark, settings, history_rows, day_at(10, 0).date()))
    idle = {"fresh": idle_catch_up_seconds(spark, fresh),
            "history": idle_catch_up_seconds(spark, settings)}

    big = int(os.environ.get("BENCH_BIG_DATE_EVENTS", "5000000"))
    day = day_at(5, 0).date()
    add_bronze(spark, settings, big, day, days=1, first_id=2 * 10**12)
    full, full_s = timed(lambda: run_corrections(spark, settings, day, run_id="bench-big-full"))
    _, nothing_new_s = timed(lambda: run_corrections(spark, settings, day, run_id="bench-big-idle"))
    produce(settings, late_events_for(5, seed=8, count=big // 1000))
    stream.catch_up(spark, settings)
    incr, incr_s = timed(lambda: run_corrections(spark, settings, day, run_id="bench-big-incr"))
    return {
        "history_bronze_rows_added": history_rows,
        "history_write_s": round(history_s, 1),
        "idle_catch_up_s": idle,
        "idle_catch_up_history_vs_fresh": round(idle["history"] / idle["fresh"], 2),
        "big_date_events": big,
        "big_date_late_events": big // 1000,
        "big_date_corrections_full_s": round(full_s, 1),
        "big_date_corrections_nothing_new_s": round(nothing_new_s, 1),
        "big_date_corrections_incremental_s": round(incr_s, 1),
        "big_date_incremental_vs_full": round(incr_s / full_s, 3),
        "big_date_modes": [full.mode, incr.mode],
        "big_date_windows_recomputed": incr.windows_recomputed,
    }


def main() -> int:
    count = int(os.environ.get("BENCH_EVENTS", "240000"))
    small_count = count // 8
    total = count + small_count
    root = Path(os.environ.get("BENCH_ROOT", f"/tmp/lakehouse-bench-{uuid.uuid4().hex[:6]}"))
    os.environ.update({"LAKEHOUSE_ROOT": str(root), "EVENTS_TOPIC": f"bench-{uuid.uuid4().hex[:8]}",
                       "MAX_OFFSETS_PER_TRIGGER": str(total + 1000)})
    settings = Settings.from_env()
    # Day 3 is a tiny warm-up date: its runs go first so JIT and codegen are not billed to the
    # first measured run.
    records = (events_on(3, 1000, seed=5) + events_on(2, small_count, seed=1)
               + events_on(1, count, seed=2))
    _, produce_s = timed(lambda: produce(settings, records))
    from bench.raw_consume import confluent_records_per_s, kafka_perf_test

    raw_limit = {"confluent_kafka_records_per_s": round(confluent_records_per_s(settings, len(records))),
                 "kafka_consumer_perf_test": {k: round(v) for k, v in
                                              kafka_perf_test(settings, len(records)).items()}}

    from pyspark.sql import functions as F

    from spark_jobs import stream
    from spark_jobs.corrections import run_corrections
    from spark_jobs.replay import run_replay
    from spark_jobs.session import get_spark
    from spark_jobs.transforms.parse import classify

    spark = get_spark(settings)
    raw = (spark.read.format("kafka").options(**settings.spark_kafka_options)
           .option("subscribe", settings.events_topic).load().persist())
    raw.count()

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    schema = "event_id string, key string, event_time string, value string, attributes string"
    noop(classify(raw, settings))  # warm-up (JIT, codegen)
    _, parse_s = timed(lambda: noop(classify(raw, settings)))
    _, baseline_s = timed(lambda: noop(raw.select(F.from_json(F.col("value").cast("string"), schema))))
    raw.unpersist()

    from spark_jobs.writer import ensure_tables

    # The tables exist before the clock starts (creating ten tables is a one-time ~8 s that a
    # catch-up on a running lakehouse never pays; the hand-written job creates one).
    ensure_tables(spark, settings)
    _, ingest_s = timed(lambda: stream.run_available_now(spark, settings))
    dates = {"small": day_at(2, 0).date(), "large": day_at(1, 0).date()}
    warm_up = day_at(3, 0).date()
    full, incremental = {}, {}
    run_corrections(spark, settings, warm_up, run_id="bench-warm-up")
    for name, d in dates.items():
        full[name] = timed(lambda d=d: run_corrections(spark, settings, d, run_id="bench-full"))
    # The same few late events for each date, then one incremental run per date.
    produce(settings, late_events_for(3, seed=6) + late_events_for(2, seed=3)
            + late_events_for(1, seed=4))
    stream.run_available_now(spark, settings)
    run_corrections(spark, settings, warm_up, run_id="bench-warm-up")
    for name, d in dates.items():
        incremental[name] = timed(lambda d=d: run_corrections(spark, settings, d, run_id="bench-incr"))
    _, replay_s = timed(lambda: run_replay(spark, settings, dates["large"]))
    metadata_s = idle_run_metadata_seconds(spark, settings)
    scale = at_scale(spark, settings) if os.environ.get("BENCH_AT_SCALE") == "1" else None

    def corrections(runs: dict) -> dict:
        return {name: {"seconds": round(s, 1), "mode": r.mode,
                       "windows_recomputed": r.windows_recomputed, "windows_in_date": r.windows,
                       "stages_s": r.seconds} for name, (r, s) in runs.items()}

    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "events": total,
        "events_small_date": small_count,
        "events_large_date": count,
        "produce_records_per_s": round(total / produce_s),
        "raw_consume": raw_limit,
        "stream_vs_raw_consume": round(total / ingest_s
                                       / raw_limit["confluent_kafka_records_per_s"], 3),
        "parse_rows_per_s": round(total / parse_s),
        "from_json_baseline_rows_per_s": round(total / baseline_s),
        "parse_cost_vs_baseline": round(parse_s / baseline_s, 2),
        "stream_catch_up_records_per_s": round(total / ingest_s),
        "corrections_full": corrections(full),
        "corrections_incremental": corrections(incremental),
        "corrections_full_large_vs_small": round(full["large"][1] / full["small"][1], 2),
        "corrections_incremental_large_vs_small": round(
            incremental["large"][1] / incremental["small"][1], 2),
        "corrections_incremental_vs_full_large": round(
            incremental["large"][1] / full["large"][1], 2),
        "replay_large_date_s": round(replay_s, 1),
        "idle_run_metadata_s": metadata_s,
        "idle_run_metadata_history_vs_fresh": round(metadata_s["history"] / metadata_s["fresh"], 2),
        "at_scale": scale,
    }
    print(json.dumps(result, indent=2))
    write_result("stages", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
