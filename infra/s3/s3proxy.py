"""Start, stop and check S3Proxy, a local S3-compatible object store, on 127.0.0.1.

Runs `org.gaul:s3proxy` (jar-with-dependencies, fetched by `make setup` into .jars/s3proxy) with
its `filesystem-nio2` backend: objects are files under `.s3proxy/data`, a bucket is a folder there,
so `up` creates the bucket `$S3_BUCKET` (default `lakehouse`) by creating its folder. Requests
are signed (AWS v2 or v4) with AWS_ACCESS_KEY_ID (default `lakehouse`) / AWS_SECRET_ACCESS_KEY
(when unset, the secret generated at set-up in the owner-only `.secrets/local.env`:
infra/local_secrets.py; never printed). Usage:

    python infra/s3/s3proxy.py up|down|status [--state-dir DIR] [--port N] [--bucket NAME]

`up` waits until the endpoint answers HTTP and is idempotent; `down` stops it by its pid.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import local_secrets  # noqa: E402
from daemon import REPO, Daemon, ServerError, java, port_open, run_cli, taken  # noqa: E402

JARS = REPO / ".jars" / "s3proxy"
DEFAULT_KEY_ID = "lakehouse"
BACKEND = "filesystem-nio2"  # S3Proxy deprecates the jclouds "filesystem" one


def credentials() -> tuple[str, str]:
    return (os.environ.get("AWS_ACCESS_KEY_ID") or DEFAULT_KEY_ID,
            local_secrets.value("AWS_SECRET_ACCESS_KEY"))


def answers(port: int) -> bool:
    """True when an HTTP server answers on the port (an unsigned request gets 403: fine)."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


class S3Proxy:
    def __init__(self, state_dir: Path, port: int, bucket: str):
        self.state_dir = state_dir.resolve()
        self.port, self.bucket = port, bucket
        self.data_dir = self.state_dir / "data"
        self.config = self.state_dir / "s3proxy.conf"
        self.daemon = Daemon("S3Proxy", self.state_dir / "s3proxy.pid",
                             self.state_dir / "s3proxy.log")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _jar(self) -> Path:
        jars = sorted(JARS.glob("s3proxy-*-jar-with-dependencies.jar"))
        if not jars:
            raise ServerError(f"S3Proxy jar missing in {JARS}: run `make setup` first")
        return jars[-1]

    def _write_config(self) -> None:
        key_id, secret = credentials()
        lines = [
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={key_id}",
            f"s3proxy.credential={secret}",
            f"jclouds.provider={BACKEND}",
            "jclouds.identity=local",  # required by the backend, unused by a local folder
            "jclouds.credential=local",
            f"jclouds.filesystem.basedir={self.data_dir}",
        ]
        # The file holds the secret: readable by its owner only.
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")

    def up(self, wait_s: float = 60.0) -> str:
        pid = self.daemon.pid()
        if pid and answers(self.port):
            (self.data_dir / self.bucket).mkdir(parents=True, exist_ok=True)
            return f"S3Proxy already running on {self.endpoint} (pid {pid})"
        if pid is None and port_open(self.port):
            raise taken(self.port, "S3_PORT")
        java_bin, jar = java(), self._jar()
        # A bucket of the filesystem backend is a folder of its base directory.
        (self.data_dir / self.bucket).mkdir(parents=True, exist_ok=True)
        self._write_config()
        if pid is None:
            env = {**os.environ, "LOG_LEVEL": os.environ.get("S3PROXY_LOG_LEVEL", "warn")}
            self.daemon.start([java_bin, "-Xmx512m", "-Djava.awt.headless=true",
                               "-Dlogback.statusListenerClass=ch.qos.logback.core.status.NopStatusListener",
                               "-jar", str(jar),
                               "--properties", str(self.config)], env=env, cwd=self.state_dir)
        self.daemon.wait_ready(lambda: answers(self.port), wait_s)
        return (f"S3Proxy up on {self.endpoint}, bucket {self.bucket} "
                f"(pid {self.daemon.pid()}), log: {self.daemon.log_file}")

    def down(self) -> str:
        pid = self.daemon.stop()
        return f"S3Proxy stopped (pid {pid})" if pid else "S3Proxy not running"

    def status(self) -> str:
        pid = self.daemon.pid()
        if pid and answers(self.port):
            return f"S3Proxy running on {self.endpoint} (pid {pid})"
        return "S3Proxy not running"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("S3_STATE_DIR", REPO / ".s3proxy")))
    parser.add_argument("--port", type=int, default=int(os.environ.get("S3_PORT", "9000")))
    parser.add_argument("--bucket", default=os.environ.get("S3_BUCKET", "lakehouse"))
    args = parser.parse_args(argv)
    proxy = S3Proxy(args.state_dir, args.port, args.bucket)
    return run_cli(getattr(proxy, args.command),
                   ok=lambda: args.command != "status" or proxy.daemon.pid() is not None)


if __name__ == "__main__":
    sys.exit(main())
