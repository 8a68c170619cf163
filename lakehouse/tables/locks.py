"""One writer at a time: for the stream's checkpoint (and the tables it writes) and for each event
date of the daily tables.

- On a local root: exclusive OS file locks under $LAKEHOUSE_ROOT/_locks, held by the process
  (the kernel releases them when it dies, so a SIGKILL leaves no stale lock). Delta's local log
  store commits with an atomic rename, so the file lock is all a local root needs.
- On an object store: a session-held PostgreSQL advisory lock (LAKEHOUSE_LOCK_URL), keyed by the
  root and the lock's name. Delta's default S3 log store is safe for one writing driver only
  (two drivers can both write `_delta_log/N.json`, and one commit is lost), so nothing writes a
  table there without it. The server holds the lock for as long as the holder's connection
  lives: a paused holder (SIGSTOP, a long GC) keeps it, so a second runner stays out; a holder
  whose connection broke has lost it, and `Fence.check()`, called before every commit, stops
  it with `WriterLockLost`.

The stream's lock is taken without waiting (a second runner fails at once with
`CheckpointBusy`); a date's lock waits (a second corrections run of the date waits its turn).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path

from lakehouse.config.storage import local_path
from lakehouse.tables.catalog import LOCKS_DIR


class CheckpointBusy(RuntimeError):
    pass


class DateBusy(TimeoutError):
    pass


class WriterLockLost(RuntimeError):
    """The writer lock is no longer held: the holder must not commit again."""


class LockUnavailable(RuntimeError):
    """No mechanism can give mutual exclusion on this root."""


class Fence:
    """What a writer checks before each commit. A file lock cannot be lost while its process
    lives: nothing to check."""

    def check(self) -> None:
        return None


class _PgFence(Fence):
    def __init__(self, conn, key: int, what: str):
        self.conn, self.key, self.what = conn, key, what

    def check(self) -> None:
        classid, objid = (self.key >> 32) & 0xFFFFFFFF, self.key & 0xFFFFFFFF
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                            "pid = pg_backend_pid() AND granted AND classid = %s::int8::oid "
                            "AND objid = %s::int8::oid AND objsubid = 1", (classid, objid))
                held = cur.fetchone()[0] > 0
        except Exception as exc:  # noqa: BLE001 - any failure to ask means: not provably held
            raise WriterLockLost(f"{self.what}: the lock server cannot confirm the lock "
                                 f"({type(exc).__name__}); not committing") from exc
        if not held:
            raise WriterLockLost(f"{self.what}: the writer lock is no longer held; not committing")


def _key(root: str, name: str) -> int:
    """A signed 64-bit advisory lock key for (root, name)."""
    digest = hashlib.sha256(f"{root.rstrip('/')}|{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _me() -> str:
    return f"lakehouse {socket.gethostname()} pid {os.getpid()}"


@contextmanager
def _pg_lock(url: str | None, root: str, name: str, what: str, wait_s: float | None):
    """Hold the advisory lock (root, name) on a connection of its own; yields its fence.
    `wait_s` None: fail at once when another session holds it."""
    if not url:
        raise LockUnavailable(
            f"{what} on the object store {root} needs LAKEHOUSE_LOCK_URL: a PostgreSQL server "
            "that keeps one writer per table (Delta's S3 log store is safe for one writer "
            "only). The cluster stack's is postgresql://dagster:…@127.0.0.1:5433/dagster.")
    import psycopg2

    key = _key(root, name)
    conn = psycopg2.connect(url, application_name=_me()[:63], connect_timeout=10)
    conn.autocommit = True
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                if cur.fetchone()[0]:
                    break
                cur.execute("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                            "USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND "
                            "l.objid = %s::int8::oid LIMIT 1", (key & 0xFFFFFFFF,))
                row = cur.fetchone()
            holder = row[0] if row and row[0] else "another process"
            if deadline is None:
                raise CheckpointBusy(f"{what} under {root} is in use by {holder}: stop that "
                                     "runner (make stream / a running catch-up) or wait for it")
            if time.monotonic() > deadline:
                raise DateBusy(f"{what} under {root} is held by {holder} for more than "
                               f"{wait_s:.0f}s")
            time.sleep(0.5)
        yield _PgFence(conn, key, what)
    finally:
        conn.close()  # releases the lock with the session


@contextmanager
def _file_lock(root: Path, name: str, what: str, wait_s: float | None):
    path = root / LOCKS_DIR / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None:
                    holder = path.read_text().strip() or "another process"
                    raise CheckpointBusy(
                        f"{what} under {root} is in use by {holder}: stop that runner "
                        "(make stream / a running catch-up) or wait for it to finish") from None
                if time.monotonic() > deadline:
                    raise DateBusy(f"{what} is being written by another run for more than "
                                   f"{wait_s:.0f}s ({path})") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        yield Fence()
    finally:
        os.close(fd)


@contextmanager
def _lock(settings, name: str, what: str, wait_s: float | None):
    root = local_path(str(settings.root))
    if root is not None:
        with _file_lock(root, name, what, wait_s) as fence:
            yield fence
    else:
        with _pg_lock(settings.lock_dsn, str(settings.root), name, what, wait_s) as fence:
            yield fence


@contextmanager
def checkpoint_lock(settings, name: str = "ingest"):
    """One runner per stream checkpoint (and so one writer of the tables it writes); fails at
    once when held. Yields the `Fence` to check before each commit."""
    with _lock(settings, name, f"the stream checkpoint {name!r}", None) as fence:
        yield fence


@contextmanager
def date_lock(settings, d: date, timeout_s: float = 1800.0):
    """Serialize writers of one event date's daily tables (corrections, replay, compaction)."""
    with _lock(settings, f"date-{d.isoformat()}", f"event date {d}", timeout_s) as fence:
        yield fence
