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
  it with `WriterLockLost`. A check before a commit cannot stop a commit already under way, so
  the commit itself is fenced too: Delta's log store for s3a:// (`lakehouse.tables.commit_log`)
  makes each commit a row of the lock server, inserted in one transaction only while the
  writer's session holds the lock (the fence's `tokens`), under a shared transaction lock that
  a new holder takes exclusively once it has the lock (`_await_commits`): a commit in flight
  lands before the takeover returns, and none of the old holder's lands after it. The new
  holder then completes the commits that landed without their N.json
  (`commit_log.complete_interrupted`).

The stream's lock is taken without waiting (a second runner fails at once with
`CheckpointBusy`); a date's lock waits (a second corrections run of the date waits its turn).

Who holds a lock can be asked without taking it (`checkpoint_holder`, `lock_holder`): the
holder's pid, host, since when and what it is (the role a process declares with `set_role`, e.g.
"the streaming service"). A local root answers from the kernel's table of file locks
(/proc/locks), so the record a dead holder left in the lock file never counts as held; an
object store from the lock server (pg_locks: a session that holds the advisory lock).

Work that outlives its holder: a run over Spark Connect (SPARK_REMOTE) writes through operations
that run in the server, and an operation whose client was killed keeps running there (detached,
until the server's `spark.connect.execute.manager.detachedTimeout`, 5 minutes by default) and can
still commit. So a holder with such a session records it with the lock (`set_remote_work`: a
second line of a local root's lock file; on an object store a row of the lock server's table
`lakehouse_lock_work`, keyed by the lock), the record is cleared when the lock is released, and a
holder that finds one left by a predecessor (which died holding the lock) first stops that
session's operations and waits until none runs (the callback `on_orphaned_work` registers;
spark_jobs.connect_work), before it writes anything.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from lakehouse.config.storage import local_path
from lakehouse.tables import commit_log
from lakehouse.tables.catalog import LOCKS_DIR


class CheckpointBusy(RuntimeError):
    pass


class DateBusy(TimeoutError):
    pass


class WriterLockLost(RuntimeError):
    """The writer lock is no longer held: the holder must not commit again."""


class LockUnavailable(RuntimeError):
    """No mechanism can give mutual exclusion on this root."""


@dataclass(frozen=True)
class RemoteWork:
    """A Spark Connect session a lock's holder writes through: the server's host:port (never its
    URL's parameters, which may hold a token), the session's id and user."""

    endpoint: str
    session_id: str
    user_id: str | None = None

    def line(self) -> str:
        return f"connect {self.endpoint} {self.session_id} {self.user_id or '-'}"

    @classmethod
    def parse(cls, line: str) -> RemoteWork | None:
        parts = line.split()
        if len(parts) != 4 or parts[0] != "connect":
            return None
        return cls(parts[1], parts[2], None if parts[3] == "-" else parts[3])


_REMOTE_WORK: RemoteWork | None = None
_STOP_ORPHANED = None


def set_remote_work(work: RemoteWork | None) -> None:
    """The Spark Connect session this process writes through (None: its own driver), recorded
    with every lock it takes from now on."""
    global _REMOTE_WORK
    _REMOTE_WORK = work


def on_orphaned_work(stop) -> None:
    """`stop(settings, what, work)`: stop the operations of a dead holder's session `work` and
    return once none of them runs (called with the lock held, before the new holder writes)."""
    global _STOP_ORPHANED
    _STOP_ORPHANED = stop


class Fence:
    """What a writer checks before each commit. A file lock cannot be lost while its process
    lives: nothing to check."""

    def check(self) -> None:
        return None

    def tokens(self) -> tuple[str, ...]:
        """What the commit itself checks on an object store (`commit_log`): `key:pid:start` of
        each lock server lock held (its key, its session's backend pid and start in
        microseconds). None for a file lock."""
        return ()


class Fences(Fence):
    """The fences of every lock a writer holds (a maintainer: the stream's and some dates'):
    each is checked."""

    def __init__(self):
        self.held: list[Fence] = []

    def add(self, fence: Fence) -> None:
        self.held.append(fence)

    def check(self) -> None:
        for fence in self.held:
            fence.check()

    def tokens(self) -> tuple[str, ...]:
        return tuple(t for fence in self.held for t in fence.tokens())


