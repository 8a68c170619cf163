"""`make bench`: throughput of each stage on this machine, written to bench/results/.

One run measures, on the same generated data and one warm SparkSession:
- parse: `classify` (exact values, all reason codes) vs. a bare `from_json` baseline (ratio);
- bronze: Kafka -> bronze/quarantine catch-up (availableNow), records/s;
- aggregates: bronze -> windows + late lane catch-up, rows/s;
- corrections for the busiest date: the first (whole-date) run vs. an incremental run after a
  few late events (the cost should follow the windows touched, not the date's size);
- replay for the busiest date.
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

from lakehouse.generator import GeneratorConfig, generate, produce  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LATE_EVENTS = 50


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    count = int(os.environ.get("BENCH_EVENTS", "300000"))
    root = Path(os.environ.get("BENCH_ROOT", f"/tmp/lakehouse-bench-{uuid.uuid4().hex[:6]}"))
    os.environ.update({"LAKEHOUSE_ROOT": str(root), "EVENTS_TOPIC": f"bench-{uuid.uuid4().hex[:8]}",
                       "MAX_OFFSETS_PER_TRIGGER": str(count)})
    settings = Settings.from_env()
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    records = generate(GeneratorConfig(count=count, seed=1, end=end, span=timedelta(hours=12))).records
    _, produce_s = timed(lambda: produce(settings, records))

    from pyspark.sql import functions as F

    from spark_jobs import stream
    from spark_jobs.corrections import run_corrections
    from spark_jobs.parse import classify
    from spark_jobs.replay import run_replay
    from spark_jobs.session import get_spark
    from spark_jobs.tables import BRONZE, read_table

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

    _, bronze_s = timed(lambda: stream.run_available_now(spark, settings, stream.BRONZE_QUERY))
    _, agg_s = timed(lambda: stream.run_available_now(spark, settings, stream.AGG_QUERY))
    busiest = (read_table(spark, settings, BRONZE).groupBy("event_date").count()
               .orderBy(F.desc("count")).first().event_date)
    full, corr_s = timed(lambda: run_corrections(spark, settings, busiest, run_id="bench"))
    # A few late events for that date, then an incremental corrections run.
    late_at = datetime.combine(busiest, datetime.min.time(), tzinfo=UTC) + timedelta(hours=1)
    late = [r for r in generate(GeneratorConfig(count=LATE_EVENTS, seed=2, end=late_at,
                                                span=timedelta(minutes=30), malformed_fraction=0,
                                                duplicate_fraction=0, late_fraction=0)).records]
    produce(settings, late)
    stream.run_available_now(spark, settings, stream.BRONZE_QUERY)
    stream.run_available_now(spark, settings, stream.AGG_QUERY)
    incremental, incr_s = timed(lambda: run_corrections(spark, settings, busiest, run_id="bench2"))
    _, replay_s = timed(lambda: run_replay(spark, settings, busiest))

    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "events": count,
        "produce_records_per_s": round(count / produce_s),
        "parse_rows_per_s": round(count / parse_s),
        "from_json_baseline_rows_per_s": round(count / baseline_s),
        "parse_cost_vs_baseline": round(parse_s / baseline_s, 2),
        "bronze_catch_up_records_per_s": round(count / bronze_s),
        "aggregates_catch_up_rows_per_s": round(count / agg_s),
        "stream_end_to_end_records_per_s": round(count / (bronze_s + agg_s)),
        "corrections_one_date_s": round(corr_s, 1),
        "corrections_windows_full": full.windows_recomputed,
        "corrections_incremental_s": round(incr_s, 1),
        "corrections_windows_incremental": incremental.windows_recomputed,
        "corrections_incremental_mode": incremental.mode,
        "replay_one_date_s": round(replay_s, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench-{result['date'][:10]}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
