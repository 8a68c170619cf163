"""One runner per checkpoint: an exclusive, non-blocking OS file lock under $LAKEHOUSE_ROOT.

The lock is held by the process (released by the kernel when it dies, so a SIGKILL leaves no
stale lock). It guards local roots; with a remote root, run one stream runner per root (the
Dagster concurrency pool does this for scheduled catch-ups).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
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