class _PgFence(Fence):
    def __init__(self, conn, key: int, what: str):
        self.conn, self.key, self.what = conn, key, what
        with conn.cursor() as cur:  # who holds it: this session, as the server knows it
            cur.execute("SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 FROM "
                        "pg_stat_activity WHERE pid = pg_backend_pid()")
            pid, start_us = cur.fetchone()
        self.token = f"{key}:{pid}:{start_us}"

    def tokens(self) -> tuple[str, ...]:
        return (self.token,)

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


def commit_lock(key: int) -> tuple[int, int]:
    """The two-int advisory lock of lock `key`'s commits (its key's halves, as signed ints): the
    log store's commit transactions take it shared (`commit_log`), a new holder exclusively."""
    hi, lo = key >> 32, key & 0xFFFFFFFF
    return hi, lo - (1 << 32) if lo >= 1 << 31 else lo


# How long a new holder waits for the old holder's commits in flight before it ends them (a
# commit transaction lasts milliseconds; one left open by a paused process would block it).
TAKEOVER_WAIT_S = 30.0


def _await_commits(conn, key: int, what: str) -> None:
    """With the advisory lock `key` just taken: wait until no commit transaction fenced by it
    runs (each holds the commit lock shared, so this waits for those of the old holder that
    passed their check, and every later check sees the new holder). One that outlasts
    TAKEOVER_WAIT_S (its process paused mid-commit) has its session ended by the server: its
    transaction rolls back and its commit lands nothing."""
    import psycopg2

    hi, lo = commit_lock(key)
    with conn.cursor() as cur:
        for _ in range(3):
            try:
                cur.execute("SET lock_timeout = %s", (f"{int(TAKEOVER_WAIT_S * 1000)}ms",))
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (hi, lo))  # and released
                return
            except psycopg2.errors.LockNotAvailable:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                            "'advisory' AND granted AND objsubid = 2 AND classid = "
                            "%s::int8::oid AND objid = %s::int8::oid AND pid <> pg_backend_pid()",
                            (hi & 0xFFFFFFFF, lo & 0xFFFFFFFF))
            finally:
                cur.execute("RESET lock_timeout")
    raise LockUnavailable(f"{what}: a commit of its previous holder is still in flight and "
                          "cannot be ended; not writing")


# What the stream's runners say they are (`set_role`, `checkpoint_lock(role=...)`): both ingest.
SERVICE_ROLE = "the streaming service"
CATCH_UP_ROLE = "a stream catch-up"
INGESTING_ROLES = (SERVICE_ROLE, CATCH_UP_ROLE)

_ROLE: str | None = None
_ACTING_AS: ContextVar[str | None] = ContextVar("lakehouse_lock_role", default=None)


def set_role(role: str | None) -> None:
    """What this process is, as the locks it takes from now on record it (and `LockHolder`
    reports it): e.g. "the streaming service"."""
    global _ROLE
    _ROLE = role


@contextmanager
def acting_as(role: str):
    """Within the block, the locks this thread (context) takes record `role` (e.g. "a stream
    catch-up"), over the process's `set_role`."""
    token = _ACTING_AS.set(role)
    try:
        yield
    finally:
        _ACTING_AS.reset(token)


