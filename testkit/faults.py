"""Fault injection on real processes, timed by the pipeline's own durable state (not sleeps).

- `start_service` / `wait_for`: `python -m orchestration.service.runner` as a child process.
- `in_flight` / `kill_in_flight`: SIGKILL the service while a micro-batch of a query is in
  flight: its write-ahead `offsets/N` is written and `commits/N` is not.
- `DeltaLog`: a table's `_delta_log` read incrementally (commit versions, the ingest batch each
  commit belongs to, the data files each commit adds), for the finer kill points:
  `kill_inside_batch` (inside the ingest foreachBatch, between two of its commits) and
  `kill_corrections` (inside a corrections run: a MERGE has written data files it has not
  committed, or gold is committed and its changelog is not, or the changelog is and
  `corrections_state` is not).
- `python -m testkit.faults corrections <date> <run_id>`: one corrections run of a date in
  a process of its own (the process the drills kill).
- `failing_bronze_append`: in-process, a writer (an ingest batch, a redrive) fails where it would append to bronze
  (its quarantine and late-lane commits made): a crash between its commits, for a re-run.
- `failing_redrive_mark`: in-process, a quarantine redrive fails after its late-lane and bronze
  appends, before it marks the quarantine.

Used by the drills (`python -m bench.drills`) and by tests/e2e/test_service.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from lakehouse.tables.commit_tags import batch_of
from lakehouse.tables.delta_log import Commit, commit_versions, read_commit

REPO = Path(__file__).resolve().parents[1]


BRONZE_CRASH = "crashed before the bronze commit"


@contextmanager
def failing_bronze_append() -> Iterator[None]:
    """Within the block, a writer raises BRONZE_CRASH where it would append to bronze (an ingest
    batch: after its quarantine and late-lane appends)."""
    from spark_jobs.writer import Writer

    real = Writer.append

    def append(self, df, table, *args, **kwargs):
        if getattr(table, "name", table) == "bronze_events":
            raise RuntimeError(BRONZE_CRASH)
        real(self, df, table, *args, **kwargs)

    Writer.append = append
    try:
        yield
    finally:
        Writer.append = real


REDRIVE_CRASH = "crashed before the redrive's quarantine mark"


@contextmanager
def failing_redrive_mark() -> Iterator[None]:
    """Within the block, a quarantine redrive raises REDRIVE_CRASH where it would mark its
    records redriven (its late-lane and bronze appends made): a crash between its commits."""
    from spark_jobs import redrive

    real = redrive._mark

    def mark(*_args, **_kwargs):
        raise RuntimeError(REDRIVE_CRASH)

    redrive._mark = mark
    try:
        yield
    finally:
        redrive._mark = real


DRIVER_JAVA_OPTIONS = "SPARK_CONF_spark.driver.extraJavaOptions"


def short_lived(env) -> dict[str, str]:
    """`env` for a child whose Spark driver lives for one test or drill (the service, the demo,
    one corrections run): its JVM compiles with C1 only, as a one-run Dagster process's does
    (`spark_jobs.session.SHORT_RUN_JAVA_OPTIONS`). C2 pays off over hours of batches, not over
    a minute of them: a test's service start burns ~27 s of CPU less, the demo's ~22-35 s, at
    the same wall time alone (A/B on 2026-11-28); on the suite's two cores that CPU is the
    other worker's."""
    from spark_jobs.session import SHORT_RUN_JAVA_OPTIONS

    given = env.get(DRIVER_JAVA_OPTIONS, "")
    if SHORT_RUN_JAVA_OPTIONS in given:
        return dict(env)
    return {**env, DRIVER_JAVA_OPTIONS: " ".join(filter(None, (given, SHORT_RUN_JAVA_OPTIONS)))}


def _spawn(args: list[str], env, log_path: str | Path | None,
           short_run: bool = True) -> subprocess.Popen:
    """A child in a process group of its own, so a SIGKILL takes its JVM (and Python workers)
    down with it, as a crash of the machine or container would (`crash`). Its JVM is
    `short_lived` unless `short_run` is False: a bench's service and peers run as `make stream`
    and spark-submit start them (with C1 only the service's batches cost ~1.5x: 47-75 µs a
    record at 20k/s against ~31, 2026-11-29: bench/results/service-peers-2026-11-29T065724.json
    against bench/results/service-peers-2026-11-29T072856.json)."""
    if short_run:
        env = short_lived(env)
    if log_path is None:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with open(log_path, "a") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    proc.log_path = str(log_path)
    return proc


def start_service(env, log_path: str | Path | None = None,
                  short_run: bool = True) -> subprocess.Popen:
    """`make stream`'s service as a child process. Its output goes to a pipe, or to `log_path`
    (for long runs: a pipe nobody reads fills up and blocks the service's prints). `short_run`:
    see `_spawn`."""
    return _spawn([sys.executable, "-m", "orchestration.service.runner"], env, log_path,
                  short_run)


