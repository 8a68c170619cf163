"""What a replay costs, by its drivers: BENCH_EVENTS (default 200,000) generated events over two
dates on a fresh topic and root, caught up into bronze, then each date replayed from the Kafka
log (`spark_jobs.replay.run_replay`, its `cost` as a run's metadata carries it): records and
bytes fetched, bytes and files written, storage operations, the driver JVM's CPU seconds (a
local master: the executors are in that JVM) and the wall time. docs/cost.md turns them into a
formula. Results to bench/results/replay-cost-<date>.json.

    python -m bench.replay_cost      (a broker at KAFKA_BOOTSTRAP_SERVERS; `make kafka-up`)
"""

from __future__ import annotations

import os
import platform
import subprocess
import uuid
from datetime import UTC, datetime

from bench import write_result
from bench.ratios import records, settings_for


def main() -> int:
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.tables.reads import bronze_dates
    from spark_jobs import stream
    from spark_jobs.replay import run_replay
    from spark_jobs.session import get_spark
    from testkit.generator import produce

    n = int(os.environ.get("BENCH_EVENTS", "200000"))
    settings = settings_for(f"replay-cost-{uuid.uuid4().hex[:6]}", f"replay-cost-{uuid.uuid4().hex[:6]}")
    ensure_topic(settings)
    produce(settings, records(n, 7))
    spark = get_spark(settings)
    stream.catch_up(spark, settings)
    dates = sorted(bronze_dates(settings))
    run_replay(spark, settings, dates[0])  # warm-up: the JVM's first replay compiles its code
    per_date = [run_replay(spark, settings, d).as_metadata() for d in dates]
    spark.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "events_produced": n,
        "master": settings.spark_master,
        "replays": [{k: r[k] for k in ("event_date", "records_read", "events", "windows", "cost")}
                    for r in per_date],
    }
    big = max(result["replays"], key=lambda r: r["records_read"])["cost"]
    result["largest"] = {
        **{k: big[k] for k in ("kafka_records_fetched", "kafka_bytes_fetched", "bytes_written",
                               "files_written", "jvm_cpu_s", "wall_s")},
        "cpu_us_per_record": round(big["jvm_cpu_s"] * 1e6 / big["kafka_records_fetched"], 1),
        "bytes_fetched_per_record": round(big["kafka_bytes_fetched"] / big["kafka_records_fetched"], 1),
    }
    print(result["largest"])
    write_result("replay-cost", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