def _role(role: str | None) -> str | None:
    return role or _ACTING_AS.get() or _ROLE


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock now: as its record (file) or its session (PostgreSQL) says."""

    lock: str  # what is locked, e.g. "the stream checkpoint 'ingest'"
    pid: int | None
    host: str | None
    since: datetime | None
    role: str | None  # what the holder said it is (`set_role`), None when it said nothing

    @property
    def is_this_process(self) -> bool:
        return self.pid == os.getpid() and self.host in (None, socket.gethostname())

    def describe(self) -> str:
        """e.g. "the streaming service (pid 1234 on host, since 2026-11-27T10:00:00Z)"."""
        where = " ".join(x for x in (f"pid {self.pid}" if self.pid is not None else "",
                                     f"on {self.host}" if self.host else "") if x)
        when = f"since {self.since.strftime('%Y-%m-%dT%H:%M:%SZ')}" if self.since else ""
        detail = ", ".join(x for x in (where, when) if x)
        who = self.role or "a process"
        return f"{who} ({detail})" if detail else who

    def as_metadata(self) -> dict:
        return {"lock": self.lock, "pid": self.pid, "host": self.host, "role": self.role,
                "since": self.since.isoformat() if self.since else None}


def _me(role: str | None = None) -> str:
    role = _role(role)
    role = f" ({role})" if role else ""
    return f"lakehouse {socket.gethostname()} pid {os.getpid()}{role}"


_APP_NAME = re.compile(r"^lakehouse (\S+) pid (\d+)(?: \(([^)]*)\)?)?")
_RECORD = re.compile(r"^pid (\d+)(?: on (\S+))?(?: since (\S+))?(?: \((.*)\))?$")


def _record(role: str | None = None) -> str:
    """What a file lock's holder writes into the lock file (its CheckpointBusy text, too)."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    role = _role(role)
    role = f" ({role})" if role else ""
    return f"pid {os.getpid()} on {socket.gethostname()} since {since}{role}"


