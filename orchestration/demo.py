"""`make demo`: a day of realistic events through the whole pipeline, run by Dagster.

Produces the day in arrival-ordered chunks with a stream catch-up after each (so records that
arrive behind the watermark really are late for the fast path), then runs corrections, replay
and the blocking reconciliation check for every event date, and prints a summary. The runs are
recorded in $DAGSTER_HOME, so `make ui` shows them afterwards.
"""

import os
import sys
import time
from datetime import date

from dagster import DagsterInstance

from lakehouse.generator import GeneratorConfig, generate, produce
from lakehouse.settings import Settings
from lakehouse.table_reads import compare_tables, table_counts
from orchestration.definitions import defs


def _run(job_name: str, instance: DagsterInstance, **kwargs):
    result = defs.get_job_def(job_name).execute_in_process(
        instance=instance, raise_on_error=False, **kwargs
    )
    checks = [
        e.asset_check_evaluation_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    return result, checks


def _has_bronze(settings: Settings) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(settings.table_path("bronze_events"))


def main() -> int:
    settings = Settings.from_env()
    count = int(os.environ.get("DEMO_EVENTS", "40000"))
    chunks = int(os.environ.get("DEMO_CHUNKS", "4"))
    seed = int(os.environ.get("DEMO_SEED", str(int(time.time()))))
    instance = DagsterInstance.get()
    generated = generate(GeneratorConfig(count=count, seed=seed))
    kinds = generated.kinds()
    print(f"demo: {count} records (seed {seed}) to topic {settings.events_topic!r} "
          f"in {chunks} chunks; lakehouse at {settings.root}")
    before = table_counts(settings)["bronze_rows"] if _has_bronze(settings) else 0
    if before:
        print(f"  note: the lakehouse already holds {before} bronze rows from earlier runs; the "
              "summary counts them too, and this run's events may land behind their watermark "
              "(late). `make clean` starts from scratch.")
    step = -(-len(generated.records) // chunks)
    for i in range(chunks):
        part = generated.records[i * step:(i + 1) * step]
        produce(settings, part)
        result, _ = _run("stream_catch_up", instance)
        print(f"  chunk {i + 1}/{chunks}: produced {len(part)}, stream catch-up "
              f"{'ok' if result.success else 'FAILED'}")
        if not result.success:
            return 1
        if i == chunks // 2 - 1:
            # Publish what is there mid-way, so later late events correct published windows.
            for d in sorted(table_counts(settings)["bronze_dates"]):
                _run("reconcile_dates", instance, partition_key=d.isoformat())
            print("  published the dates seen so far (later late events will correct them)")
    dates = sorted(table_counts(settings)["bronze_dates"])
    verdicts: dict[date, bool] = {}
    for d in dates:
        result, checks = _run("reconcile_dates", instance, partition_key=d.isoformat())
        verdicts[d] = result.success and bool(checks) and all(c.passed for c in checks)
    report, _ = _run("report_timeline", instance)
    counts = table_counts(settings)
    print("\nsummary")
    print(f"  produced           {len(generated.records)}  "
          f"(late {kinds['late']}, duplicates {kinds['duplicate'] + kinds['late_duplicate']}, "
          f"malformed {sum(v for k, v in kinds.items() if k not in ('event', 'late', 'duplicate', 'late_duplicate'))})")
    for k in ("bronze_rows", "duplicate_rows", "quarantined", "late_events", "streaming_windows",
              "reconciled_windows", "corrections"):
        print(f"  {k:18s} {counts[k]}")
    print(f"  quarantine reasons {counts['quarantine_reasons']}")
    ok = True
    for d in dates:
        diff = compare_tables(settings, d)
        equal = verdicts[d] and diff == 0
        ok &= equal
        print(f"  {d}: reconciled == replay: {'yes' if equal else f'NO ({diff} windows differ)'}"
              f" (GX check {'passed' if verdicts[d] else 'FAILED'})")
    report_path = settings.root / "reports" / "timeline.html"
    print(f"  timeline report    {report_path if report.success else 'FAILED'}")
    return 0 if ok and report.success else 1


if __name__ == "__main__":
    sys.exit(main())
