"""`make profile`: where a stream catch-up's time goes. Runs the bronze and aggregation
catch-ups on freshly produced events with the Spark UI on, then reads Spark's own REST API
(the UI's data) for the jobs each catch-up ran, grouped by what started them, and counts the
Delta commits each table received. Written to bench/results/profile-<date>.json."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import write_result  # noqa: E402
from lakehouse.generator import GeneratorConfig, generate, produce  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402

TABLES = ("bronze_events", "quarantined_events", "streaming_aggregates", "late_events",
          "stream_progress")


def _time(s: str) -> float:
    return datetime.strptime(s.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def _jobs(spark) -> list[dict]:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/jobs"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def _what(job: dict) -> str:
    """Delta names its own jobs in the description; Python actions by their call site."""
    description = (job.get("description") or "").split("\n")[0]
    if description.lower().startswith("delta"):
        return description[:100]
    return job.get("name", "?")[:100]


def _versions(settings: Settings) -> dict[str, int]:
    from lakehouse import delta_log

    return {name: delta_log.version(settings, name) for name in TABLES}


def profile(spark, settings: Settings, query: str) -> dict:
    from spark_jobs import stream

    before, versions = {j["jobId"] for j in _jobs(spark)}, _versions(settings)
    t0 = time.perf_counter()
    progresses = stream.run_available_now(spark, settings, query)
    wall = time.perf_counter() - t0
    jobs = [j for j in _jobs(spark) if j["jobId"] not in before and j.get("completionTime")]
    groups: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        groups[_what(j)].append(_time(j["completionTime"]) - _time(j["submissionTime"]))
    after = _versions(settings)
    return {
        "wall_s": round(wall, 1),
        "batches": len(progresses),
        "spark_jobs": len(jobs),
        "spark_job_seconds": round(sum(sum(v) for v in groups.values()), 1),
        "delta_commits": {t: after[t] - versions[t] for t in TABLES
                          if after[t] != versions[t]},
        "jobs_by_origin": [
            {"origin": k, "jobs": len(v), "seconds": round(sum(v), 2)}
            for k, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))
        ],
    }


def main() -> int:
    count = int(os.environ.get("PROFILE_EVENTS", "200000"))
    batches = int(os.environ.get("PROFILE_BATCHES", "4"))
    root = f"/tmp/lakehouse-profile-{uuid.uuid4().hex[:6]}"
    os.environ.update({"LAKEHOUSE_ROOT": root, "EVENTS_TOPIC": f"profile-{uuid.uuid4().hex[:8]}",
                       "SPARK_UI": "true",
                       "MAX_OFFSETS_PER_TRIGGER": str(count // batches + 1)})
    settings = Settings.from_env()
    now = datetime.now(UTC).replace(microsecond=0)
    records = generate(GeneratorConfig(count=count, seed=3, end=now - timedelta(minutes=5),
                                       span=timedelta(hours=6), keys=500)).records
    produce(settings, records)

    from spark_jobs.session import get_spark

    spark = get_spark(settings)
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": f"{os.cpu_count()} cores", "events": count, "batches_asked": batches,
              "bronze": profile(spark, settings, "bronze"),
              "aggregates": profile(spark, settings, "aggregates")}
    write_result("profile", result)
    for phase in ("bronze", "aggregates"):
        r = result[phase]
        print(f"{phase}: {r['wall_s']} s wall, {r['batches']} batches, {r['spark_jobs']} Spark "
              f"jobs ({r['spark_job_seconds']} s), commits {r['delta_commits']}")
        for g in r["jobs_by_origin"][:12]:
            print(f"  {g['seconds']:8.2f} s  {g['jobs']:4d} jobs  {g['origin']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
