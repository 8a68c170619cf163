"""Start, stop and check a Spark standalone cluster (a master and N workers) on 127.0.0.1.

Runs the daemons with the pip pyspark's own launcher (`pyspark/bin/spark-class`, SPARK_HOME =
the installed `pyspark` folder): no Spark tarball. State under `.spark/` of the repo: pid and log
file per daemon, `work-N` as worker N's work dir. Master spark://127.0.0.1:$SPARK_MASTER_PORT
(7077), its web UI on $SPARK_MASTER_WEBUI_PORT (8080); worker N has $SPARK_WORKER_CORES (1) cores,
$SPARK_WORKER_MEMORY (2g) and its web UI on 8080+N. $SPARK_WORKERS workers (2). Usage:

    python infra/spark/cluster.py up|down|status
    python infra/spark/cluster.py kill-worker N|start-worker N    (fault drills)

`up` is idempotent and waits until every worker is registered ALIVE with the master (polling the
master's /json/). `kill-worker` SIGKILLs worker N (a crash: its executors die with it);
`start-worker` starts it again and waits until it is registered.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon import REPO, Daemon, ServerError, java_home, port_open, run_cli, taken  # noqa: E402


def spark_home() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise ServerError("pyspark not installed in this Python: run `make setup` and use "
                          ".venv/bin/python")
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-class").exists():
        raise ServerError(f"{home}/bin/spark-class missing: reinstall pyspark (make setup)")
    return home


class Cluster:
    def __init__(self, state_dir: Path, port: int, webui_port: int, workers: int,
                 cores: int, memory: str):
        self.state_dir = state_dir.resolve()
        self.port, self.webui_port, self.workers = port, webui_port, workers
        self.cores, self.memory = cores, memory
        self.master = Daemon("Spark master", self.state_dir / "master.pid",
                             self.state_dir / "master.log")

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker(self, n: int) -> Daemon:
        if not 1 <= n <= self.workers:
            raise ServerError(f"worker {n} does not exist: workers are 1..{self.workers}")
        return Daemon(f"Spark worker {n}", self.state_dir / f"worker-{n}.pid",
                      self.state_dir / f"worker-{n}.log")

    def _env(self) -> dict[str, str]:
        venv_python = REPO / ".venv" / "bin" / "python"
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "JAVA_HOME": java_home(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": os.environ.get(
                "PYSPARK_PYTHON", str(venv_python if venv_python.exists() else sys.executable)),
            # Applications' files in the work dirs (each copies spark.jars) go 15 min after they end.
            "SPARK_WORKER_OPTS": os.environ.get(
                "SPARK_WORKER_OPTS", "-Dspark.worker.cleanup.enabled=true "
                "-Dspark.worker.cleanup.interval=300 -Dspark.worker.cleanup.appDataTtl=900"),
        }

    def _spark_class(self) -> str:
        return str(spark_home() / "bin" / "spark-class")

    def state(self) -> dict | None:
        """The master's /json/ status, None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/",
                                        timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def _registered(self, n: int) -> bool:
        state = self.state() or {}
        return any(w.get("state") == "ALIVE"
                   and w.get("webuiaddress", "").endswith(f":{self.webui_port + n}")
                   for w in state.get("workers", []))

    def _start_master(self, wait_s: float) -> None:
        if self.master.pid() is None:
            for port, variable in ((self.port, "SPARK_MASTER_PORT"),
                                   (self.webui_port, "SPARK_MASTER_WEBUI_PORT")):
                if port_open(port):
                    raise taken(port, variable)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.master.start([self._spark_class(), "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(self.port),
                               "--webui-port", str(self.webui_port)],
                              env=self._env(), cwd=self.state_dir)
        self.master.wait_ready(lambda: self.state() is not None, wait_s)

    def _spawn_worker(self, n: int) -> Daemon:
        worker = self.worker(n)
        if self.master.pid() is None or self.state() is None:
            raise ServerError("the Spark master is not running: run `make spark-cluster-up`")
        if worker.pid() is None:
            webui = self.webui_port + n
            if port_open(webui):
                raise taken(webui, "SPARK_MASTER_WEBUI_PORT (the workers' are the next ones)",
                            f"worker {n}'s web UI port")
            work_dir = self.state_dir / f"work-{n}"
            work_dir.mkdir(parents=True, exist_ok=True)
            worker.start([self._spark_class(), "org.apache.spark.deploy.worker.Worker",
                          self.url, "--host", "127.0.0.1", "--cores", str(self.cores),
                          "--memory", self.memory, "--work-dir", str(work_dir),
                          "--webui-port", str(webui)],
                         env=self._env(), cwd=self.state_dir)
        return worker

    def start_worker(self, n: int, wait_s: float = 90.0) -> str:
        worker = self._spawn_worker(n)
        worker.wait_ready(lambda: self._registered(n), wait_s)
        return f"Spark worker {n} registered with {self.url} (pid {worker.pid()})"

    def kill_worker(self, n: int) -> str:
        worker = self.worker(n)
        pid = worker.pid()
        if pid is None:
            return f"Spark worker {n} not running"
        os.kill(pid, signal.SIGKILL)
        worker.stop(wait_s=10)  # reaps the pid file once it is gone
        return f"Spark worker {n} killed (pid {pid})"

    def up(self, wait_s: float = 90.0) -> str:
        spark_home()
        numbers = range(1, self.workers + 1)
        if self.master.pid() and self.state() and all(self._registered(n) for n in numbers):
            return f"Spark cluster already running: {self.url}, {self.workers} workers"
        self._start_master(wait_s)
        workers = {n: self._spawn_worker(n) for n in numbers}  # all start at once
        for n, worker in workers.items():
            worker.wait_ready(lambda n=n: self._registered(n), wait_s)
        return (f"Spark cluster up: {self.url}, {self.workers} workers x {self.cores} core(s), "
                f"UI http://127.0.0.1:{self.webui_port}, logs in {self.state_dir}")

    def down(self) -> str:
        stopped = [n for n in range(1, self.workers + 1) if self.worker(n).stop()]
        master = self.master.stop()
        if not stopped and not master:
            return "Spark cluster not running"
        return f"Spark cluster stopped (master: {'yes' if master else 'no'}, workers: {stopped})"

    def status(self) -> str:
        state = self.state() if self.master.pid() else None
        if state is None:
            return "Spark cluster not running"
        alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
        return (f"Spark master running on {self.url} ({state.get('status')}), "
                f"{len(alive)} worker(s) alive, {state.get('cores', 0)} cores, "
                f"{len(state.get('activeapps', []))} active app(s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command",
                        choices=["up", "down", "status", "kill-worker", "start-worker"])
    parser.add_argument("n", nargs="?", type=int, help="worker number (1-based)")
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("SPARK_STATE_DIR", REPO / ".spark")))
    args = parser.parse_args(argv)
    env = os.environ
    cluster = Cluster(args.state_dir, int(env.get("SPARK_MASTER_PORT", 7077)),
                      int(env.get("SPARK_MASTER_WEBUI_PORT", 8080)),
                      int(env.get("SPARK_WORKERS", 2)), int(env.get("SPARK_WORKER_CORES", 1)),
                      env.get("SPARK_WORKER_MEMORY", "2g"))
    if args.command in ("kill-worker", "start-worker"):
        if args.n is None:
            parser.error(f"{args.command} needs a worker number")
        command = {"kill-worker": cluster.kill_worker,
                   "start-worker": cluster.start_worker}[args.command]
        return run_cli(lambda: command(args.n))
    return run_cli(getattr(cluster, args.command),
                   ok=lambda: args.command != "status" or cluster.state() is not None)


if __name__ == "__main__":
    sys.exit(main())
