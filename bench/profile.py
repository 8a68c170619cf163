"""`make profile`: where an ingest batch's time goes, at 50k, 270k and 2M records
(PROFILE_SIZES). Runs a catch-up with the Spark UI on, then reads Spark's own REST API (the UI's
data) for the jobs it ran, grouped by the step that started them (`ingest:<step>` job
descriptions, Delta's own names), and counts the Delta commits each table received; then the
fixed cost of a one-record catch-up. Written to bench/results/profile-<date>.json."""

from __future__ import annotations

import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import spark_ui, write_result  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from testkit.generator import GeneratorConfig, generate, produce  # noqa: E402

TABLES = ("bronze_events", "quarantined_events", "streaming_aggregates", "late_events",
          "stream_progress")


def _versions(settings: Settings) -> dict[str, int]:
    from lakehouse.tables import delta_log

    return {name: delta_log.version(settings, name) for name in TABLES}


def profile(spark, settings: Settings) -> dict:
    from spark_jobs import stream

    ui = spark.sparkContext.uiWebUrl
    before, versions = {j["jobId"] for j in spark_ui.jobs(ui)}, _versions(settings)
    t0 = time.perf_counter()
    progresses = stream.run_available_now(spark, settings)
    wall = time.perf_counter() - t0
    jobs = [j for j in spark_ui.jobs(ui) if j["jobId"] not in before and j.get("completionTime")]
    steps = spark_ui.by_step(jobs)
    after = _versions(settings)
    return {
        "wall_s": round(wall, 1),
        "batches": len(progresses),
        "spark_jobs": len(jobs),
        "spark_job_seconds": round(sum(g["seconds"] for g in steps), 1),
        "delta_commits": {t: after[t] - versions[t] for t in TABLES
                          if after[t] != versions[t]},
        "jobs_by_origin": steps,
    }


def produce_events(settings: Settings, count: int, seed: int) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    produce(settings, generate(GeneratorConfig(
        count=count, seed=seed, end=now - timedelta(minutes=1), span=timedelta(minutes=30),
        keys=max(50, count // 200))).records)


def main() -> int:
    """Per size: a lakehouse with a first small batch (so the measured batch takes the steady
    path: dedup against bronze, the MERGE), then one batch of `size` records profiled; then the
    fixed cost of a one-record batch, warm (median of 3)."""
    from spark_jobs import stream
    from spark_jobs.session import get_spark

    sizes = [int(x) for x in os.environ.get("PROFILE_SIZES", "50000,270000,2000000").split(",")]
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": f"{os.cpu_count()} cores", "sizes": {}}
    spark = None
    for size in sizes:
        os.environ.update({
            "LAKEHOUSE_ROOT": f"/tmp/lakehouse-profile-{uuid.uuid4().hex[:6]}",
            "EVENTS_TOPIC": f"profile-{uuid.uuid4().hex[:8]}", "SPARK_UI": "true",
            "MAX_OFFSETS_PER_TRIGGER": str(size + 10_000)})
        settings = Settings.from_env()
        spark = spark or get_spark(settings)
        produce_events(settings, 2_000, seed=1)
        stream.catch_up(spark, settings)
        produce_events(settings, size, seed=2)
        batch = profile(spark, settings)
        one = []
        for i in range(4):
            produce_events(settings, 1, seed=10 + i)
            t0 = time.perf_counter()
            stream.catch_up(spark, settings)
            one.append(time.perf_counter() - t0)
        batch["one_record_catch_up_s"] = round(sorted(one[1:])[1], 2)  # first run: warm-up
        result["sizes"][str(size)] = batch
        print(f"{size} records: {batch['wall_s']} s wall, {batch['batches']} batch(es), "
              f"{batch['spark_jobs']} Spark jobs ({batch['spark_job_seconds']} s), commits "
              f"{batch['delta_commits']}; a one-record catch-up {batch['one_record_catch_up_s']} s")
        for g in batch["jobs_by_origin"][:10]:
            print(f"  {g['seconds']:8.2f} s  {g['jobs']:6} jobs  {g['origin']}")
    write_result("profile", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
