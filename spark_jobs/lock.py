"""Exclusive OS file locks under $LAKEHOUSE_ROOT/_locks: one runner per stream checkpoint
(non-blocking: a second runner fails at once) and one writer per event date of the daily tables
(blocking: a second corrections run of the date waits for the first).

A lock is held by the process (released by the kernel when it dies, so a SIGKILL leaves no
stale lock). On an object store (no OS locks) the stream's runner holds a *lease* instead: a
small file under `_locks/` naming its owner and an expiry, written through Hadoop's FileSystem,
renewed by a heartbeat and read back after writing (last writer wins, so two runners starting
together cannot both believe they hold it); a runner that dies leaves a lease that expires
after LEASE_SECONDS. Daily runs on an object store are serialized by Dagster's pools (limit 1).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import date
from pathlib import Path

from lakehouse.storage import local_path


class CheckpointBusy(RuntimeError):
    pass


LEASE_SECONDS = 60.0


@contextmanager
def checkpoint_lock(root, name: str = "stream", spark=None):
    """One runner per stream checkpoint: an OS lock on a local root, a lease on an object store
    (needs `spark` for Hadoop's FileSystem)."""
    if "://" in str(root) and not str(root).startswith("file://"):
        if spark is None:
            raise ValueError("a lease on an object store needs the Spark session")
        with _lease(spark, f"{str(root).rstrip('/')}/_locks/{name}.lease", root):
            yield
        return
    path = local_path(str(root)) / "_locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "another process"
            raise CheckpointBusy(
                f"the stream checkpoint under {root} is in use by {holder}: stop that runner "
                "(make stream / a running catch-up) or wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        yield
    finally:
        os.close(fd)


class DateBusy(TimeoutError):
    pass


@contextmanager
def date_lock(settings, d: date, timeout_s: float = 1800.0, poll_s: float = 0.5):
    """Serialize writers of one event date's daily tables (corrections, replay) on this root."""
    root = local_path(str(settings.root))
    if root is None:  # object store: Dagster's pool `lakehouse_daily` serializes daily runs
        yield
        return
    path = root / "_locks" / f"date-{d.isoformat()}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DateBusy(f"event date {d} is being written by another run for more "
                                   f"than {timeout_s:.0f}s ({path})") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)


class _Hadoop:
    """Tiny text-file access through Hadoop's FileSystem (any scheme Spark can reach)."""

    def __init__(self, spark, path: str):
        jvm = spark.sparkContext._jvm
        self.jvm = jvm
        self.path = jvm.org.apache.hadoop.fs.Path(path)
        self.fs = self.path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def read(self) -> str | None:
        if not self.fs.exists(self.path):
            return None
        stream = self.fs.open(self.path)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write(self, text: str) -> None:
        out = self.fs.create(self.path, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def delete(self) -> None:
        self.fs.delete(self.path, False)


@contextmanager
def _lease(spark, path: str, root, settle_s: float = 2.0):
    store = _Hadoop(spark, path)
    me = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"

    def holder() -> dict | None:
        text = store.read()
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None

    def busy(current: dict) -> CheckpointBusy:
        return CheckpointBusy(
            f"the stream checkpoint under {root} is in use by {current['owner']} (lease until "
            f"{time.strftime('%H:%M:%S', time.gmtime(current['expires']))} UTC): stop that "
            "runner (make stream / a running catch-up) or wait for it to finish")

    current = holder()
    if current and current["owner"] != me and current["expires"] > time.time():
        raise busy(current)
    store.write(json.dumps({"owner": me, "expires": time.time() + LEASE_SECONDS}))
    time.sleep(settle_s)  # a runner that wrote at the same moment: the last writer wins
    current = holder()
    if not current or current["owner"] != me:
        raise busy(current or {"owner": "another runner", "expires": time.time()})
    stop = threading.Event()

    def renew():
        while not stop.wait(LEASE_SECONDS / 3):
            store.write(json.dumps({"owner": me, "expires": time.time() + LEASE_SECONDS}))

    beat = threading.Thread(target=renew, name=f"lease-{path}", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(5)
        if (holder() or {}).get("owner") == me:
            store.delete()
