"""`make observe-up`, then `make demo` and `make demo PIPELINE=examples/orders.yaml`, then a look
at Prometheus' API: every SLI series of infra/prometheus/rules/sli.yml and of the daily exporter
exists for both pipelines, and every dashboard panel's query finds data for each, over the time
the demos ran. The demos are the real CLI (subprocesses, their live step the real service for
DEMO_LIVE with events arriving); the daily exporter is `make daily-metrics`' process; Prometheus
is the Debian binary with the project's rules (`observe_stack`). The default demo is also the
suite's check of the demo's console, run storage and UI (`assert_reads_like_a_tool`), of its
downstream feed and of `make scorecard` on its deployment (`assert_fed_and_scored`). The demos
run with the ports that `make setup`'s own packages listen on where systemd starts them
(Prometheus 9090, Alertmanager 9093 and 9094) held, as on such a host."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_port, observe_stack
from test_demo import assert_fed_and_scored, assert_reads_like_a_tool, run_demo

from testkit.infra import infra_module

PIPELINES = ("default", "orders")
# What Debian's prometheus and prometheus-alertmanager packages listen on once their services run.
PACKAGED_PORTS = (9090, 9093, 9094)
DAILY = ("lakehouse_daily_proven", "lakehouse_daily_deadline_timestamp_seconds",
         "lakehouse_daily_gold_updated_timestamp_seconds", "lakehouse_daily_corrections",
         "lakehouse_daily_late_events_waiting", "lakehouse_daily_last_success_timestamp_seconds")


def orders_spec(folder: Path) -> Path:
    """The order example with a topic of its own (tests share one broker)."""
    import uuid

    spec = yaml.safe_load((REPO / "examples/orders.yaml").read_text())
    spec["topic"] = f"orders-{uuid.uuid4().hex[:8]}"
    path = folder / "orders.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@contextmanager
def held(ports):
    """Listen on each of `ports` that is free for as long as the block runs (one that is taken is
    held by someone else already, which is the same for the code under test)."""
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
        yield


def query_range(stack, expr: str, start: float, end: float) -> list:
    url = f"{stack.prometheus_url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": "2"})
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def sli_records() -> list[str]:
    rules = yaml.safe_load((REPO / "infra/prometheus/rules/sli.yml").read_text())
    return [r["record"] for g in rules["groups"] for r in g["rules"]]


def demos(tmp_path: Path, bootstrap: str, live: dict, orders: Path, home: Path) -> None:
    """`make demo`, then `make demo PIPELINE=<orders>`: each succeeds with its live service."""
    for extra in ({}, {"PIPELINE": str(orders)}):
        done, _, demo_env = run_demo(tmp_path, bootstrap, timeout=900, **live, **extra)
        assert done.returncode == 0, done.stdout + done.stderr
        assert any(line.startswith("  service") and " ok " in line
                   for line in done.stdout.splitlines()), done.stdout
        if not extra:  # the default demo: its console, run storage and UI
            assert_reads_like_a_tool(done, home, demo_env)
            assert_fed_and_scored(demo_env)  # its feed and `make scorecard`


@pytest.mark.slow
def test_after_the_demos_prometheus_has_every_sli_and_panel_for_both_pipelines(
        tmp_path, kafka_bootstrap):
    from dagster import DagsterInstance

    stream_port, daily_port = free_port(), free_port()
    live = {"DEMO_LIVE": "25 seconds", "STREAM_TRIGGER_INTERVAL": "2 seconds",
            "METRICS_PORT": str(stream_port), "DEMO_EVENTS": "600", "DEMO_SPAN": "2 hours"}
    orders = orders_spec(tmp_path)  # with a topic of its own
    home = tmp_path / "dagster_home"
    env = {**os.environ, "DAGSTER_HOME": str(home), "LAKEHOUSE_ROOT": str(tmp_path / "lakehouse"),
           "PIPELINES": str(orders), "DAILY_METRICS_PORT": str(daily_port)}
    home.mkdir()
    # The instance's storage exists before the exporter and the demo open it: two processes
    # creating Dagster's SQLite tables at once race ("table jobs already exists").
    shutil.copy(REPO / "infra" / "dagster.yaml", home / "dagster.yaml")
    DagsterInstance.from_config(str(home)).dispose()
    exporter = subprocess.Popen([sys.executable, "-m", "orchestration.daily_metrics"], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with observe_stack(tmp_path / "observe", [stream_port], interval="1s",
                           daily_port=daily_port) as stack:
            start = time.time()
            with held(PACKAGED_PORTS):
                demos(tmp_path, kafka_bootstrap, live, orders, home)
            time.sleep(3)  # the exporter's last scrape and the rules' last evaluation
            end = time.time()

            missing = [(expr, p) for expr in [*sli_records(), *DAILY] for p in PIPELINES
                       if expr != "instance:lakehouse_service_up"
                       and not query_range(stack, f'{expr}{{pipeline="{p}"}}', start, end)]
            assert not missing, f"SLI series without data: {missing}"
            assert query_range(stack, "instance:lakehouse_service_up == 1", start, end)

            panels = infra_module("grafana/dashboard.py").queries()
            empty = [(q, p) for q in panels for p in PIPELINES
                     if not query_range(stack, q.replace("$pipeline", p), start, end)]
            assert not empty, f"panels without data: {empty}"
    finally:
        exporter.terminate()
        out, _ = exporter.communicate(timeout=30)
    assert "daily metrics: " not in out, out  # no pipeline's scrape failed
