"""A single-node KRaft broker whose client listener requires SASL/SCRAM-SHA-512 (loopback only).

Reuses `broker.Broker` (jars, java, pid file, `down()`) from the sibling module without changing
it; what differs:
- the listener: `SASL_PLAINTEXT://127.0.0.1:<port>` (also the inter-broker listener, as user
  `broker`), SCRAM-SHA-512 the only enabled mechanism; the controller listener stays PLAINTEXT;
- the credentials: added to the metadata log when the storage is formatted (`kafka-storage
  format --add-scram`), as salted passwords computed here; a salted password lets its holder
  log in as the user, so the format's arguments reach the JVM in an owner-only argument file
  (`java @file`), never on its command line;
- its log: the network layer logs each failed authentication (`Failed authentication with
  ...`, at INFO), which `failed_authentications()` counts.

    from sasl_broker import SaslBroker
    b = SaslBroker(dir, port, controller_port, users={"alice": "alice-secret"}); b.up()
    b.client_env("alice", "alice-secret")  # KAFKA_* variables for lakehouse.config.settings
    b.down()
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MECHANISM = "SCRAM-SHA-512"
ITERATIONS = 8192
AUTH_FAILURE_LINE = "Failed authentication with"


def _load_broker():
    """The sibling `broker.py` (not a package), loaded by path like tests/conftest.py does."""
    module = sys.modules.get("broker")
    if module is not None and hasattr(module, "Broker"):
        return module
    spec = importlib.util.spec_from_file_location("broker", HERE / "broker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_broker = _load_broker()
Broker = _broker.Broker
BrokerError = _broker.BrokerError

LOG_CONFIG = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka
        level: WARN
      - name: org.apache.kafka
        level: WARN
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: state.change.logger
        level: ERROR
      # One INFO line per failed SASL handshake: what the auth drill counts.
      - name: org.apache.kafka.common.network.Selector
        level: INFO
"""


def scram_credential(name: str, password: str, iterations: int = ITERATIONS) -> str:
    """`--add-scram` argument with a salted password (RFC 5802 Hi(): PBKDF2-HMAC-SHA-512)."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return (f'{MECHANISM}=[name={name},iterations={iterations},'
            f'salt="{base64.b64encode(salt).decode()}",'
            f'saltedpassword="{base64.b64encode(salted).decode()}"]')


def jaas(name: str, password: str) -> str:
    return ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{name}" password="{password}";')


class SaslBroker(Broker):
    """`Broker` with a SASL_PLAINTEXT (SCRAM-SHA-512) client listener and the given users."""

    def __init__(self, state_dir: Path, port: int, controller_port: int | None = None,
                 users: dict[str, str] | None = None):
        super().__init__(Path(state_dir), port, controller_port)
        self.users = dict(users or {})
        self._broker_password = secrets.token_urlsafe(18)
        self.log_config = self.state_dir / "log4j2.yaml"

    # ---- configuration -----------------------------------------------------------------------
    def _render_config(self) -> None:
        super()._render_config()  # the shared template: data dir, retention, KRaft quorum
        overrides = {
            "listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config":
                jaas("broker", self._broker_password),
        }
        lines, done = [], set()
        for line in self.config.read_text().splitlines():
            key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else None
            if key in overrides:
                lines.append(f"{key}={overrides[key]}")
                done.add(key)
            else:
                lines.append(line)
        lines += [f"{k}={v}" for k, v in overrides.items() if k not in done]
        self.config.write_text("\n".join(lines) + "\n")
        os.chmod(self.config, 0o600)
        self.log_config.write_text(LOG_CONFIG)

    def _format_once(self, java: str, cp: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        scram = [("--add-scram", scram_credential(name, password)) for name, password in
                 {"broker": self._broker_password, **self.users}.items()]
        args = ["kafka.tools.StorageTool", "format", f"--cluster-id={_broker.new_cluster_id()}",
                "-c", str(self.config), *[a for pair in scram for a in pair]]
        # The launcher reads the main class and its arguments from the file: single-quoted
        # (the credentials hold double quotes; base64 and the paths hold no single quote).
        argfile = self.state_dir / "format.args"
        fd = os.open(argfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(f"'{a}'" for a in args) + "\n")
        try:
            done = subprocess.run([java, "-cp", cp, f"-Dlog4j2.configurationFile={self.log_config}",
                                   f"@{argfile}"], capture_output=True, text=True)
        finally:
            argfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage failed: {done.stderr.strip() or done.stdout.strip()}")

    # ---- lifecycle ---------------------------------------------------------------------------
    def client_config(self, name: str, password: str) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings for user `name`."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": MECHANISM, "sasl.username": name, "sasl.password": password}

    def client_env(self, name: str, password: str) -> dict[str, str]:
        """The pipeline's environment variables (lakehouse.config.settings pass-through) for `name`:
        librdkafka's username/password and Spark's (Java client's) JAAS line."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": MECHANISM,
            "KAFKA_SASL_USERNAME": name,
            "KAFKA_SASL_PASSWORD": password,
            "KAFKA_SASL_JAAS_CONFIG": jaas(name, password),
        }

    def answers(self, timeout: float = 2.0) -> bool:
        """True when the broker answers a metadata request of an authenticated client."""
        from confluent_kafka.admin import AdminClient

        if not self.users:
            return _broker.port_open(self.port)
        name, password = next(iter(self.users.items()))
        client = AdminClient({**self.client_config(name, password), "log_level": 0})
        try:
            client.list_topics(timeout=timeout)
            return True
        except Exception:
            return False

    def up(self, wait_s: float = 90.0) -> str:
        if self.pid() and self.answers():
            return f"SASL Kafka already running on {self.bootstrap} (pid {self.pid()})"
        if self.pid() is None and (_broker.port_open(self.port)
                                   or _broker.port_open(self.controller_port)):
            raise BrokerError(f"port {self.port} or {self.controller_port} is taken")
        java, cp = self._java(), self._classpath()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._render_config()
        self._format_once(java, cp)
        if self.pid() is None:
            heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xms128m -Xmx512m")
            pid = _broker.launch(java, cp, self.config, self.log_file, self.log_config, heap)
            self.pid_file.write_text(str(pid))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise BrokerError(f"SASL Kafka broker exited during start-up: see {self.log_file}")
            if self.answers():
                return f"SASL Kafka up on {self.bootstrap} (pid {self.pid()})"
            time.sleep(0.5)
        raise BrokerError(f"SASL Kafka did not answer within {wait_s:.0f}s: see {self.log_file}")

    def failed_authentications(self) -> int:
        """Failed SASL handshakes the broker logged so far."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for line in text.splitlines() if AUTH_FAILURE_LINE in line)
