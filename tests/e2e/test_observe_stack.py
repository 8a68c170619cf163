"""`make observe-up` / `make observe-down` (infra/prometheus/observe.py) on free ports in a
throwaway folder: Prometheus and Alertmanager start from the Debian binaries with the project's
config (the services' ports, the exporter, the rules, the webhook route), a second `up` is a
no-op, `status` says what runs, a taken port is a clear error, `down` stops both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

from conftest import REPO, free_port

SCRIPT = str(REPO / "infra/prometheus/observe.py")


def run(state, *args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_observe_up_status_down(tmp_path):
    prom, am, daily = free_port(), free_port(), free_port()
    env = {"PROMETHEUS_PORT": str(prom), "ALERTMANAGER_PORT": str(am),
           "DAILY_METRICS_PORT": str(daily), "STREAM_METRICS_PORTS": "9108,9110",
           "ALERT_WEBHOOK_URL": "http://127.0.0.1:1/hook"}
    state = tmp_path / "observe"
    up = run(state, "up", "--no-exporter", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert f"Prometheus up on 127.0.0.1:{prom}" in up.stdout
        again = run(state, "up", "--no-exporter", env=env)
        assert again.returncode == 0 and again.stdout.count("already running") == 2, again.stdout
        assert run(state, "status", env=env).returncode == 0

        config = json.loads((state / "prometheus.yml").read_text())
        targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
        assert targets == {"lakehouse_stream": ["127.0.0.1:9108", "127.0.0.1:9110"]}
        assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{am}"]
        route = json.loads((state / "alertmanager.yml").read_text())
        assert route["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:1/hook"
        with urllib.request.urlopen(f"http://127.0.0.1:{prom}/api/v1/rules", timeout=10) as r:
            groups = json.loads(r.read())["data"]["groups"]
        assert {g["name"] for g in groups} == {"lakehouse_sli", "lakehouse_alerts"}

        # Another state folder on the same ports: refused, naming the port, its holder and the
        # variable that moves it.
        clash = run(tmp_path / "other", "up", "--no-exporter", env=env)
        assert clash.returncode == 1 and re.search(
            rf"port {am} is taken by pid \d+ \(\S*alertmanager\): stop it, or set "
            "ALERTMANAGER_PORT to another port", clash.stderr), clash.stderr
        bad = run(state, "up", "--no-exporter", env={**env, "STREAM_METRICS_PORTS": "x"})
        assert bad.returncode == 1 and "STREAM_METRICS_PORTS" in bad.stderr
    finally:
        down = run(state, "down", env=env)
    assert down.returncode == 0 and "Prometheus stopped" in down.stdout
    assert run(state, "status", env=env).returncode == 3
