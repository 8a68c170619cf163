"""Exclusive OS file locks under $LAKEHOUSE_ROOT/_locks: one runner per stream checkpoint
(non-blocking: a second runner fails at once) and one writer per event date of the daily tables
(blocking: a second corrections run of the date waits for the first).

A lock is held by the process (released by the kernel when it dies, so a SIGKILL leaves no
stale lock). They guard local roots; with a remote root, run one stream runner per root and
let Dagster's pools (limit 1) serialize catch-ups and daily runs.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path


class CheckpointBusy(RuntimeError):
    pass


@contextmanager
def checkpoint_lock(root: Path, name: str = "stream"):
    if "://" in str(root):
        yield
        return
    path = Path(root) / "_locks" / f"{name}.lock"
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
    root = settings.root
    if "://" in str(root):
        yield
        return
    path = Path(root) / "_locks" / f"date-{d.isoformat()}.lock"
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