@contextmanager
def running_service(env, log_path: str | Path | None = None) -> Iterator[subprocess.Popen]:
    """`start_service` for a block: the service and its process group (the JVM) are killed
    when the block ends with it still running (a failed wait, a crash that did not happen)."""
    proc = start_service(env, log_path)
    try:
        yield proc
    finally:
        _kill(proc)


def crash(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything in its group (the service's JVM and Python workers:
    nothing of it finishes a commit after the signal)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def output(proc: subprocess.Popen, tail: int = 3000) -> str:
    """The last `tail` characters a child process printed (pipe or log file)."""
    path = getattr(proc, "log_path", None)
    if path:
        try:
            return Path(path).read_text(errors="replace")[-tail:]
        except OSError:
            return ""
    if proc.stdout is None:
        return ""
    if proc.poll() is None:
        return "(still running)"
    return proc.stdout.read()[-tail:]


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        crash(proc)


def wait_for(predicate, svc, timeout=240, what="condition", interval=1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if svc.poll() is not None:
            raise AssertionError(f"service exited {svc.returncode}: {output(svc)}")
        time.sleep(interval)
    _kill(svc)
    raise AssertionError(f"timed out waiting for {what}: {output(svc)}")


def batch_ids(checkpoint: str, kind: str) -> set[int]:
    folder = Path(checkpoint) / kind
    return {int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()} if folder.exists() \
        else set()


def in_flight(checkpoint: str) -> int | None:
    """A batch the query has started (its write-ahead `offsets/N` is written) and not committed
    (no `commits/N`), if there is one now."""
    pending = batch_ids(checkpoint, "offsets") - batch_ids(checkpoint, "commits")
    return max(pending) if pending else None


def next_batch(checkpoint: str) -> int:
    """The id the query's next new batch gets (after any batch now in its write-ahead log)."""
    started = batch_ids(checkpoint, "offsets")
    return max(started) + 1 if started else 0


def kill_in_flight(svc, checkpoint: str, min_batch: int, timeout: float = 240) -> int:
    """SIGKILL the service while a batch >= `min_batch` of the checkpoint's query is in flight
    (chosen from the checkpoint's state, not after a sleep). Returns the batch id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = in_flight(checkpoint)
        if batch is not None and batch >= min_batch:
            crash(svc)
            assert not (Path(checkpoint) / "commits" / str(batch)).exists()
            return batch
        if svc.poll() is not None:
            raise AssertionError(f"service exited {svc.returncode}: {output(svc)}")
        time.sleep(0.02)
    _kill(svc)
    raise AssertionError(f"no batch >= {min_batch} in flight in {checkpoint} within {timeout}s")


# ---------------------------------------------------------------------------------------------
# The Delta log (lakehouse.tables.delta_log's commit files) and the data files beside it
# ---------------------------------------------------------------------------------------------
class DeltaLog:
    """A local Delta table's commits, each commit file read once (`refresh` reads the new
    ones), and the data files in its folder, committed or not."""

    def __init__(self, table_path: str | Path):
        self.uri = str(table_path)
        self.table = Path(self.uri.removeprefix("file://"))
        self.commits: dict[int, Commit] = {}

    def refresh(self) -> DeltaLog:
        for version in commit_versions(self.uri):
            if version not in self.commits and (c := read_commit(self.uri, version)) is not None:
                self.commits[version] = c
        return self

    @property
    def version(self) -> int:
        return max(self.commits) if self.commits else -1

    def batches(self) -> set[tuple[str, int]]:
        """The (query id, batch id) tags of the ingest query's commits."""
        return {b for c in self.commits.values() if (b := batch_of(c.user_metadata)) is not None}

    def commit_of(self, batch: tuple[str, int]) -> list[Commit]:
        return [c for c in self.commits.values() if batch_of(c.user_metadata) == batch]

    def data_files(self) -> set[str]:
        """Parquet files under the table folder (relative paths), committed or not."""
        if not self.table.exists():
            return set()
        return {str(p.relative_to(self.table)) for p in self.table.rglob("*.parquet")
                if "_delta_log" not in p.parts}

    def committed_files(self) -> set[str]:
        return {unquote(a["path"]) for c in self.commits.values() for a in c.adds}


# Kill points inside an ingest batch, one after each of its Delta commits (its appends:
# quarantine, late lane, then bronze; then the aggregates commit; then Spark's checkpoint
# commit): name -> (table whose commit for the batch is there, tables whose commit for it is
# not there yet; () : only the checkpoint's commits/N is missing).
INGEST_KILL_POINTS = {
    "quarantine_before_bronze": ("quarantined_events", ("late_events", "bronze_events")),
    "late_before_bronze": ("late_events", ("bronze_events",)),
    "bronze_before_aggregates": ("bronze_events", ("streaming_aggregates",)),
    "aggregates_before_checkpoint": ("streaming_aggregates", ()),
}


def kill_inside_batch(svc, settings, point: str, min_batch: int,
                      timeout: float = 240) -> tuple[int, bool]:
    """SIGKILL the service inside an ingest batch >= `min_batch`, at `point`
    (INGEST_KILL_POINTS): after the batch's commit to one table and before the next. Returns
    (N, whether the kill landed in that gap: False when the next commit got in between the
    check and the signal). The batch's checkpoint commit is never there yet."""
    after, before = INGEST_KILL_POINTS[point]
    done = DeltaLog(settings.table_path(after))
    nxt = [DeltaLog(settings.table_path(t)) for t in before]
    checkpoint = Path(str(settings.checkpoint_path("ingest")).removeprefix("file://"))

    def pending() -> set[tuple[str, int]]:
        got = {b for b in done.refresh().batches() if b[1] >= min_batch}
        for log in nxt:
            got -= log.refresh().batches()
        return {b for b in got if not (checkpoint / "commits" / str(b[1])).exists()}

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := pending():
            crash(svc)
            batch = max(found, key=lambda b: b[1])
            landed = batch in pending()
            assert not (checkpoint / "commits" / str(batch[1])).exists(), \
                f"batch {batch[1]} committed before the kill"
            return batch[1], landed
        if svc.poll() is not None:
            raise AssertionError(f"service exited {svc.returncode}: {output(svc)}")
        time.sleep(0.01)
    _kill(svc)
    raise AssertionError(f"no ingest batch >= {min_batch} at {point} within {timeout}s")


# A corrections run commits gold, then the changelog of its corrections (none when it has
# none), then its state row.
CORRECTIONS_HOOKS = ("merge_files_written", "gold_committed", "changelog_committed")


def corrections_process(env, d, run_id: str, log_path: str | Path) -> subprocess.Popen:
    """One corrections run of date `d` in a process (group) of its own, to be killed."""
    return _spawn([sys.executable, "-m", "testkit.faults", "corrections", d.isoformat(),
                   run_id], env, log_path)


def kill_corrections(proc, settings, hook: str, timeout: float = 600) -> str | None:
    """SIGKILL a corrections process (`corrections_process`) at `hook`:
    - `merge_files_written`: a MERGE into `reconciled_aggregates` or `late_corrections` has
      written data files that no commit holds yet (the MERGE is running);
    - `gold_committed`: gold has the run's commit; the changelog and `corrections_state` do not;
    - `changelog_committed`: the changelog has the run's commit, `corrections_state` does not.
    Returns what the kill interrupted (re-checked after the kill: the commits that were still
    missing are still missing), or None when the process finished (or committed the next step)
    before the signal landed."""
    names = ("reconciled_aggregates", "late_corrections", "corrections_state")
    logs = {name: DeltaLog(settings.table_path(name)).refresh() for name in names}
    start = {name: log.version for name, log in logs.items()}
    before = {name: logs[name].data_files() for name in names[:2]}

    def new(name: str) -> bool:
        return logs[name].refresh().version > start[name]

    def pending_merge() -> tuple[str, ...] | None:
        for name in names[:2]:
            if not new(name) and (logs[name].data_files() - before[name]
                                  - logs[name].committed_files()):
                return (name,)
        return None

    # The commits that must still be missing after the kill for it to have landed at the hook.
    waiting_for = {"gold_committed": ("late_corrections", "corrections_state"),
                   "changelog_committed": ("corrections_state",)}
    done_first = {"gold_committed": "reconciled_aggregates",
                  "changelog_committed": "late_corrections"}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if hook == "merge_files_written":
            targets = pending_merge()
        else:
            targets = waiting_for[hook] if new(done_first[hook]) and not any(
                new(t) for t in waiting_for[hook]) else None
        if targets is not None:
            crash(proc)
            if any(new(t) for t in targets):
                return None
            return f"{hook} ({', '.join(targets)} not committed)"
        time.sleep(0.01)
    _kill(proc)
    raise AssertionError(f"corrections did not reach {hook} within {timeout}s: {output(proc)}")


def _corrections_main(argv: list[str]) -> int:
    from datetime import date

    from lakehouse.config.settings import Settings
    from spark_jobs.corrections import run_corrections
    from spark_jobs.session import get_spark

    d, run_id = date.fromisoformat(argv[0]), argv[1]
    settings = Settings.from_env()
    result = run_corrections(get_spark(settings), settings, d, run_id=run_id)
    print(f"corrections {d}: mode {result.mode}, corrected {result.corrected}, "
          f"inserted {result.inserted}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["corrections"]:
        sys.exit(_corrections_main(sys.argv[2:]))
    sys.exit("usage: python -m testkit.faults corrections <date> <run_id>")
