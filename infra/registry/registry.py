"""Start, stop and check a Kafka schema registry on 127.0.0.1: Apicurio Registry, in-memory
storage, no authentication, its Confluent-compatible API under /apis/ccompat/v7.

Runs the Quarkus distribution `io.apicurio:apicurio-registry-app:<version>:tar.gz:all`, fetched
and unpacked by `make setup` into .jars/registry/app (infra/jars/registry/pom.xml). Its schemas
live in the server's memory: a restart forgets them. Usage:

    python infra/registry/registry.py up|down|status [--state-dir DIR] [--port N]

`up` waits until /health/ready answers 200 and is idempotent; `down` stops it by its pid.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon import REPO, Daemon, ServerError, java, port_open, run_cli, taken  # noqa: E402

APP = REPO / ".jars" / "registry" / "app"
CONFLUENT_API = "/apis/ccompat/v7"


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.HTTPError, OSError):
        return False


class Registry:
    def __init__(self, state_dir: Path, port: int):
        self.state_dir, self.port = state_dir.resolve(), port
        self.daemon = Daemon("the schema registry", self.state_dir / "registry.pid",
                             self.state_dir / "registry.log")

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (a spec's `avro.registry.url`)."""
        return f"http://127.0.0.1:{self.port}{CONFLUENT_API}"

    def _jar(self) -> Path:
        jars = sorted(APP.glob("apicurio-registry-app-*-runner.jar"))
        if not jars:
            raise ServerError(f"Apicurio Registry missing in {APP}: run `make setup` first")
        return jars[-1]

    def up(self, wait_s: float = 120.0) -> str:
        pid = self.daemon.pid()
        if pid and ready(self.port):
            return f"schema registry already running on {self.url} (pid {pid})"
        if pid is None and port_open(self.port):
            raise taken(self.port, "REGISTRY_PORT")
        java_bin, jar = java(), self._jar()
        if pid is None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.daemon.start([java_bin, "-Xmx512m", "-XX:TieredStopAtLevel=1",
                               "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                               "-Dquarkus.log.level=WARN", "-jar", str(jar)],
                              env=dict(os.environ), cwd=self.state_dir)
        self.daemon.wait_ready(lambda: ready(self.port), wait_s)
        return (f"schema registry up on {self.url} (pid {self.daemon.pid()}), "
                f"log: {self.daemon.log_file}")

    def down(self) -> str:
        pid = self.daemon.stop()
        return f"schema registry stopped (pid {pid})" if pid else "schema registry not running"

    def status(self) -> str:
        pid = self.daemon.pid()
        if pid and ready(self.port):
            return f"schema registry running on {self.url} (pid {pid})"
        return "schema registry not running"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("REGISTRY_STATE_DIR", REPO / ".registry")))
    parser.add_argument("--port", type=int, default=int(os.environ.get("REGISTRY_PORT", "8081")))
    args = parser.parse_args(argv)
    registry = Registry(args.state_dir, args.port)
    return run_cli(getattr(registry, args.command),
                   ok=lambda: args.command != "status" or registry.daemon.pid() is not None)


if __name__ == "__main__":
    sys.exit(main())
