"""Start, stop and check a single-node Apache Kafka broker (KRaft, static quorum) on 127.0.0.1.

Runs the broker from the jars `make setup` fetched from Maven Central into `.jars/kafka`
(no Docker, no Kafka tarball). Usage:

    python infra/kafka/broker.py up|down|status [--state-dir DIR] [--port N]

`up` formats the storage once, starts the broker in the background, waits until it answers
a metadata request and is idempotent (a running broker is left alone). `down` stops it by the
pid it recorded. Every failure is one line on stderr saying what to do, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".jars" / "kafka"
HERE = Path(__file__).resolve().parent


class BrokerError(RuntimeError):
    pass


def _default_port() -> int:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092").split(",")[0]
    try:
        return int(bootstrap.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 9092


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) is not a running broker.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, 22 characters.

    Like Kafka's own ``Uuid.randomUuid``, ids starting with ``-`` are redrawn
    (one in 64 would): a command-line parser reads them as an option.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _answers(port: int, timeout: float = 3.0) -> bool:
    """True when the broker answers a metadata request (not merely an open port)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


class Broker:
    def __init__(self, state_dir: Path, port: int, controller_port: int | None = None):
        self.state_dir = state_dir.resolve()
        self.port = port
        self.controller_port = controller_port or port + 1
        self.data_dir = self.state_dir / "data"
        self.config = self.state_dir / "server.properties"
        self.pid_file = self.state_dir / "broker.pid"
        self.log_file = self.state_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = Path(java_home, "bin", "java") if java_home else None
        if java and java.exists():
            return str(java)
        from shutil import which

        found = which("java")
        if not found:
            raise BrokerError("java not found: install a JDK 17+ (or set JAVA_HOME), then retry")
        return found

    def _classpath(self) -> str:
        if not any(JARS.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"Kafka jars missing in {JARS}: run `make setup` first")
        return str(JARS / "*")

    def _render_config(self) -> None:
        text = (HERE / "server.properties.template").read_text().format(
            port=self.port, controller_port=self.controller_port, data_dir=self.data_dir
        )
        self.config.write_text(text)

    def _format_once(self, java: str, cp: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        done = subprocess.run(
            [java, "-cp", cp, f"-Dlog4j2.configurationFile={HERE / 'log4j2.yaml'}",
             "kafka.tools.StorageTool", "format", f"--cluster-id={new_cluster_id()}",
             "-c", str(self.config)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage failed: {done.stderr.strip() or done.stdout.strip()}"
            )

    def up(self, wait_s: float = 90.0) -> str:
        if self.pid() and _answers(self.port):
            return f"Kafka already running on {self.bootstrap} (pid {self.pid()})"
        if self.pid() is None and _port_open(self.port):
            raise BrokerError(
                f"port {self.port} is taken by another process: stop it, or set "
                f"KAFKA_BOOTSTRAP_SERVERS to another port (e.g. localhost:19092)"
            )
        if _port_open(self.controller_port) and self.pid() is None:
            raise BrokerError(
                f"controller port {self.controller_port} is taken: free it or pick another port"
            )
        java, cp = self._java(), self._classpath()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._render_config()
        self._format_once(java, cp)
        if self.pid() is None:
            heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xms256m -Xmx1g").split()
            with open(self.log_file, "ab") as log:
                proc = subprocess.Popen(
                    [java, *heap, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                     f"-Dlog4j2.configurationFile={HERE / 'log4j2.yaml'}",
                     "-cp", cp, "kafka.Kafka", str(self.config)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise BrokerError(
                    f"Kafka broker exited during start-up: see {self.log_file}\n"
                    + _tail(self.log_file)
                )
            if _answers(self.port, timeout=2.0):
                return f"Kafka up on {self.bootstrap} (pid {self.pid()}), log: {self.log_file}"
            time.sleep(0.5)
        raise BrokerError(f"Kafka did not answer within {wait_s:.0f}s: see {self.log_file}")

    def down(self, wait_s: float = 30.0) -> str:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return "Kafka not running"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.2)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return f"Kafka stopped (pid {pid})"

    def status(self) -> str:
        pid = self.pid()
        if pid and _answers(self.port):
            return f"Kafka running on {self.bootstrap} (pid {pid})"
        return "Kafka not running"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", default=os.environ.get("KAFKA_STATE_DIR", REPO / ".kafka"))
    parser.add_argument("--port", type=int, default=_default_port())
    args = parser.parse_args(argv)
    broker = Broker(Path(args.state_dir), args.port)
    try:
        print(getattr(broker, args.command)())
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if args.command != "status" or broker.pid() else 3


if __name__ == "__main__":
    sys.exit(main())
