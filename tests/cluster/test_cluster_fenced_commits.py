"""`make test-cluster`: the commits of an s3a:// table are fenced by the writer locks, in the
commit itself. Self-contained (a few minutes on this machine, so in this tier rather than `make
test`): S3Proxy and PostgreSQL of its own on loopback, started by their own scripts, and two
Spark drivers of their own (tests/cluster/fenced_driver.py: classic local sessions of
`get_spark`, with the log store `make setup` builds) committing through the product's `Writer`.

- Two drivers that both commit version N: one commit is N, the other gets Delta's conflict
  (the lock server's key) and lands as N+1; nothing is lost or overwritten. A commit with no
  lock (outside the lock scheme) is put-if-absent only, and lands.
- A writer whose lock is taken over while its write is in flight (its lock session terminated,
  the lock taken by another connection; its fence check had passed before) commits nothing:
  `WriterLockLost`, the table's version unchanged.
- A commit in flight when its holder's session dies (its transaction in the lock server
  waiting) lands before the new holder's acquisition returns, and the new holder finds it.

The servers' synchronisation points are observed, not slept for: the lock server's own view
of who waits on what (pg_stat_activity), and the write's task's marker files."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from conftest import REPO, free_port

from lakehouse.config.env import overridden
from lakehouse.config.settings import Settings
from lakehouse.tables import commit_log, delta_log
from lakehouse.tables.locks import checkpoint_lock

HERE = Path(__file__).resolve().parent
BUCKET = "fenced"
STORE_APP = "delta commit log (lakehouse)"  # the log store's sessions (PgLogStore.java)


def wait_until(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


class Driver:
    """A driver process: commands in, one answer a line out (read by a thread of its own)."""

    def __init__(self, env: dict[str, str], log: Path):
        self.log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fenced_driver.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=REPO)
        self.answers: dict[int, dict] = {}
        self.lines: queue.Queue = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        self.jvm_pid = None

    def wait_ready(self) -> Driver:
        try:
            first = self.lines.get(timeout=300)
        except queue.Empty:
            pytest.fail(f"the driver did not start: see {self.log.name}")
        assert first.get("ready"), first
        self.jvm_pid = first["jvm_pid"]
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def send(self, op: str, **fields) -> int:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, cmd_id: int, timeout: float = 240.0) -> dict:
        deadline = time.monotonic() + timeout
        while cmd_id not in self.answers:
            assert self.proc.poll() is None, f"the driver died: see {self.log.name}"
            try:
                got = self.lines.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                assert time.monotonic() < deadline, f"no answer to command {cmd_id}"
                continue
            self.answers[got["id"]] = got
        return self.answers.pop(cmd_id)

    def call(self, op: str, **fields) -> dict:
        return self.answer(self.send(op, **fields))

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()


@dataclass
class Stack:
    settings: Settings  # the s3a:// root's
    a: Driver
    b: Driver
    url: str  # the lock server's
    s3_state: Path  # S3Proxy's folder (its filesystem backend's objects under data/)

    def uri(self, table: str) -> str:
        return self.settings.table_path(table)

    def entries(self, table: str) -> list[commit_log.Entry]:
        conn = psycopg2.connect(self.url)
        try:
            conn.autocommit = True
            return commit_log.entries(conn, self.uri(table))
        finally:
            conn.close()

    def versions(self, table: str) -> list[int]:
        """The commit files of the table's log, listed through the S3 API."""
        return delta_log.commit_versions(self.uri(table))

    def tags(self, table: str) -> dict[int, str | None]:
        return {v: delta_log.read_commit(self.uri(table), v).user_metadata
                for v in self.versions(table)}

    def labels(self, table: str) -> list[str]:
        rows = delta_log.open_table(self.settings, table).to_pyarrow_table().to_pylist()
        return sorted(r["label"] for r in rows)

    def temp_files(self, table: str) -> list[str]:
        root = str(self.settings.root)[len("s3a://"):]
        folder = self.s3_state / "data" / root / table / "_delta_log" / ".tmp"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture(scope="module")
