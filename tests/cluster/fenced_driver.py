"""A Spark driver of its own for tests/cluster/test_cluster_fenced_commits.py: a classic local
session on the s3a:// root its environment names (LAKEHOUSE_ROOT, LAKEHOUSE_LOCK_URL, AWS_*),
built by `spark_jobs.session.get_spark`, so with the log store `make setup` builds. It takes locks
and commits through `spark_jobs.writer.Writer` on the test's commands, one JSON object a line on
stdin, each answered by one line on stdout (`{"id": ..., ...}`), the writes each in a thread of
their own so that the test can act while one is in flight:

- `{"op": "lock", "name": n}`: take the stream-checkpoint lock `n` (held until `quit`); answers
  its fence's `token`;
- `{"op": "append", "table": t, "lock": n, "tag": tag, "rows": k, "barrier": folder}`: append
  k rows to table t with the fence of lock n (none: no fence), its commit tagged `tag`; with a
  `barrier` folder, the write's task creates `<folder>/started` and then waits until
  `<folder>/go` exists before it returns its rows (the write is in flight until then). Answers
  `ok`, or the error's type and message;
- `{"op": "quit"}`.

The first line it writes is `{"ready": true, "jvm_pid": ...}`."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lakehouse.config.settings import Settings  # noqa: E402
from lakehouse.tables.locks import Fence, checkpoint_lock  # noqa: E402

_OUT = threading.Lock()


def say(**fields) -> None:
    with _OUT:
        print(json.dumps(fields), flush=True)


def wait_at(barrier: str, value: int) -> int:
    """In the write's task: say it started, then wait for the test's go (two minutes at most)."""
    folder = Path(barrier)
    (folder / "started").touch()
    deadline = time.monotonic() + 120
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def main() -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from spark_jobs.session import get_spark
    from spark_jobs.writer import Writer

    settings = Settings.from_env()
    spark = get_spark(settings)
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    held = ExitStack()
    fences: dict[str, Fence] = {}
    say(ready=True, jvm_pid=jvm_pid)

    def append(cmd: dict) -> None:
        try:
            df = spark.range(int(cmd.get("rows", 1))).select(
                F.col("id"), F.lit(cmd.get("tag") or "").alias("label"))
            if cmd.get("barrier"):
                barrier = cmd["barrier"]
                held_at = F.udf(lambda v: wait_at(barrier, v), LongType())
                df = df.coalesce(1).select(held_at("id").alias("id"), "label")
            fence = fences[cmd["lock"]] if cmd.get("lock") else Fence()
            Writer(spark, settings, fence).append(df, cmd["table"], tag=cmd.get("tag"))
            say(id=cmd["id"], ok=True)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
            say(id=cmd["id"], ok=False, error=type(exc).__name__, message=str(exc)[-3000:],
                trace=traceback.format_exc()[-3000:])

    threads = []
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "lock":
            fences[cmd["name"]] = held.enter_context(checkpoint_lock(settings, cmd["name"]))
            say(id=cmd["id"], ok=True, token=fences[cmd["name"]].tokens()[0])
        elif cmd["op"] == "append":
            thread = threading.Thread(target=append, args=(cmd,), daemon=True)
            thread.start()
            threads.append(thread)
        elif cmd["op"] == "quit":
            break
    for thread in threads:
        thread.join(60)
    held.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
