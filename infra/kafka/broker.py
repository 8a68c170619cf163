"""Start, stop and check a single-node Apache Kafka broker (KRaft, static quorum) on 127.0.0.1,
or a three-node cluster.

Runs the broker from the jars `make setup` fetched from Maven Central into `.jars/kafka`
(no Docker, no Kafka tarball). Usage:

    python infra/kafka/broker.py up|down|status [--state-dir DIR] [--port N] [--controller-port N]
    python infra/kafka/broker.py cluster-up|cluster-down|cluster-status [--base-port N]
    python infra/kafka/broker.py stop-node N|start-node N      (broker-restart drills)

The broker listens on KAFKA_BOOTSTRAP_SERVERS' port (9092), its KRaft controller on
KAFKA_CONTROLLER_PORT (default: that port + 100, 9192; not 9093, which Debian's Alertmanager
package takes where its service runs). `up` formats the storage once, starts the broker in the
background, waits until it answers a metadata request and is idempotent (a running broker is
left alone). `down` stops it by the pid it recorded. Every failure is one line on stderr saying
what to do, and a non-zero exit.

The cluster: three combined broker+controller nodes with one cluster id, state under
`.kafka-cluster/` (KAFKA_CLUSTER_STATE_DIR), node N on 127.0.0.1:(base+N-1) (base 19092, so
19092-19094) with its controller on port +100 (19192-19194); replication factor 3 and
min.insync.replicas 2 for every topic, internal ones included. `cluster-up` waits until all
three brokers are in the cluster metadata; `stop-node N` stops node N (SIGTERM: controlled
shutdown), `start-node N` starts it again and waits until it is back in the metadata.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon import pid_alive, port_holder, port_open  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".jars" / "kafka"
HERE = Path(__file__).resolve().parent


def launch(java: str, cp: str, config: Path, log_file: Path, log_config: Path, heap: str) -> int:
    """Start `kafka.Kafka` detached (its own session, output appended to `log_file`): returns
    its pid. Shared by the plain brokers and the SASL one."""
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            [java, *heap.split(), "-XX:+UseG1GC", "-Djava.awt.headless=true",
             f"-Dlog4j2.configurationFile={log_config}", "-cp", cp, "kafka.Kafka", str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


class BrokerError(RuntimeError):
    pass


def _default_port() -> int:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092").split(",")[0]
    try:
        return int(bootstrap.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 9092


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
    template = "server.properties.template"
    default_heap = "-Xms256m -Xmx1g"
    cluster_id: str | None = None  # None: a new one when the storage is formatted

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
        return pid if pid_alive(pid) else None

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

    def _config_values(self) -> dict:
        return {"port": self.port, "controller_port": self.controller_port,
                "data_dir": self.data_dir}

    def _render_config(self) -> None:
        text = (HERE / self.template).read_text().format(**self._config_values())
        self.config.write_text(text)

    def _format_once(self, java: str, cp: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        done = subprocess.run(
            [java, "-cp", cp, f"-Dlog4j2.configurationFile={HERE / 'log4j2.yaml'}",
             "kafka.tools.StorageTool", "format",
             f"--cluster-id={self.cluster_id or new_cluster_id()}",
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
        self._spawn()
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

    def _spawn(self) -> None:
        """Check the ports, render the config, format once and start the process unless it
        runs; no waiting."""
        if self.pid() is None and port_open(self.port):
            raise BrokerError(
                f"port {self.port} is taken by {port_holder(self.port)}: stop it, or set "
                f"KAFKA_BOOTSTRAP_SERVERS to another port (e.g. localhost:19092)"
            )
        if port_open(self.controller_port) and self.pid() is None:
            raise BrokerError(
                f"controller port {self.controller_port} is taken by "
                f"{port_holder(self.controller_port)}: stop it, or set KAFKA_CONTROLLER_PORT to "
                "another port"
            )
        java, cp = self._java(), self._classpath()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._render_config()
        self._format_once(java, cp)
        if self.pid() is None:
            heap = os.environ.get("KAFKA_HEAP_OPTS", self.default_heap)
            pid = launch(java, cp, self.config, self.log_file, HERE / "log4j2.yaml", heap)
            self.pid_file.write_text(str(pid))

    def down(self, wait_s: float = 30.0) -> str:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return "Kafka not running"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return f"Kafka stopped (pid {pid})"

    def status(self) -> str:
        pid = self.pid()
        if pid and _answers(self.port):
            return f"Kafka running on {self.bootstrap} (pid {pid})"
        return "Kafka not running"


class ClusterNode(Broker):
    """Node `node_id` of the three-node cluster: broker and controller in one process."""

    template = "cluster.properties.template"
    default_heap = "-Xms128m -Xmx512m"

    def __init__(self, state_dir: Path, node_id: int, port: int, controller_port: int,
                 voters: str, cluster_id: str):
        super().__init__(state_dir, port, controller_port)
        self.node_id, self.voters, self.cluster_id = node_id, voters, cluster_id

    def _config_values(self) -> dict:
        return {**super()._config_values(), "node_id": self.node_id, "voters": self.voters}


class KafkaCluster:
    def __init__(self, state_dir: Path, base_port: int = 19092, nodes: int = 3):
        self.state_dir = state_dir.resolve()
        self.ports = [base_port + i for i in range(nodes)]
        self.controller_ports = [port + 100 for port in self.ports]
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{port}"
                               for i, port in enumerate(self.controller_ports))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _cluster_id(self) -> str:
        """One id for every node's storage, drawn once and kept with the state."""
        path = self.state_dir / "cluster.id"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(new_cluster_id())
        return path.read_text().strip()

    def node(self, n: int) -> ClusterNode:
        if not 1 <= n <= len(self.ports):
            raise BrokerError(f"node {n} does not exist: nodes are 1..{len(self.ports)}")
        return ClusterNode(self.state_dir / f"node-{n}", n, self.ports[n - 1],
                           self.controller_ports[n - 1], self.voters, self._cluster_id())

    def brokers(self, timeout: float = 3.0) -> set[int]:
        """Ids of the brokers in the cluster metadata (empty when no node answers)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            return set(admin.list_topics(timeout=timeout).brokers)
        except Exception:
            return set()

    def _wait(self, nodes: list[ClusterNode], wait_s: float) -> None:
        want = {node.node_id for node in nodes}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for node in nodes:
                if node.pid() is None:
                    raise BrokerError(f"Kafka node {node.node_id} exited during start-up: see "
                                      f"{node.log_file}\n" + _tail(node.log_file))
            if want <= self.brokers(timeout=2.0):
                return
            time.sleep(0.5)
        raise BrokerError(f"Kafka nodes {sorted(want)} not all in the cluster metadata within "
                          f"{wait_s:.0f}s: see {self.state_dir}/node-*/broker.log")

    def up(self, wait_s: float = 120.0) -> str:
        nodes = [self.node(n) for n in range(1, len(self.ports) + 1)]
        if all(node.pid() for node in nodes) and len(self.brokers()) == len(nodes):
            return f"Kafka cluster already running on {self.bootstrap}"
        # All at once: a node's broker starts serving only once a quorum of controllers is up.
        for node in nodes:
            node._spawn()
        self._wait(nodes, wait_s)
        return (f"Kafka cluster up on {self.bootstrap} ({len(nodes)} brokers, RF 3, "
                f"min ISR 2), logs: {self.state_dir}/node-*/broker.log")

    def down(self, wait_s: float = 30.0) -> str:
        nodes = [self.node(n) for n in range(1, len(self.ports) + 1)]
        running = [node for node in nodes if node.pid()]
        # Stop every node at once: one stopped last and alone would wait for a lost quorum.
        for node in running:
            os.kill(node.pid(), signal.SIGTERM)
        for node in running:
            node.down(wait_s)
        for node in nodes:
            node.pid_file.unlink(missing_ok=True)
        if not running:
            return "Kafka cluster not running"
        return f"Kafka cluster stopped (nodes {[node.node_id for node in running]})"

    def stop_node(self, n: int) -> str:
        return self.node(n).down().replace("Kafka", f"Kafka node {n}", 1)

    def start_node(self, n: int, wait_s: float = 120.0) -> str:
        node = self.node(n)
        node._spawn()
        self._wait([node], wait_s)
        return f"Kafka node {n} up on {node.bootstrap} (pid {node.pid()}), in the metadata"

    def status(self) -> str:
        nodes = [self.node(n) for n in range(1, len(self.ports) + 1)]
        running = [node.node_id for node in nodes if node.pid()]
        if not running:
            return "Kafka cluster not running"
        return (f"Kafka cluster on {self.bootstrap}: nodes running {running}, brokers in "
                f"metadata {sorted(self.brokers())}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


CLUSTER_COMMANDS = ["cluster-up", "cluster-down", "cluster-status", "stop-node", "start-node"]


def cluster_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cluster = KafkaCluster(Path(args.cluster_state_dir), args.base_port)
    if args.command in ("stop-node", "start-node") and args.n is None:
        parser.error(f"{args.command} needs a node number")
    commands = {"cluster-up": cluster.up, "cluster-down": cluster.down,
                "cluster-status": cluster.status,
                "stop-node": lambda: cluster.stop_node(args.n),
                "start-node": lambda: cluster.start_node(args.n)}
    try:
        print(commands[args.command]())
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "cluster-status" and len(cluster.brokers()) != len(cluster.ports):
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", *CLUSTER_COMMANDS])
    parser.add_argument("n", nargs="?", type=int, help="node number (stop-node, start-node)")
    parser.add_argument("--state-dir", default=os.environ.get("KAFKA_STATE_DIR", REPO / ".kafka"))
    parser.add_argument("--port", type=int, default=_default_port())
    parser.add_argument("--controller-port", type=int,
                        default=int(os.environ["KAFKA_CONTROLLER_PORT"])
                        if os.environ.get("KAFKA_CONTROLLER_PORT") else None,
                        help="the KRaft controller's port (default: --port + 100)")
    parser.add_argument("--cluster-state-dir",
                        default=os.environ.get("KAFKA_CLUSTER_STATE_DIR", REPO / ".kafka-cluster"))
    parser.add_argument("--base-port", type=int,
                        default=int(os.environ.get("KAFKA_CLUSTER_BASE_PORT", 19092)))
    args = parser.parse_args(argv)
    if args.command in CLUSTER_COMMANDS:
        return cluster_main(args, parser)
    broker = Broker(Path(args.state_dir), args.port, args.controller_port or args.port + 100)
    try:
        print(getattr(broker, args.command)())
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if args.command != "status" or broker.pid() else 3


if __name__ == "__main__":
    sys.exit(main())
