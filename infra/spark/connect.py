"""Start, stop and check a Spark Connect server on 127.0.0.1: the warm engine that the daily runs
use when SPARK_REMOTE is set (`make spark-up` / `make spark-down`).

Runs pyspark's own `bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`
(SPARK_HOME = the installed `pyspark` folder; the server ships in its jars as
spark-connect_2.13-<version>.jar) with the project's Spark configuration
(`spark_jobs.session.spark_conf` of the settings in this environment: the Delta/Kafka/Avro jars of
.jars/spark, the Delta extension and catalog, the driver's memory and Java options, which only
take effect at the JVM's start), listening on 127.0.0.1:$SPARK_CONNECT_PORT (15002) only; its
Python workers run the project's venv. It admits only clients that present the token it was
started with (Spark Connect's pre-shared token, lakehouse.config.connect_token): a new one at each
start, handed to the JVM in its environment (SPARK_CONNECT_AUTHENTICATE_TOKEN, never on its
command line) and to the clients in `connect-<port>.token` (mode 0600) of its state folder, which
the project's clients read when SPARK_REMOTE names this server; removed when it stops. State under
`.spark-connect/` (SPARK_CONNECT_STATE_DIR): pid file, token file and `server.log`. Usage:

    python infra/spark/connect.py up|down|status [--state-dir DIR] [--port N]

`up` is idempotent and waits until a client session runs `select 1` (the health check, in a
process of its own with a timeout); `down` stops the server's whole process group (the JVM and
the Python workers it started) and waits until it is gone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import spark_home  # noqa: E402
from daemon import (  # noqa: E402
    REPO,
    Daemon,
    ServerError,
    java_home,
    port_open,
    run_cli,
    taken,
)

from lakehouse.config import connect_token, spark_secrets  # noqa: E402

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002

# The health check: a client session of its own process (a Connect session marks the process
# as a Connect client for good, so never in the caller's). Its URL names no token: pyspark's
# client takes it from SPARK_CONNECT_AUTHENTICATE_TOKEN in the check's environment.
_CHECK = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
assert spark.sql("select 1 as one").collect()[0].one == 1
"""


def server_conf(port: int) -> dict[str, str]:
    """The server's launch configuration: the project's (`spark_conf` of this environment's
    settings, as a long-lived JVM) plus Connect's own: loopback only, on `port`."""
    sys.path.insert(0, str(REPO))
    from lakehouse.config.settings import Settings
    from spark_jobs.session import spark_conf

    conf = spark_conf(Settings.from_env())
    if connect_token.TOKEN_CONF in conf:
        raise ServerError(f"SPARK_CONF_{connect_token.TOKEN_CONF} is set: the local Spark Connect "
                          "server makes its own token at each start; unset it (a server with a "
                          "token of yours is your own: SPARK_REMOTE=sc://...;token=...)")
    conf["spark.app.name"] = "eventtime-lakehouse-connect"
    conf["spark.connect.grpc.binding.address"] = "127.0.0.1"
    conf["spark.connect.grpc.binding.port"] = str(port)
    return conf


class ConnectServer:
    def __init__(self, state_dir: Path, port: int):
        self.state_dir, self.port = state_dir.resolve(), port
        self.daemon = Daemon("the Spark Connect server", self.state_dir / "server.pid",
                             self.state_dir / "server.log")

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def token_file(self) -> Path:
        return connect_token.token_file(self.state_dir, self.port)

    def _python(self) -> str:
        venv = REPO / ".venv" / "bin" / "python"
        return os.environ.get("PYSPARK_PYTHON", str(venv if venv.exists() else sys.executable))

    def healthy(self, timeout_s: float = 60.0) -> bool:
        """A client session presenting the server's token runs `select 1` within `timeout_s`."""
        token = connect_token.read_token(self.state_dir, self.port)
        if token is None or not port_open(self.port):
            return False
        env = {**{k: v for k, v in os.environ.items()
                  if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")},
               connect_token.TOKEN_ENV: token}
        try:
            done = subprocess.run([self._python(), "-c", _CHECK,
                                   f"sc://localhost:{self.port}"], env=env,
                                  capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def up(self, wait_s: float = 180.0) -> str:
        home = spark_home()
        if self.daemon.pid() is not None and self.healthy():
            return f"Spark Connect server already running on {self.url} (pid {self.daemon.pid()})"
        if self.daemon.pid() is not None and not self.token_file.exists():
            raise ServerError(f"the Spark Connect server running on {self.url} (pid "
                              f"{self.daemon.pid()}) was started without a token: stop it "
                              "(make spark-down), then start it again")
        if self.daemon.pid() is None:
            if port_open(self.port):
                raise taken(self.port, "SPARK_CONNECT_PORT")
            self.state_dir.mkdir(parents=True, exist_ok=True)
            conf = server_conf(self.port)
            plain, secret = spark_secrets.split(conf)
            cmd = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
                   "--name", conf["spark.app.name"]]
            for key, value in plain.items():
                cmd += ["--conf", f"{key}={value}"]
            if secret:  # owner-only, in the state folder: the server reads it at its start
                cmd += ["--properties-file", str(spark_secrets.write_properties(
                    secret, self.state_dir / "secret.properties"))]
            python = self._python()
            env = {**{k: v for k, v in os.environ.items()
                      if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")},
                   # The server's token: a new one at each start, in its environment only.
                   connect_token.TOKEN_ENV: connect_token.new_token(self.state_dir, self.port),
                   "SPARK_HOME": str(home), "JAVA_HOME": java_home(),
                   "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python,
                   "PYSPARK_DRIVER_PYTHON": python,
                   # The server's Python workers import the project (UDFs, foreachBatch).
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                               os.environ.get("PYTHONPATH")]))}
            self.daemon.start(cmd, env=env, cwd=self.state_dir)
        self.daemon.wait_ready(lambda: self.healthy(timeout_s=30), wait_s)
        return (f"Spark Connect server up on {self.url} (pid {self.daemon.pid()}), "
                f"token in {self.token_file}, log: {self.daemon.log_file}")

    def down(self) -> str:
        pid = self.daemon.stop(wait_s=30, group=True)
        self.token_file.unlink(missing_ok=True)
        return f"Spark Connect server stopped (pid {pid})" if pid else \
            "Spark Connect server not running"

    def status(self) -> str:
        pid = self.daemon.pid()
        if pid is None:
            return "Spark Connect server not running"
        state = "healthy" if self.healthy() else "not answering"
        return f"Spark Connect server on {self.url} (pid {pid}): {state}"


def default_port(env) -> int:
    """SPARK_CONNECT_PORT, else the port of a SPARK_REMOTE that names this machine
    (`sc://127.0.0.1:15010/;...`: the server the runs will ask for), else 15002."""
    if env.get("SPARK_CONNECT_PORT"):
        return int(env["SPARK_CONNECT_PORT"])
    remote = env.get("SPARK_REMOTE", "")
    for host in ("sc://127.0.0.1:", "sc://localhost:"):
        if remote.startswith(host):
            port = remote[len(host):].split("/", 1)[0]
            if port.isdigit():
                return int(port)
    return DEFAULT_PORT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, default=Path(
        os.environ.get("SPARK_CONNECT_STATE_DIR", REPO / ".spark-connect")))
    parser.add_argument("--port", type=int, default=default_port(os.environ))
    args = parser.parse_args(argv)
    server = ConnectServer(args.state_dir, args.port)
    return run_cli(getattr(server, args.command),
                   ok=lambda: args.command != "status" or server.healthy())


if __name__ == "__main__":
    sys.exit(main())
