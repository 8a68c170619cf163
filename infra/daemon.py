"""Helpers shared by the local servers' scripts (infra/s3, infra/postgres, infra/spark).

A server here is a background process started from the repo's own files, with a pid file and a
log file under a state folder of the repo, a readiness probe polled until it answers, and a stop
by the recorded pid (SIGTERM, then SIGKILL). Failures are `ServerError`s whose message says what
to do; the scripts print them as one `error:` line on stderr and exit 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lakehouse.tables.locks import pid_alive  # one liveness rule for the locks and the servers

REPO = Path(__file__).resolve().parents[1]


class ServerError(RuntimeError):
    pass


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def port_holder(port: int) -> str:
    """Who listens on `port` (this machine's TCP sockets, /proc/net/tcp and tcp6): "pid N
    (command)", or "another process" when it cannot be seen (another user's, no /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])  # state 0A: LISTEN
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    pid = fd_dir.parent.name
                    cmd = (fd_dir.parent / "cmdline").read_bytes().split(b"\0")[0].decode(
                        errors="replace")
                    return f"pid {pid} ({Path(cmd).name or '?'})"
        except OSError:
            continue
    return "another process"


def taken(port: int, variable: str, what: str = "port") -> ServerError:
    """The one-line error of a server whose port is held: the port, its holder and the
    variable that moves it."""
    return ServerError(f"{what} {port} is taken by {port_holder(port)}: stop it, or set "
                       f"{variable} to another port")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def java() -> str:
    """The `java` of JAVA_HOME, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise ServerError("java not found: install a JDK 17+ (or set JAVA_HOME), then retry")
    return found


def java_home() -> str:
    """JAVA_HOME, else the JDK folder of the `java` on PATH (for launchers that need it)."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return home
    return str(Path(os.path.realpath(java())).parents[1])


class Daemon:
    """One background process known by its pid file; its output goes to its log file."""

    def __init__(self, name: str, pid_file: Path, log_file: Path):
        self.name, self.pid_file, self.log_file = name, pid_file, log_file

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def start(self, cmd: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None, user: str | None = None) -> int:
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, cwd=cwd, user=user,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def wait_ready(self, ready: Callable[[], bool], wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise ServerError(f"{self.name} exited during start-up: see {self.log_file}\n"
                                  + tail(self.log_file))
            if ready():
                return
            time.sleep(0.3)
        raise ServerError(f"{self.name} not ready within {wait_s:.0f}s: see {self.log_file}")

    def stop(self, wait_s: float = 30.0, group: bool = False) -> int | None:
        """Stop it (SIGTERM, SIGKILL after `wait_s`); the pid it had, None if not running.
        `group`: its whole process group (it leads one: `start` gives it its own session), so
        the children it started (a Spark server's Python workers) go too, and wait for all."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return None
        kill = (lambda sig: _killpg(pid, sig)) if group else (lambda sig: os.kill(pid, sig))
        alive = (lambda: _group_alive(pid)) if group else (lambda: pid_alive(pid))
        kill(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive():
            time.sleep(0.2)
        if alive():
            kill(signal.SIGKILL)
            while alive():
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return pid


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies aside)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def run_cli(command: Callable[[], str], ok: Callable[[], bool] = lambda: True) -> int:
    """Print what `command` returns; a ServerError is one line on stderr and exit 1; exit 3 when
    `ok()` is false afterwards (a `status` of a server that is not running)."""
    try:
        print(command())
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if ok() else 3