def _parse_since(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _kernel_flock_pids(path: Path) -> tuple[list[int], list[int]] | None:
    """The pids holding an flock on `path`'s inode per /proc/locks: (those on its device,
    those on any device: overlay file systems may report the lower device). None when the
    kernel has no such table (not Linux)."""
    try:
        table = Path("/proc/locks").read_text()
        st = path.stat()
    except FileNotFoundError:
        return None if not Path("/proc/locks").exists() else ([], [])
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    exact, inode_only = [], []
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        pid, where = fields[4], fields[5]
        dev, _, ino = where.rpartition(":")
        if ino != str(st.st_ino) or not pid.isdigit():
            continue
        inode_only.append(int(pid))
        if dev == device:
            exact.append(int(pid))
    return exact, inode_only


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host. A zombie (killed, not yet reaped by its parent)
    does not: a run killed with SIGKILL holds nothing. The one liveness rule of the locks and of
    the local servers' scripts (infra/daemon.py)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _file_holder(root: Path, name: str, what: str) -> LockHolder | None:
    path = root / LOCKS_DIR / f"{name}.lock"
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None  # never taken
    m = _RECORD.match(text.split("\n", 1)[0])
    pid, host, since, role = (int(m.group(1)), m.group(2), _parse_since(m.group(3)),
                              m.group(4)) if m else (None, None, None, None)
    pids = _kernel_flock_pids(path)
    if pids is None:  # no kernel lock table: the record, believed while its pid lives here
        if pid is None or host not in (None, socket.gethostname()) or not pid_alive(pid):
            return None
        return LockHolder(what, pid, host, since, role)
    exact, inode_only = pids
    if pid is not None and (pid in exact or pid in inode_only):
        return LockHolder(what, pid, host, since, role)
    if exact:  # held, by a process whose record is not (yet) written: the kernel's pid
        return LockHolder(what, exact[0], socket.gethostname(), None, None)
    return None  # a record left by a holder that is gone: not held


def _pg_holder(url: str | None, root: str, name: str, what: str) -> LockHolder | None:
    if not url:
        raise LockUnavailable(f"{what} on the object store {root}: who holds it is kept by the "
                              "lock server, and LAKEHOUSE_LOCK_URL is not set")
    import psycopg2

    key = _key(root, name)
    classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    conn = psycopg2.connect(url, application_name="lakehouse lock query", connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT a.application_name, a.backend_start, a.client_hostname, "
                        "host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::int8::oid "
                        "AND l.objid = %s::int8::oid AND l.objsubid = 1 LIMIT 1", (classid, objid))
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None:
        return None
    app, started, client_host, client_addr = row
    m = _APP_NAME.match(app or "")
    if m:
        return LockHolder(what, int(m.group(2)), m.group(1), started, m.group(3))
    return LockHolder(what, None, client_host or client_addr, started, app or None)


# The Spark Connect sessions of an object-store lock's holders (`RemoteWork.line`), by lock key:
# the advisory lock dies with its holder's connection, this row does not.
_WORK_TABLE = "lakehouse_lock_work"


def _pg_remote_work(conn, key: int, settings, what: str) -> None:
    """With the advisory lock held: stop the sessions a dead predecessor recorded, then record
    this holder's (the file lock's second lines, in the lock server)."""
    import psycopg2

    with conn.cursor() as cur:
        try:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {_WORK_TABLE} (lock_key BIGINT NOT NULL, "
                        "work TEXT NOT NULL, PRIMARY KEY (lock_key, work))")
        except (psycopg2.errors.UniqueViolation, psycopg2.errors.DuplicateTable):
            pass  # created at the same moment by a holder of another lock
        cur.execute(f"SELECT work FROM {_WORK_TABLE} WHERE lock_key = %s", (key,))
        orphans = [w for (line,) in cur.fetchall()
                   if (w := RemoteWork.parse(line)) and w != _REMOTE_WORK]
        if orphans:
            _stop_orphans(settings, what, orphans)
            cur.execute(f"DELETE FROM {_WORK_TABLE} WHERE lock_key = %s AND work = ANY(%s)",
                        (key, [w.line() for w in orphans]))
        if _REMOTE_WORK:
            cur.execute(f"INSERT INTO {_WORK_TABLE} VALUES (%s, %s) ON CONFLICT DO NOTHING",
                        (key, _REMOTE_WORK.line()))


@contextmanager
def _pg_lock(url: str | None, root: str, name: str, what: str, wait_s: float | None,
             role: str | None = None, settings=None):
    """Hold the advisory lock (root, name) on a connection of its own; yields its fence.
    `wait_s` None: fail at once when another session holds it."""
    if not url:
        raise LockUnavailable(
            f"{what} on the object store {root} needs LAKEHOUSE_LOCK_URL: a PostgreSQL server "
            "that keeps one writer per table (Delta's S3 log store is safe for one writer "
            "only). The cluster stack's is postgresql://dagster:…@127.0.0.1:5433/dagster.")
    import psycopg2

    key = _key(root, name)
    conn = psycopg2.connect(url, application_name=_me(role)[:63], connect_timeout=10)
    conn.autocommit = True
    recorded = None
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                if cur.fetchone()[0]:
                    break
                cur.execute("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                            "USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND "
                            "l.classid = %s::int8::oid AND l.objid = %s::int8::oid AND "
                            "l.objsubid = 1 LIMIT 1", ((key >> 32) & 0xFFFFFFFF,
                                                       key & 0xFFFFFFFF))
                row = cur.fetchone()
            holder = row[0] if row and row[0] else "another process"
            if deadline is None:
                raise CheckpointBusy(f"{what} under {root} is in use by {holder}: stop that "
                                     "runner (make stream / a running catch-up) or wait for it")
            if time.monotonic() > deadline:
                raise DateBusy(f"{what} under {root} is held by {holder} for more than "
                               f"{wait_s:.0f}s")
            time.sleep(0.5)
        _await_commits(conn, key, what)
        commit_log.complete_interrupted(conn, key)
        _pg_remote_work(conn, key, settings, what)
        recorded = _REMOTE_WORK
        yield _PgFence(conn, key, what)
    finally:
        if recorded:  # released: no work of this holder outlives it, so nothing to stop
            try:
                with conn.cursor() as cur:
                    cur.execute(f"DELETE FROM {_WORK_TABLE} WHERE lock_key = %s AND work = %s",
                                (key, recorded.line()))
            except Exception:  # noqa: BLE001 - a lost connection: the next holder stops it
                pass
        conn.close()  # releases the lock with the session


@contextmanager
def _file_lock(root: Path, name: str, what: str, wait_s: float | None,
               role: str | None = None, settings=None):
    path = root / LOCKS_DIR / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # its holder's session ids: owner only
    os.fchmod(fd, 0o600)  # one made before as 0644 too
    held = False
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is None:
                    holder = path.read_text().strip().split("\n", 1)[0] or "another process"
                    raise CheckpointBusy(
                        f"{what} under {root} is in use by {holder}: stop that runner "
                        "(make stream / a running catch-up) or wait for it to finish") from None
                if time.monotonic() > deadline:
                    raise DateBusy(f"{what} is being written by another run for more than "
                                   f"{wait_s:.0f}s ({path})") from None
                time.sleep(0.5)
        held = True
        previous = os.pread(fd, 65536, 0).decode(errors="replace").strip().split("\n")
        orphans = [w for line in previous[1:] if (w := RemoteWork.parse(line))
                   and w != _REMOTE_WORK]
        record = _record(role)
        mine = [_REMOTE_WORK.line()] if _REMOTE_WORK else []
        if orphans:
            # A predecessor died holding the lock with a Connect session: its sessions stay
            # recorded until they are stopped (a holder dying before that leaves them to the
            # next one), and nothing is written before.
            _write(fd, [record, *(w.line() for w in orphans), *mine])
            _stop_orphans(settings, what, orphans)
        _write(fd, [record, *mine])
        yield Fence()
    finally:
        if held:  # released: no work of this holder outlives it, so nothing to stop
            _write(fd, [record])
        os.close(fd)


def _write(fd: int, lines: list[str]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, "\n".join(lines).encode(), 0)


def _stop_orphans(settings, what: str, orphans: list[RemoteWork]) -> None:
    if _STOP_ORPHANED is None:
        raise LockUnavailable(
            f"{what}: its last holder died with a Spark Connect session whose operations may "
            "still write; this process cannot stop them (spark_jobs.connect_work is not loaded)")
    for work in orphans:
        _STOP_ORPHANED(settings, what, work)


@contextmanager
def _lock(settings, name: str, what: str, wait_s: float | None, role: str | None = None):
    root = local_path(str(settings.root))
    if root is not None:
        with _file_lock(root, name, what, wait_s, role, settings) as fence:
            yield fence
    else:
        with _pg_lock(settings.lock_dsn, str(settings.root), name, what, wait_s,
                      role, settings) as fence:
            yield fence


def lock_holder(settings, name: str, what: str | None = None) -> LockHolder | None:
    """Who holds lock `name` of `settings`' root now, None when nobody does; asked without
    taking it (no Spark). The kernel (local root) or the lock server (object store) decides, so
    a stale record of a holder that is gone is not a holder. Raises `LockUnavailable` for an
    object store without LAKEHOUSE_LOCK_URL, and the server's errors when it cannot answer."""
    what = what or name
    root = local_path(str(settings.root))
    if root is not None:
        return _file_holder(root, name, what)
    return _pg_holder(settings.lock_dsn, str(settings.root), name, what)


def checkpoint_holder(settings, name: str = "ingest") -> LockHolder | None:
    """Who holds the stream checkpoint `name` (`checkpoint_lock`) now: the streaming service,
    a catch-up, ...; None when it is free."""
    return lock_holder(settings, name, f"the stream checkpoint {name!r}")


@contextmanager
def checkpoint_lock(settings, name: str = "ingest", role: str | None = None):
    """One runner per stream checkpoint (and so one writer of the tables it writes); fails at
    once when held. Yields the `Fence` to check before each commit. `role`: what the holder is,
    as `checkpoint_holder` reports it (default: `acting_as`'s, else the process's `set_role`)."""
    with _lock(settings, name, f"the stream checkpoint {name!r}", None, role) as fence:
        yield fence


@contextmanager
def date_lock(settings, d: date, timeout_s: float = 1800.0):
    """Serialize writers of one event date's daily tables (corrections, replay, compaction)."""
    with _lock(settings, f"date-{d.isoformat()}", f"event date {d}", timeout_s) as fence:
        yield fence


@contextmanager
def registry_lock(settings, timeout_s: float = 300.0):
    """Serialize writers of a pipeline's generations registry (`spec_generations`, in the
    pipeline's folder `settings`): generations' stream starts and a switch hold different stream
    locks, and Delta's S3 log store is safe for one writer at a time."""
    with _lock(settings, "generations", "the generations registry", timeout_s) as fence:
        yield fence
