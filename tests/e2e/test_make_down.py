"""`make down` stops every server the targets started and keeps their data; without a venv it
does nothing. Run on servers of the test's own (a broker, the schema registry, Prometheus,
Alertmanager and the daily exporter on free ports), with every server script's state folder
pointed into a throwaway folder: each script stops only what its state folder's pid files name,
so the suite's broker (and a developer's servers) are never touched. Afterwards no process of
theirs is left: no pid file, no process in any of their sessions (each server leads one, so the
children it started are in it too), none whose command line names the state folder. A server
script added to `make down` without a state folder variable this test sets fails the test
before anything is stopped. (Spark Connect and the cluster stack are left out: a JVM each, or
five; their scripts stop them by the same `infra/daemon.py` code.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, free_port

# Each script `make down` runs, and the variable its state folder (pid files) is read from.
STATE_VARIABLES = {
    "infra/spark/connect.py": ["SPARK_CONNECT_STATE_DIR"],
    "infra/prometheus/observe.py": ["OBSERVE_STATE_DIR"],
    "infra/registry/registry.py": ["REGISTRY_STATE_DIR"],
    "infra/kafka/broker.py": ["KAFKA_STATE_DIR", "KAFKA_CLUSTER_STATE_DIR"],
    "infra/s3/s3proxy.py": ["S3_STATE_DIR"],
    "infra/postgres/pg.py": ["PG_STATE_DIR"],
    "infra/spark/cluster.py": ["SPARK_STATE_DIR"],
}


def _env(state: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    for variables in STATE_VARIABLES.values():
        for variable in variables:
            env[variable] = str(state / variable.lower())
    return {**env, **extra}


def _make(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _processes_mentioning(text: str) -> dict[int, str]:
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found[int(cmdline.parent.name)] = args
    return found


def _pid(path: Path) -> int:
    return int(path.read_text().strip())


def _sessions(sids: set[int]) -> dict[int, str]:
    """The running processes (zombies aside) whose session is one of `sids`, with their
    command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            args = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        if int(fields[3]) in sids and fields[0] != "Z":
            found[int(stat.parent.name)] = args
    return found


def test_make_down_stops_every_server_and_keeps_the_data(tmp_path):
    state = tmp_path / "state"
    env = _env(state, KAFKA_HEAP_OPTS="-Xms64m -Xmx256m")

    # What `make down` would run: only scripts whose state folder this test points elsewhere.
    planned = _make(env, "-n", "down")
    assert planned.returncode == 0, planned.stderr
    scripts = re.findall(r"\|\| \S+ (infra/\S+\.py) \S+", planned.stdout)
    assert len(scripts) == len(planned.stdout.splitlines()), planned.stdout
    unknown = set(scripts) - set(STATE_VARIABLES)
    assert not unknown, f"make down runs {unknown}: add its state folder variable to this test"
    for script in set(scripts):  # each reads the variable this test sets
        assert all(v in (REPO / script).read_text() for v in STATE_VARIABLES[script]), script

    broker_port = free_port(span=2)  # the controller listens on port + 1
    python = str(REPO / ".venv/bin/python")
    up = subprocess.run([python, "infra/kafka/broker.py", "up", "--port", str(broker_port),
                         "--controller-port", str(broker_port + 1)],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    registry = subprocess.run([python, "infra/registry/registry.py", "up", "--port",
                               str(free_port())], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)
    home = tmp_path / "dagster_home"
    home.mkdir()
    # The exporter too (a Python process of the project), reading a root and instance of its own.
    observe_env = {**env, "PROMETHEUS_PORT": str(free_port()),
                   "ALERTMANAGER_PORT": str(free_port()), "DAILY_METRICS_PORT": str(free_port()),
                   "DAGSTER_HOME": str(home), "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
                   "PIPELINES": ""}
    observe = subprocess.run([python, "infra/prometheus/observe.py", "up"],
                             cwd=REPO, env=observe_env, capture_output=True, text=True,
                             timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        assert registry.returncode == 0, registry.stderr
        assert observe.returncode == 0, observe.stderr
        kafka_state = state / "kafka_state_dir"
        observe_state = state / "observe_state_dir"
        pid_files = {"broker": kafka_state / "broker.pid",
                     "registry": state / "registry_state_dir" / "registry.pid",
                     "prometheus": observe_state / "prometheus.pid",
                     "alertmanager": observe_state / "alertmanager.pid",
                     "exporter": observe_state / "daily_metrics.pid"}
        pids = {name: _pid(f) for name, f in pid_files.items()}
        running = _processes_mentioning(str(state))
        assert {pids["broker"], pids["prometheus"], pids["alertmanager"]} <= set(running), \
            running
        # Each server leads a session of its own: the processes of the project are theirs.
        sessions = _sessions(set(pids.values()))
        assert set(pids.values()) <= set(sessions), sessions

        # Where nothing was installed (no venv) it needs nothing and stops nothing.
        bare = _make(env, "down", f"VENV={tmp_path / 'no-venv'}")
        assert bare.returncode == 0 and bare.stdout == "", bare.stdout + bare.stderr
        assert set(pids.values()) <= set(_sessions(set(pids.values())))

        down = _make(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"Kafka stopped (pid {pids['broker']})" in down.stdout
        assert f"Prometheus stopped (pid {pids['prometheus']})" in down.stdout
        assert f"Alertmanager stopped (pid {pids['alertmanager']})" in down.stdout
        assert f"daily exporter stopped (pid {pids['exporter']})" in down.stdout
        assert f"schema registry stopped (pid {pids['registry']})" in down.stdout
        left = _processes_mentioning(str(state))
        assert not left, f"still running after make down: {left}"
        left = _sessions(set(pids.values()))
        assert not left, f"still running after make down, in a server's session: {left}"
        assert not [f for f in pid_files.values() if f.exists()], "pid files left"
        assert not any(Path(f"/proc/{pid}").exists() and
                       Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                       for pid in pids.values())
        # The data stays: the broker's log and metadata, Prometheus' database.
        assert (kafka_state / "data" / "meta.properties").is_file()
        assert (observe_state / "prometheus-data").is_dir()
        # A second `make down` finds nothing to stop.
        again = _make(env, "down")
        assert again.returncode == 0 and "Kafka not running" in again.stdout, again.stdout
    finally:
        for script, command in (("infra/kafka/broker.py", "down"),
                                ("infra/registry/registry.py", "down"),
                                ("infra/prometheus/observe.py", "down")):
            subprocess.run([sys.executable, script, command], cwd=REPO, env=env,
                           capture_output=True, timeout=120)
