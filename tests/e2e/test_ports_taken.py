"""Every port a server script of the project listens on, held by another process before `up`:
the script stops with one line naming the port, its holder (this test's pid) and the variable
that moves it, and starts nothing. The broker's ports are tests/e2e/test_broker.py's,
Prometheus' and Alertmanager's tests/e2e/test_observe_stack.py's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, free_port

# (script, its variable, how the port is given: "--port" or the variable itself, more env)
SERVERS = {
    "schema registry": ("infra/registry/registry.py", "REGISTRY_PORT", "--port", {}),
    "S3Proxy": ("infra/s3/s3proxy.py", "S3_PORT", "--port", {}),
    "PostgreSQL": ("infra/postgres/pg.py", "PG_PORT", "--port", {}),
    "Spark Connect": ("infra/spark/connect.py", "SPARK_CONNECT_PORT", "--port", {}),
    "Spark master": ("infra/spark/cluster.py", "SPARK_MASTER_PORT", "env",
                     {"SPARK_MASTER_WEBUI_PORT": "free"}),
    "Spark master web UI": ("infra/spark/cluster.py", "SPARK_MASTER_WEBUI_PORT", "env",
                            {"SPARK_MASTER_PORT": "free"}),
}


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_taken_port_is_one_line_naming_its_holder_and_the_variable(server):
    script, variable, given, more = SERVERS[server]
    # As root PostgreSQL's cluster belongs to an unprivileged user, who must reach the folder.
    state = Path(tempfile.mkdtemp(prefix="lakehouse-port-test-", dir="/tmp"))
    state.chmod(0o755)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {**os.environ, **{k: str(free_port()) if v == "free" else v
                                for k, v in more.items()}}
        args = [sys.executable, str(REPO / script), "up", "--state-dir", str(state / "s")]
        if given == "--port":
            args += ["--port", str(port)]
        else:
            env[variable] = str(port)
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env,
                              cwd=REPO)
    try:
        err = done.stderr.strip()
        assert done.returncode == 1, (done.stdout, err)
        assert err.count("\n") == 0, err  # one line
        assert f"port {port} is taken by pid {os.getpid()} (" in err, err  # the holder
        assert variable in err, err  # and what moves it
        assert not list(state.rglob("*.pid")), "a server was started"
    finally:
        subprocess.run([sys.executable, str(REPO / script), "down", "--state-dir",
                        str(state / "s")], capture_output=True, timeout=120, env=env, cwd=REPO)
        shutil.rmtree(state, ignore_errors=True)
