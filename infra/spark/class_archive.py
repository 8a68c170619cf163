"""`make class-archive`: this machine's class archive for the product's Spark drivers (AppCDS).

A driver JVM in a fresh process (every Dagster run the daemon or `dagster asset materialize`
starts, the service, each test worker) spends seconds loading, parsing and verifying the classes
of Spark, Delta and Kafka before its first job. Java 17 maps the classes of an archive instead:
here a one-run process's session started in ~4 s instead of ~8 s and its first Delta command took
~3.5 s instead of ~5.9 s (measured 2026-11-29, commit 5b3a676).

The archive holds the classes a real run loads: a child process runs a catch-up and a
`reconcile_dates` of a generated 3,000-event date (in-process Dagster runs on a scratch root and
a scratch topic of the local broker) in one JVM started with `-XX:ArchiveClassesAtExit`, which
writes the archive as it exits. The file then takes the name `spark_jobs.session` offers drivers
(keyed by pyspark's version, the JDK and the jars; older archives are removed). Idempotent: when
this machine's archive exists there is nothing to do; otherwise about two minutes here. A driver
that finds no archive starts as it always did.

    python infra/spark/class_archive.py            # make class-archive (needs the broker)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

EVENTS = 3000
TRAIN = "--train"


def main() -> int:
    from spark_jobs.session import CLASS_ARCHIVES, class_archive_path

    target = class_archive_path()
    if target.exists():
        print(f"class archive up to date: {target.relative_to(REPO)}")
        return 0
    CLASS_ARCHIVES.mkdir(parents=True, exist_ok=True)
    dumped = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
    work = Path(tempfile.mkdtemp(prefix="class-archive-"))
    env = {**os.environ, "LAKEHOUSE_ROOT": str(work / "root"),
           "EVENTS_TOPIC": f"class-archive-{uuid.uuid4().hex[:8]}",
           "SPARK_CONF_spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={dumped}",
           "PYTHONPATH": str(REPO), "GX_ANALYTICS_ENABLED": "false",
           "DAGSTER_DISABLE_TELEMETRY": "true"}
    env.pop("SPARK_REMOTE", None)
    log = work / "train.log"
    t0 = time.monotonic()
    try:
        with log.open("w") as out:
            rc = subprocess.run([sys.executable, __file__, TRAIN], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0 or not dumped.exists() or dumped.stat().st_size == 0:
            print(log.read_text()[-4000:], file=sys.stderr)
            # Not fatal: the archive only makes drivers start sooner.
            print(f"warning: no class archive was written (exit {rc}, the training run's log "
                  "above); Spark drivers start without one", file=sys.stderr)
            return 0
        os.replace(dumped, target)
        for old in CLASS_ARCHIVES.glob("driver-*"):
            if old != target:
                old.unlink(missing_ok=True)
        print(f"class archive written: {target.relative_to(REPO)} "
              f"({target.stat().st_size // 2**20} MB, {time.monotonic() - t0:.0f} s)")
        return 0
    finally:
        dumped.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def train() -> int:
    """In the child: the runs whose classes the archive keeps, then the JVM's exit awaited (it
    writes the archive on its way out)."""
    from dagster import DagsterInstance
    from pyspark import SparkContext

    from lakehouse.config.settings import Settings
    from lakehouse.kafka.admin import admin
    from testkit.generator import GeneratorConfig, generate, produce
    from testkit.runs import run_job, step_failures

    settings = Settings.from_env()
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(hours=4)
    produce(settings, generate(GeneratorConfig(count=EVENTS, seed=11, end=end,
                                               span=timedelta(hours=4))).records)
    try:
        instance = DagsterInstance.ephemeral()
        for job, partition in (("stream_catch_up", None), ("reconcile_dates", end.date())):
            result, _ = run_job(job, instance, quiet=True,
                                **({"partition_key": partition.isoformat()} if partition else {}))
            if not result.success:
                print(f"{job} failed: {step_failures(result)}", file=sys.stderr)
                return 1
    finally:
        admin(settings).delete_topics([settings.events_topic])
    context = SparkContext._active_spark_context
    gateway = SparkContext._gateway
    if context is None or gateway is None:
        print("no Spark driver was started", file=sys.stderr)
        return 1
    context.stop()
    gateway.proc.stdin.close()  # the JVM exits on its stdin's end, dumping the archive
    gateway.proc.wait(timeout=600)
    return 0


if __name__ == "__main__":
    sys.exit(train() if sys.argv[1:] == [TRAIN] else main())
