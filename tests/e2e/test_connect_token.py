"""The Spark Connect server the project starts (infra/spark/connect.py, `make spark-up`: the test
session's `spark_connect`) admits only clients that present the token it was started with: a
client without it, or with another, is refused; the project's client, given SPARK_REMOTE as a
user gives it (`sc://127.0.0.1:<port>`, no token), reads the token from the server's state
folder and runs; a user's own URL carrying the token works as given. The token is on no
process's command line (it reaches the JVM in its environment) nor in the server's log, and its
file is the owner's alone. Each client runs in a process of its own (a Connect session marks
its process as a Connect client for good)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from lakehouse.config.connect_token import TOKEN_ENV, read_token, token_file

# The session's server is shared with test_killed_run's runs, in `make test-long`: these tests
# start no JVM of their own.
pytestmark = pytest.mark.long

# Each URL of argv's JSON (passed in the environment: some hold the token) tried in turn:
# "ok <count>" or "refused <error>".
_TRY = """
import json, os
from pyspark.sql import SparkSession
out = []
for url in json.loads(os.environ["TRY_URLS"]):
    try:
        spark = SparkSession.builder.remote(url).create()
        out.append(f"ok {spark.range(3).count()}")
        spark.stop()
    except Exception as exc:
        out.append(f"refused {type(exc).__name__}: {exc}")
print(json.dumps(out))
"""

# The project's own client: the settings of the environment, the run's session factory.
_PROJECT = """
from lakehouse.config.settings import Settings
from spark_jobs.session import get_spark
settings = Settings.from_env()
spark = get_spark(settings)
print(settings.spark_remote_url.split("/;", 1)[0], spark.range(3).count())
"""


def client_env(**extra: str) -> dict[str, str]:
    """A client process's environment: no Connect URL, token or state folder of the caller's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_CONNECT_STATE_DIR", TOKEN_ENV,
                        "SPARK_CONNECT_MODE_ENABLED")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def run_client(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_client_without_the_servers_token_is_refused(spark_connect):
    token = read_token(spark_connect.state, spark_connect.port)
    port = spark_connect.port
    urls = [spark_connect.url,  # as a user gives it, nothing read: no token
            f"sc://localhost:{port}",  # plain, no token
            f"sc://localhost:{port}/;token=not-{token}",  # another token
            f"sc://localhost:{port}/;token={token}"]  # a user's own URL with the token: runs
    tried = json.loads(run_client(_TRY, client_env(TRY_URLS=json.dumps(urls))))
    assert tried[-1] == "ok 3", tried
    for url, outcome in zip(urls[:-1], tried[:-1], strict=True):
        assert outcome.startswith("refused"), (url, outcome)
        assert "authentication token" in outcome, (url, outcome)  # the server's refusal
    assert "Invalid authentication token" in tried[2], tried
    assert not any(token in outcome for outcome in tried)


def test_the_projects_client_presents_the_token_and_runs(spark_connect):
    got = run_client(_PROJECT, client_env(**spark_connect.env))
    assert got == f"sc://localhost:{spark_connect.port} 3", got


def server_group(pid: int) -> list[int]:
    """The processes of the server's process group (the JVM and its Python workers)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[2]) == pid:
                found.append(int(stat_file.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_the_token_is_on_no_command_line_and_its_file_is_the_owners(spark_connect):
    path = token_file(spark_connect.state, spark_connect.port)
    token = read_token(spark_connect.state, spark_connect.port)
    assert token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_uid == os.getuid()
    pid = int((spark_connect.state / "server.pid").read_text())
    group = server_group(pid)
    assert pid in group
    # It reached the JVM in its environment (readable by its owner only) ...
    assert f"{TOKEN_ENV}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(
        b"\0")
    assert b"java" in Path(f"/proc/{pid}/cmdline").read_bytes()
    # ... and is on no command line of this machine, the server's processes' included.
    on_command_lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if token.encode() in cmdline.read_bytes():
                on_command_lines.append(cmdline.parent.name)
        except OSError:
            continue
    assert not on_command_lines, on_command_lines
    assert token not in spark_connect.log.read_text(errors="replace")