def stack(pg_lock_url, tmp_path_factory):
    """S3Proxy on a free port (its own state folder and credentials), the suite's lock server,
    an s3a:// root on them, and two drivers."""
    key_id, secret = "fenced", f"s3-{uuid.uuid4().hex[:12]}"
    state = tempfile.mkdtemp(prefix="lakehouse-s3-test-", dir="/tmp")
    port = free_port()
    cli = [sys.executable, str(REPO / "infra/s3/s3proxy.py")]
    args = ["--state-dir", state, "--port", str(port), "--bucket", BUCKET]
    store_env = {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1",
                 "AWS_S3_PATH_STYLE": "true"}
    up = subprocess.run([*cli, "up", *args], env={**os.environ, **store_env},
                        capture_output=True, text=True, timeout=180)
    if up.returncode != 0:
        pytest.fail(f"S3Proxy did not start: {up.stderr.strip() or up.stdout}")
    env = {**os.environ, **store_env, "LAKEHOUSE_ROOT": f"s3a://{BUCKET}/run-{uuid.uuid4().hex[:8]}",
           "LAKEHOUSE_LOCK_URL": pg_lock_url, "SPARK_MASTER": "local[1]",
           "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_REMOTE", None)
    logs = tmp_path_factory.mktemp("drivers")
    drivers = []
    try:
        with overridden(store_env):  # this process's delta-rs and pyarrow reads of the store
            drivers = [Driver(env, logs / f"{name}.log") for name in ("a", "b")]
            for driver in drivers:  # started side by side
                driver.wait_ready()
            yield Stack(Settings.from_env(env), drivers[0], drivers[1], pg_lock_url,
                        Path(state))
    finally:
        for driver in drivers:
            driver.stop()
        subprocess.run([*cli, "down", *args], capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def one(url: str, sql: str, params: tuple = ()):
    """The first column of the first row of `sql`, in a transaction of its own (the server's
    activity view is a snapshot per transaction: a poll must not reuse one)."""
    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()[0]
    finally:
        conn.close()


def store_waits(url: str) -> int:
    """The log store's commit transactions waiting in the server at their insert (the commit
    point, past the fence's check)."""
    return one(url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND "
               "wait_event_type = 'Lock' AND query LIKE %s",
               (STORE_APP, f"INSERT INTO {commit_log.TABLE} %"))


def takeover_waits(url: str) -> int:
    """Lock holders' sessions waiting on an advisory lock (a takeover waiting for commits)."""
    return one(url, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
               "'lakehouse %%' AND wait_event_type = 'Lock' AND wait_event = 'advisory'")


def terminate(url: str, token: str) -> None:
    """End the lock session a fence token names (as a lost connection would)."""
    pid = int(token.split(":")[1])
    assert one(url, "SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: not one(url, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                               (pid,)), "the lock session's end")


class PendingEntry:
    """An uncommitted row of the commit log for `file_name`: a commit of that version waits on
    it in the server (the primary key) until `release` rolls it back."""

    def __init__(self, url: str, table: str, file_name: str):
        self.conn = psycopg2.connect(url)
        with self.conn.cursor() as cur:
            cur.execute(f"INSERT INTO {commit_log.TABLE} (table_path, file_name, temp_path, "
                        "complete) VALUES (%s, %s, 'held-by-the-test', false)",
                        (table, file_name))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def version_file(v: int) -> str:
    return f"{v:020d}.json"


def create(driver: Driver, lock: str, table: str, tag: str) -> None:
    token = driver.call("lock", name=lock)
    assert token["ok"], token
    done = driver.call("append", table=table, lock=lock, tag=tag, rows=2)
    assert done["ok"], done


def test_two_drivers_cannot_both_commit_a_version(stack):
    a, b, table = stack.a, stack.b, "race"
    create(a, "race-a", table, "a0")
    assert b.call("lock", name="race-b")["ok"]
    assert stack.versions(table) == [0]
    # Both drivers reach version 1's commit point, held there by an uncommitted row of it.
    pending = PendingEntry(stack.url, stack.uri(table), version_file(1))
    first = a.send("append", table=table, lock="race-a", tag="a1", rows=3)
    second = b.send("append", table=table, lock="race-b", tag="b1", rows=5)
    try:
        wait_until(lambda: store_waits(stack.url) == 2, "both commits of version 1 in the server")
    finally:
        pending.release()
    results = [a.answer(first), b.answer(second)]
    assert all(r["ok"] for r in results), results

    # One is version 1, the other was refused there (the key) and landed as version 2.
    assert stack.versions(table) == [0, 1, 2]
    tags = stack.tags(table)
    assert tags[0] == "a0" and {tags[1], tags[2]} == {"a1", "b1"}, tags
    found = stack.entries(table)
    assert [e.version for e in found] == [0, 1, 2] and all(e.complete for e in found)
    # Each commit fenced by its own driver's lock; every row of both appends is there.
    assert found[1].lock_keys != found[2].lock_keys
    assert stack.labels(table) == ["a0"] * 2 + ["a1"] * 3 + ["b1"] * 5
    # Neither attempt at version 1 leaves its temporary file: the refused one's is deleted at
    # the refusal, the winner's once its entry is complete.
    wait_until(lambda: not [n for n in stack.temp_files(table) if n.startswith(version_file(1))],
               "the temporary files of version 1 deleted", timeout=30)
    # A commit outside the lock scheme (no fence) is put-if-absent only: it lands after them.
    unfenced = b.call("append", table=table, tag="no-lock", rows=1)
    assert unfenced["ok"], unfenced
    assert stack.versions(table) == [0, 1, 2, 3]
    assert stack.entries(table)[3].lock_keys == () and stack.tags(table)[3] == "no-lock"


def test_a_writer_whose_lock_was_taken_over_commits_nothing(stack, tmp_path):
    a, table = stack.a, "stale"
    token = a.call("lock", name="stale-lock")["token"]
    done = a.call("append", table=table, lock="stale-lock", tag="held", rows=2)
    assert done["ok"], done
    # A write in flight (its fence check passed: it held the lock), paused in its task...
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    pending = a.send("append", table=table, lock="stale-lock", tag="stale", rows=4,
                     barrier=str(barrier))
    wait_until(lambda: (barrier / "started").exists(), "the write in flight")
    # ... while its lock session dies and another connection takes the lock over.
    terminate(stack.url, token)
    with checkpoint_lock(stack.settings, "stale-lock") as fence:
        fence.check()
        (barrier / "go").touch()  # the write resumes: its commit comes after the takeover
        refused = a.answer(pending)
        assert not refused["ok"] and refused["error"] == "WriterLockLost", refused
        assert "no longer held" in refused["message"]
        assert stack.versions(table) == [0]
        assert [e.version for e in stack.entries(table)] == [0]
    assert stack.labels(table) == ["held"] * 2
    # The refused attempt's temporary file is deleted (no entry names it).
    wait_until(lambda: not [n for n in stack.temp_files(table) if n.startswith(version_file(1))],
               "the refused attempt's temporary file deleted", timeout=30)


def test_a_commit_in_flight_lands_before_the_takeover_returns(stack):
    a, table = stack.a, "inflight"
    token = a.call("lock", name="inflight-lock")["token"]
    done = a.call("append", table=table, lock="inflight-lock", tag="first", rows=1)
    assert done["ok"], done
    # The holder's next commit, past its check, in the lock server's transaction: waiting on
    # a row of its version that the test holds uncommitted.
    pending = PendingEntry(stack.url, stack.uri(table), version_file(1))
    commit = a.send("append", table=table, lock="inflight-lock", tag="in-flight", rows=2)
    released = False
    stop = threading.Event()
    try:
        wait_until(lambda: store_waits(stack.url) == 1, "the commit's transaction")
        terminate(stack.url, token)  # the holder's lock session dies meanwhile
        taken = threading.Event()
        seen: list[list[int]] = []

        def take_over():
            with checkpoint_lock(stack.settings, "inflight-lock"):
                seen.append([e.version for e in stack.entries(table)])
                taken.set()
                stop.wait(120)

        taker = threading.Thread(target=take_over, daemon=True)
        taker.start()
        # The new holder has the advisory lock and waits for the commit in flight.
        wait_until(lambda: takeover_waits(stack.url) == 1, "the takeover waiting")
        assert not taken.is_set()
        pending.release()
        released = True
        wait_until(taken.is_set, "the takeover")
        assert seen == [[0, 1]]  # the commit in flight had landed when the takeover returned
        landed = a.answer(commit)
        assert landed["ok"], landed
        # The old holder commits nothing more (its own check fails first now).
        again = a.call("append", table=table, lock="inflight-lock", tag="after", rows=1)
        assert not again["ok"] and again["error"] == "WriterLockLost", again
    finally:
        stop.set()
        if not released:
            pending.release()
    assert stack.versions(table) == [0, 1]
    assert stack.tags(table) == {0: "first", 1: "in-flight"}


def test_a_table_deleted_and_created_again_starts_a_new_log(stack):
    """The commit log's rows of a deleted table (kept a day) do not stand in the way of a table
    created again at its path: its creation clears them."""
    from lakehouse.config import storage

    a, table = stack.a, "again"
    create(a, "again-lock", table, "old")
    assert a.call("append", table=table, lock="again-lock", tag="old", rows=1)["ok"]
    assert [e.version for e in stack.entries(table)] == [0, 1]
    assert storage.delete_tree(stack.uri(table))
    done = a.call("append", table=table, lock="again-lock", tag="new", rows=3)
    assert done["ok"], done
    assert stack.versions(table) == [0] and stack.labels(table) == ["new"] * 3
    assert [e.version for e in stack.entries(table)] == [0]


def test_the_lock_server_password_is_on_no_command_line(stack):
    password = psycopg2.extensions.parse_dsn(stack.url)["password"]
    cmdline = Path(f"/proc/{stack.a.jvm_pid}/cmdline").read_bytes().decode(errors="replace")
    assert "PgLogStore" in cmdline and password not in cmdline
