"""`make spark-up`'s server (infra/spark/connect.py) listens where the runs will ask for it, and
`make ui` starts it first when SPARK_REMOTE names this machine (its launched runs use it);
`make ui-cluster` likewise, a server of its own under the cluster's settings, which `make
cluster-down` stops."""

import os
import re
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


def planned(*args: str, target: str = "ui") -> str:
    """What `make -n <target> ...` would run (nothing is run)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run(["make", "-n", target, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60).stdout


@pytest.mark.parametrize(("remote", "starts"), [
    (None, False),
    ("sc://127.0.0.1:15002", True),
    ("sc://localhost:15010/;user_id=me", True),
    ("sc://spark.example.com:443/;token=x", False),
])
@pytest.mark.parametrize("target", ["ui", "ui-cluster"])
def test_make_ui_starts_the_local_connect_server_when_runs_use_it(remote, starts, target):
    plan = planned(*([f"SPARK_REMOTE={remote}"] if remote else []), target=target)
    assert "dagster dev" in plan, plan
    up = re.search(r"infra/spark/connect\.py (--state-dir (\S+) )?up", plan)
    assert bool(up) == starts, plan
    if starts:  # before the UI and its daemon; the cluster's server in a state dir of its own
        assert plan.index(up.group(0)) < plan.index("dagster dev")
        assert (up.group(2) or "").endswith(".spark-connect-cluster") == (target == "ui-cluster")
        if target == "ui-cluster":  # under the cluster's settings
            assert plan.index("infra/cluster.env") < plan.index(up.group(0)), plan


def test_make_cluster_down_stops_the_clusters_connect_server():
    plan = planned(target="cluster-down")
    assert re.search(r"infra/spark/connect\.py --state-dir \S+\.spark-connect-cluster down", plan), plan
