"""`make spark-up`'s server (infra/spark/connect.py) listens where the runs will ask for it, and
`make ui` starts it first when SPARK_REMOTE names this machine (its launched runs use it)."""

import os
import subprocess
from pathlib import Path

import pytest

from testkit.infra import infra_module

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "port"), [
    ({}, 15002),
    ({"SPARK_REMOTE": "sc://127.0.0.1:15010"}, 15010),
    ({"SPARK_REMOTE": "sc://localhost:15011/;use_ssl=false"}, 15011),
    ({"SPARK_REMOTE": "sc://spark.example.com:443/;token=x"}, 15002),  # not this machine's
    ({"SPARK_REMOTE": "sc://127.0.0.1:15010", "SPARK_CONNECT_PORT": "15020"}, 15020),
])
def test_the_server_listens_on_the_port_the_runs_ask_for(env, port):
    assert infra_module("spark/connect.py").default_port(env) == port


def planned(*args: str) -> str:
    """What `make -n ui ...` would run (nothing is run)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run(["make", "-n", "ui", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60).stdout


@pytest.mark.parametrize(("remote", "starts"), [
    (None, False),
    ("sc://127.0.0.1:15002", True),
    ("sc://localhost:15010/;user_id=me", True),
    ("sc://spark.example.com:443/;token=x", False),
])
def test_make_ui_starts_the_local_connect_server_when_runs_use_it(remote, starts):
    plan = planned(*([f"SPARK_REMOTE={remote}"] if remote else []))
    assert "dagster dev" in plan, plan
    assert ("infra/spark/connect.py up" in plan) == starts, plan
    if starts:  # before the UI and its daemon
        assert plan.index("infra/spark/connect.py up") < plan.index("dagster dev")
