"""`make bench-fence`: what the fenced log store of s3a:// roots costs a commit, against Delta's
S3SingleDriverLogStore, on S3Proxy (infra/s3/s3proxy.py) with the lock server on PostgreSQL
(infra/postgres/pg.py), both of its own on free ports, stopped at the end.

One Spark driver, one JVM warm for both, the session `spark_jobs.session` builds for an s3a://
root. The two stores are compared on two more names of Hadoop's S3A file system for the same
bucket: s3b:// through `lakehouse.delta.PgLogStore`, s3c:// through S3SingleDriverLogStore, so
that nothing but the store differs (on s3a:// itself Spark writes Delta's .crc files another way,
through the scheme's FileContext). Rounds interleaved, the order alternating, the first WARMUP
rounds left out; medians (and the 90th percentile) of:

- `append`: a 3-row append, as `Writer.append` makes it (the PG store's with the writer's fence
  in the session, under a real writer lock);
- `metadata`: a commit with no data job (`ALTER TABLE ... SET TBLPROPERTIES`);
- `store_write`: the log store's `write` of the next N.json alone (a log of its own), called
  through the JVM: the store's own price, without Delta's snapshot work around it;
- `store_list`: the log store's `listFrom` of the table's log (every snapshot update lists);
- `takeover_step`: what a lock's new holder now adds once it has the advisory lock (the wait
  for the previous holder's commits in flight, the completion of its interrupted ones), no
  Spark.

BENCH_FENCE_ROUNDS (default 15), BENCH_FENCE_WARMUP (2). The machine is shared: the load
average at the start and the end is recorded with the figures."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from bench import write_result
from testkit.ports import free_port

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
REPO = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("BENCH_FENCE_ROUNDS", "15"))
WARMUP = int(os.environ.get("BENCH_FENCE_WARMUP", "2"))
BUCKET = "bench"
SINGLE_DRIVER = "io.delta.storage.S3SingleDriverLogStore"


def _server(script: str, command: str, args: list[str], env: dict) -> None:
    done = subprocess.run([sys.executable, str(REPO / script), command, *args], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{script} {command} failed: {(done.stderr or done.stdout)[-800:]}")


def summary(samples: list[float]) -> dict:
    kept = sorted(samples[WARMUP:])
    p90 = kept[min(len(kept) - 1, round(0.9 * (len(kept) - 1)))]
    return {"median_ms": round(statistics.median(kept) * 1000, 1), "p90_ms": round(p90 * 1000, 1),
            "samples_ms": [round(s * 1000, 1) for s in samples]}


def main() -> int:
    state = Path(tempfile.mkdtemp(prefix="lakehouse-bench-fence-", dir="/tmp"))
    state.chmod(0o755)  # as root the lock server runs as a user of its own, who must reach it
    s3_port, pg_port = free_port(), free_port()
    secret, password = uuid.uuid4().hex, uuid.uuid4().hex  # this run's, never printed
    store = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": secret,
             "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}", "AWS_REGION": "us-east-1",
             "AWS_S3_PATH_STYLE": "true"}
    pg_env = {**os.environ, "DAGSTER_PG_PASSWORD": password, "DAGSTER_PG_DB": "locks"}
    s3_args = ["--state-dir", str(state / "s3"), "--port", str(s3_port), "--bucket", BUCKET]
    pg_args = ["--state-dir", str(state / "pg"), "--port", str(pg_port)]
    _server("infra/s3/s3proxy.py", "up", s3_args, {**os.environ, **store})
    try:
        _server("infra/postgres/pg.py", "up", pg_args, pg_env)
        try:
            os.environ.update(store)
            os.environ.pop("SPARK_REMOTE", None)
            result = measure(f"postgresql://dagster:{password}@127.0.0.1:{pg_port}/locks")
        finally:
            _server("infra/postgres/pg.py", "down", pg_args, pg_env)
    finally:
        _server("infra/s3/s3proxy.py", "down", s3_args, {**os.environ, **store})
        shutil.rmtree(state, ignore_errors=True)
    for op in ("append", "metadata", "store_write", "store_list"):
        by = result[op]
        print(f"{op}: {by['pg']['median_ms']} ms fenced (PG store) against "
              f"{by['single']['median_ms']} ms (single-driver store), medians")
    print(f"takeover step: {result['takeover_step']['median_ms']} ms, median")
    write_result("fenced-commits", result)
    return 0


def measure(lock_url: str) -> dict:
    from lakehouse.config.settings import Settings
    from lakehouse.tables import commit_log
    from lakehouse.tables.locks import checkpoint_lock
    from spark_jobs.session import get_spark

    load_before = os.getloadavg()
    root = f"s3a://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({**os.environ, "LAKEHOUSE_ROOT": root,
                                  "LAKEHOUSE_LOCK_URL": lock_url, "SPARK_MASTER": "local[2]"})
    spark = get_spark(settings, extra={
        "spark.hadoop.fs.s3b.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3c.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.delta.logStore.s3b.impl": commit_log.LOG_STORE_CLASS,
        "spark.delta.logStore.s3c.impl": SINGLE_DRIVER})
    jvm = spark.sparkContext._jvm
    folder = root[len("s3a://"):]
    paths = {"pg": f"s3b://{folder}/pg", "single": f"s3c://{folder}/single"}
    logs = {which: f"{path}-scratch/_delta_log" for which, path in paths.items()}
    rows = spark.range(3).selectExpr("id", "'x' as label")
    samples: dict[str, dict[str, list[float]]] = {
        op: {"pg": [], "single": []}
        for op in ("append", "metadata", "store_write", "store_list")}
    takeover: list[float] = []
    with checkpoint_lock(settings, "bench") as fence:
        key = commit_log.fence_key(paths["pg"])
        stores = {"pg": jvm.lakehouse.delta.PgLogStore(
                      spark._jsparkSession.sessionState().newHadoopConf()),
                  "single": jvm.io.delta.storage.S3SingleDriverLogStore(
                      spark._jsparkSession.sessionState().newHadoopConf())}

        def fenced(which: str, work) -> float:
            """`work` timed, for the PG store with the fence in the session as the writer sets
            it (the setting's cost included)."""
            t0 = time.perf_counter()
            if which == "pg":
                spark.conf.set(key, ",".join(fence.tokens()))
            try:
                work()
            finally:
                if which == "pg":
                    spark.conf.unset(key)
            return time.perf_counter() - t0

        for which in ("pg", "single"):  # the tables, before the rounds
            rows.write.format("delta").save(paths[which])
        for i in range(ROUNDS):
            for which in (("pg", "single") if i % 2 == 0 else ("single", "pg")):
                path = paths[which]
                samples["append"][which].append(fenced(which, lambda p=path: (
                    rows.write.format("delta").mode("append").save(p))))
                samples["metadata"][which].append(fenced(which, lambda p=path, n=i: spark.sql(
                    f"ALTER TABLE delta.`{p}` SET TBLPROPERTIES ('bench.round' = '{n}')")))
                scratch_key = commit_log.fence_key(logs[which].rsplit("/", 1)[0])
                if which == "pg":  # fenced as a writer's commit is
                    spark.conf.set(scratch_key, ",".join(fence.tokens()))
                conf = spark._jsparkSession.sessionState().newHadoopConf()
                spark.conf.unset(scratch_key)
                target = jvm.org.apache.hadoop.fs.Path(f"{logs[which]}/{i:020d}.json")
                lines = jvm.java.util.ArrayList()
                lines.add(json.dumps({"commitInfo": {"round": i}}))
                t0 = time.perf_counter()
                stores[which].write(target, lines.iterator(), False, conf)
                samples["store_write"][which].append(time.perf_counter() - t0)
                first = jvm.org.apache.hadoop.fs.Path(f"{paths[which]}/_delta_log/{0:020d}.json")
                t0 = time.perf_counter()
                listed = stores[which].listFrom(first, conf)
                while listed.hasNext():
                    listed.next()
                samples["store_list"][which].append(time.perf_counter() - t0)
    # The step a lock's new holder now takes once it has the advisory lock: the wait for the
    # previous holder's commits in flight and the completion of its interrupted ones (none
    # here: what every acquisition pays), on a lock server session of its own, no Spark.
    import psycopg2

    from lakehouse.tables.locks import _await_commits, _key

    conn = psycopg2.connect(lock_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        for i in range(ROUNDS):
            k = _key(root, f"takeover-{i}")
            cur.execute("SELECT pg_advisory_lock(%s)", (k,))
            t0 = time.perf_counter()
            _await_commits(conn, k, "bench")
            commit_log.complete_interrupted(conn, k)
            takeover.append(time.perf_counter() - t0)
            cur.execute("SELECT pg_advisory_unlock(%s)", (k,))
    conn.close()
    spark.stop()
    figures = {op: {which: summary(v) for which, v in by.items()} for op, by in samples.items()}
    for by in figures.values():
        by["added_ms"] = round(by["pg"]["median_ms"] - by["single"]["median_ms"], 1)
    figures["takeover_step"] = summary(takeover)
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} cores", "rounds": ROUNDS, "warmup": WARMUP,
            "load_average": {"start": [round(x, 2) for x in load_before],
                             "end": [round(x, 2) for x in os.getloadavg()]},
            "stores": {"pg": "lakehouse.delta.PgLogStore (s3b://: S3A under another name), "
                             "fenced",
                       "single": f"{SINGLE_DRIVER} (s3c://: S3A under another name)"},
            **figures}


if __name__ == "__main__":
    sys.exit(main())
