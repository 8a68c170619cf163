"""What a command-line tool shows: one line per step, a live status line on a terminal, and
everything else (Dagster's event stream, Spark's log4j output, progress bars of libraries) in
a log file instead of on the console.

`quiet_process_output(path)` points the process's own stdout and stderr (file descriptors 1
and 2, so a JVM started later inherits them too) at `path` and hands back a stream on the real
console; `Console` writes lines to it, and on a terminal `Console.running` keeps one line
updated with `\\r` while a step runs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO


@contextmanager
def quiet_process_output(path: str) -> Iterator[IO[str]]:
    """Send fds 1 and 2 to `path` (emptied first) while the block runs; yield the console."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        console.close()


def is_terminal(stream: IO[str]) -> bool:
    try:
        return os.isatty(stream.fileno()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, OSError, ValueError):
        return False


class Console:
    """Lines for the user; on a terminal, one live line that the next line replaces."""

    def __init__(self, stream: IO[str], live: bool | None = None):
        self.stream = stream
        self.live = is_terminal(stream) if live is None else live
        self._lock = threading.Lock()
        self._showing = False

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        return columns if columns >= 20 else 100  # a pty without a size reports 0

    def line(self, text: str = "") -> None:
        with self._lock:
            if self._showing:
                self.stream.write("\r\x1b[K")
                self._showing = False
            self.stream.write(text + "\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """Replace the live line (terminals only; elsewhere nothing is shown)."""
        if not self.live:
            return
        with self._lock:
            self.stream.write("\r\x1b[K" + text[: self._width() - 1])
            self.stream.flush()
            self._showing = True

    @contextmanager
    def running(self, label: str, detail: Callable[[], str] = lambda: "",
                every: float = 0.5) -> Iterator[None]:
        """While the block runs, show `label`, `detail()` and the seconds elapsed on the live
        line (refreshed every `every` seconds); the caller prints the step's result line."""
        if not self.live:
            yield
            return
        start = time.monotonic()
        done = threading.Event()

        def tick() -> None:
            while True:
                extra = detail()
                self.status(f"{label}  {time.monotonic() - start:5.0f}s"
                            + (f"  running {extra}" if extra else ""))
                if done.wait(every):
                    return

        ticker = threading.Thread(target=tick, name="console-status", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
