"""One writer at a time, on every root: OS file locks on a local root, a session-held advisory lock
on a real PostgreSQL server for an object-store root. A paused holder keeps its lock (a second
runner stays out); a killed holder frees it; a holder whose session is gone fails its fence
check before the next commit; no lock server, no writer."""

import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import date

import pytest

from lakehouse.config.settings import Settings
from lakehouse.tables.locks import (
    CheckpointBusy,
    LockUnavailable,
    RemoteWork,
    WriterLockLost,
    checkpoint_lock,
    date_lock,
)

ROOT = "s3a://bucket/lake"


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def process_state(pid: int) -> str:
    """The kernel's state letter for a process (`T`: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def lakehouse_sessions(url: str) -> int:
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                    "'lakehouse %'")
        return cur.fetchone()[0]


def store(url: str | None) -> Settings:
    return Settings.from_env({"LAKEHOUSE_ROOT": f"{ROOT}-{time.monotonic_ns()}",
                              "LAKEHOUSE_LOCK_URL": url or ""})


def holder_process(settings: Settings, work: RemoteWork | None = None) -> subprocess.Popen:
    """Another process holding the stream's lock until killed; prints 'held' once it has it.
    `work`: the Spark Connect session it records with the lock."""
    code = textwrap.dedent(f"""
        import sys, time
        from lakehouse.tables.locks import RemoteWork, checkpoint_lock, set_remote_work
        from lakehouse.config.settings import Settings
        s = Settings.from_env({{"LAKEHOUSE_ROOT": {settings.root!r},
                               "LAKEHOUSE_LOCK_URL": {settings.lock_dsn or ""!r}}})
        set_remote_work({work!r})
        with checkpoint_lock(s, "ingest"):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def take_when_freed(settings: Settings, timeout: float = 30.0) -> None:
    """Take the stream's lock (and check its fence) once the lock server has seen a killed
    holder's session end."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with checkpoint_lock(settings, "ingest") as fence:
                fence.check()
            return
        except CheckpointBusy:
            assert time.monotonic() < deadline, "the killed holder's lock was not freed"
            time.sleep(0.2)


def test_a_local_root_takes_one_runner(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    with checkpoint_lock(settings, "ingest") as fence:
        fence.check()
        with pytest.raises(CheckpointBusy, match="in use by pid"):
            with checkpoint_lock(settings, "ingest"):
                pass
    with checkpoint_lock(settings, "ingest"):
        pass  # released


def test_an_object_store_root_without_a_lock_server_is_refused():
    with pytest.raises(LockUnavailable, match="LAKEHOUSE_LOCK_URL"):
        with checkpoint_lock(store(None), "ingest"):
            pass


def test_a_paused_holder_keeps_the_lock_and_a_killed_one_frees_it(pg_lock_url):
    settings = store(pg_lock_url)
    holder = holder_process(settings)
    try:
        holder.send_signal(signal.SIGSTOP)  # paused far longer than any lease would last
        wait_until(lambda: process_state(holder.pid) == "T", "the holder stopped")
        with pytest.raises(CheckpointBusy, match=f"pid {holder.pid}"):
            with checkpoint_lock(settings, "ingest"):
                pass
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait(30)
        take_when_freed(settings)
    finally:
        holder.kill()


def test_a_holder_whose_session_is_gone_stops_before_its_next_commit(pg_lock_url):
    import psycopg2

    settings = store(pg_lock_url)
    with checkpoint_lock(settings, "ingest") as fence:
        fence.check()
        with psycopg2.connect(pg_lock_url) as admin, admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'lakehouse %' AND pid <> pg_backend_pid()")
        with pytest.raises(WriterLockLost, match="not committing"):
            fence.check()
        # Meanwhile another runner can take it.
        with checkpoint_lock(settings, "ingest") as other:
            other.check()


def test_a_redrive_on_an_object_store_is_refused_while_the_stream_holds_its_lock(pg_lock_url):
    """The redrive appends to the stream's tables; on an object store those take one writing
    driver, so while the stream holds its lock the redrive stops before anything else (no Spark
    touched, no table read), naming why and what to do."""
    from spark_jobs.redrive import run_redrive

    settings = store(pg_lock_url)
    holder = holder_process(settings)
    try:
        with pytest.raises(CheckpointBusy, match=r"redrive refused: on an object store .* "
                                                 r"Run it while the stream is stopped"):
            run_redrive(None, settings, date(2026, 11, 30), "run-1")
    finally:
        holder.kill()
        holder.wait()
    take_when_freed(settings)


def test_the_connect_session_of_a_killed_holder_is_stopped_by_the_next_one(pg_lock_url,
                                                                           monkeypatch):
    """An object-store lock's holder over Spark Connect records its session with the lock
    server; the next holder after a kill stops it (once) before it writes; a holder that
    released its lock leaves nothing to stop (spark_jobs.connect_work stops a real session:
    tests/e2e/test_killed_run.py)."""
    import lakehouse.tables.locks as locks

    stopped = []
    monkeypatch.setattr(locks, "_STOP_ORPHANED", lambda s, what, w: stopped.append((what, w)))
    settings = store(pg_lock_url)
    dead = RemoteWork("127.0.0.1:15002", "0f3a-dead", "runner")
    holder = holder_process(settings, dead)
    holder.kill()
    holder.wait(30)
    take_when_freed(settings)
    assert [w for _, w in stopped] == [dead]  # stopped as the next holder took the lock
    with checkpoint_lock(settings, "ingest"):  # stopped once: its record is gone
        pass
    assert len(stopped) == 1 and "ingest" in stopped[0][0]

    # This process over Connect: recorded while it holds the lock, cleared at the release.
    live = RemoteWork("127.0.0.1:15002", "1b2c-live", None)
    monkeypatch.setattr(locks, "_REMOTE_WORK", live)
    with checkpoint_lock(settings, "ingest"):
        import psycopg2

        with psycopg2.connect(pg_lock_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT work FROM lakehouse_lock_work")
            assert (live.line(),) in cur.fetchall()
    monkeypatch.setattr(locks, "_REMOTE_WORK", None)
    with checkpoint_lock(settings, "ingest"):
        pass
    assert len(stopped) == 1


def test_writers_of_a_date_take_turns(pg_lock_url):
    settings = store(pg_lock_url)
    order: list[str] = []
    with date_lock(settings, date(2026, 11, 20)):
        def second():
            with date_lock(settings, date(2026, 11, 20)):
                order.append("second")

        t = threading.Thread(target=second)
        t.start()
        # the second writer is connected and polling for the lock
        wait_until(lambda: lakehouse_sessions(pg_lock_url) >= 2, "the second writer's session")
        with date_lock(settings, date(2026, 11, 21)):  # another date is not blocked
            order.append("other date")
        order.append("first")
    t.join(30)
    assert order == ["other date", "first", "second"]


def test_the_runs_role_is_not_a_superuser(pg_lock_url):
    """The role the runs log in as (infra/postgres/pg.py's DAGSTER_PG_USERNAME) owns its
    database and takes the locks, but cannot run programs on the server (`COPY ... TO PROGRAM`,
    a superuser's) nor create roles."""
    import psycopg2

    with psycopg2.connect(pg_lock_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                    "WHERE rolname = current_user")
        assert cur.fetchone() == (False, False, False)
        cur.execute("SELECT pg_try_advisory_lock(42), pg_advisory_unlock(42)")
        assert cur.fetchone() == (True, True)
        cur.execute("CREATE TABLE owned_here (x int)")  # its own database: it creates tables
    with psycopg2.connect(pg_lock_url) as conn, conn.cursor() as cur:
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute("COPY (SELECT 1) TO PROGRAM 'true'")
