"""Start, stop and check the monitoring stack on 127.0.0.1: Prometheus, Alertmanager and the
daily-side exporter (`orchestration.daily_metrics`).

Uses the Debian binaries (`prometheus`, `prometheus-alertmanager`, which `make setup` installs:
`make system-deps`), never their system services: each runs as a process of the repo's own with
its config and data under `.observe/` (OBSERVE_STATE_DIR): `prometheus.yml` and
`alertmanager.yml` are written there at every `up` from the settings below, with the rules of
`infra/prometheus/rules/` (recording rules and alerts, `promtool check rules` clean). Ports:
PROMETHEUS_PORT (9190), ALERTMANAGER_PORT (9193), DAILY_METRICS_PORT (9109, the exporter): not
the 9090 and 9093 of the packages' own system services (started on install where systemd runs).
Scraped: every pipeline's service (`make stream`, one port per pipeline: STREAM_METRICS_PORTS,
comma-separated, default METRICS_PORT or 9108) and the exporter, every OBSERVE_SCRAPE_INTERVAL
(15s; rules evaluated as often). Alerts go to Alertmanager, which posts them to
ALERT_WEBHOOK_URL (unset: kept in Alertmanager only). Usage:

    python infra/prometheus/observe.py up|down|status [--state-dir DIR] [--rules-dir DIR]
        [--no-exporter]

`up` is idempotent (a running server is restarted only when its config changed: reloaded by
SIGHUP) and waits until each answers; `down` stops them by their pids.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daemon import REPO, Daemon, ServerError, port_open, run_cli, taken  # noqa: E402

RULES = Path(__file__).resolve().parent / "rules"
STREAM_JOB, DAILY_JOB = "lakehouse_stream", "lakehouse_daily"


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def _port(name: str, default: int) -> int:
    raw = _env(name, str(default))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ServerError(f"{name}={raw!r} is not a port (1-65535)")
    return int(raw)


def binary(*names: str) -> str:
    for name in names:
        if found := shutil.which(name):
            return found
    raise ServerError(f"{names[0]} not found: run `make setup` (Debian/Ubuntu: sudo apt-get "
                      "install prometheus prometheus-alertmanager)")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def stream_ports() -> list[int]:
    raw = _env("STREAM_METRICS_PORTS", _env("METRICS_PORT", "9108"))
    ports = [p.strip() for p in raw.split(",") if p.strip()]
    if not ports or not all(p.isdigit() and 0 < int(p) < 65536 for p in ports):
        raise ServerError(f"STREAM_METRICS_PORTS={raw!r}: comma-separated ports, e.g. 9108,9110")
    return [int(p) for p in ports]


def prometheus_config(scrape_interval: str, rules_dir: Path, alertmanager_port: int,
                      stream: list[int], daily: int | None) -> dict:
    """The scrape config (JSON is YAML): the services and the exporter on loopback."""
    jobs = [{"job_name": STREAM_JOB, "static_configs": [
        {"targets": [f"127.0.0.1:{p}" for p in stream]}]}]
    if daily is not None:
        jobs.append({"job_name": DAILY_JOB, "static_configs": [
            {"targets": [f"127.0.0.1:{daily}"]}]})
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval if _seconds(scrape_interval) < 10 else "10s"},
        "rule_files": [str(rules_dir.resolve() / "*.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": jobs,
    }


def alertmanager_config(webhook: str | None, group_wait: str, repeat: str) -> dict:
    """One route: every alert, grouped by alert and pipeline, to the webhook (or nowhere)."""
    receiver = {"name": "webhook"}
    if webhook:
        receiver["webhook_configs"] = [{"url": webhook, "send_resolved": True}]
    return {
        "route": {"receiver": "webhook", "group_by": ["alertname", "pipeline"],
                  "group_wait": group_wait, "group_interval": group_wait,
                  "repeat_interval": repeat},
        "receivers": [receiver],
    }


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[:-len(unit)].isdigit():
            return int(duration[:-len(unit)]) * units[unit]
    raise ServerError(f"OBSERVE_SCRAPE_INTERVAL={duration!r}: a duration like 15s or 1m")


class Stack:
    def __init__(self, state_dir: Path, rules_dir: Path = RULES, exporter: bool = True):
        self.state_dir = state_dir.resolve()
        self.rules_dir = rules_dir
        self.exporter = exporter
        self.scrape_daily = exporter  # scrape DAILY_METRICS_PORT (an exporter started elsewhere)
        self.prom_port = _port("PROMETHEUS_PORT", 9190)
        self.am_port = _port("ALERTMANAGER_PORT", 9193)
        self.daily_port = _port("DAILY_METRICS_PORT", 9109)
        self.interval = _env("OBSERVE_SCRAPE_INTERVAL", "15s")
        self.prometheus = Daemon("Prometheus", self.state_dir / "prometheus.pid",
                                 self.state_dir / "prometheus.log")
        self.alertmanager = Daemon("Alertmanager", self.state_dir / "alertmanager.pid",
                                   self.state_dir / "alertmanager.log")
        self.daily = Daemon("daily exporter", self.state_dir / "daily_metrics.pid",
                            self.state_dir / "daily_metrics.log")

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.am_port}"

    def _write(self, name: str, config: dict) -> bool:
        """Write the config file, readable by its owner only (Alertmanager's holds the webhook
        URL, which may carry a token); whether it changed."""
        path = self.state_dir / name
        text = json.dumps(config, indent=2) + "\n"
        if path.exists() and path.read_text() == text:
            path.chmod(0o600)
            return False
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(text)
        return True

    def _up(self, daemon: Daemon, port: int, cmd: list[str], ready: str, changed: bool,
            env: dict | None = None, wait_s: float = 60.0) -> str:
        pid = daemon.pid()
        if pid is not None:
            if changed:
                os.kill(pid, signal.SIGHUP)  # both servers reload their config on SIGHUP
            daemon.wait_ready(lambda: answers(ready), wait_s)
            return f"{daemon.name} already running on 127.0.0.1:{port} (pid {pid})"
        if port_open(port):
            raise taken(port, {self.prom_port: "PROMETHEUS_PORT", self.am_port: "ALERTMANAGER_PORT",
                               self.daily_port: "DAILY_METRICS_PORT"}[port])
        daemon.start(cmd, env=env, cwd=self.state_dir)
        daemon.wait_ready(lambda: answers(ready), wait_s)
        return f"{daemon.name} up on 127.0.0.1:{port} (pid {daemon.pid()}), log: {daemon.log_file}"

    def up(self) -> str:
        prometheus, alertmanager = binary("prometheus"), binary("prometheus-alertmanager",
                                                                  "alertmanager")
        ports = stream_ports()  # a bad setting fails before anything starts
        if not any(self.rules_dir.glob("*.yml")):
            raise ServerError(f"no rule files (*.yml) in {self.rules_dir}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lines = []
        am_changed = self._write("alertmanager.yml", alertmanager_config(
            os.environ.get("ALERT_WEBHOOK_URL"), _env("ALERT_GROUP_WAIT", "30s"), "4h"))
        lines.append(self._up(
            self.alertmanager, self.am_port,
            [alertmanager, f"--config.file={self.state_dir / 'alertmanager.yml'}",
             f"--storage.path={self.state_dir / 'alertmanager-data'}",
             f"--web.listen-address=127.0.0.1:{self.am_port}", "--cluster.listen-address=",
             "--log.level=warn"],
            f"{self.alertmanager_url}/-/ready", am_changed))
        if self.exporter:
            python = str(REPO / ".venv" / "bin" / "python")
            if not Path(python).exists():
                python = sys.executable
            env = {**os.environ, "DAILY_METRICS_PORT": str(self.daily_port)}
            lines.append(self._up(self.daily, self.daily_port,
                                  [python, "-m", "orchestration.daily_metrics"],
                                  f"http://127.0.0.1:{self.daily_port}/metrics", False,
                                  env=env, wait_s=120))
        self._write("prometheus.yml", prometheus_config(
            self.interval, self.rules_dir, self.am_port, ports,
            self.daily_port if self.scrape_daily else None))
        # A rule file edited since the last `up` is read again by a reload too.
        lines.append(self._up(
            self.prometheus, self.prom_port,
            [prometheus, f"--config.file={self.state_dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.state_dir / 'prometheus-data'}",
             "--storage.tsdb.retention.time=15d",
             f"--web.listen-address=127.0.0.1:{self.prom_port}", "--web.enable-lifecycle",
             "--log.level=warn"],
            f"{self.prometheus_url}/-/ready", True))
        return "\n".join(lines)

    def down(self) -> str:
        lines = []
        for daemon in (self.prometheus, self.daily, self.alertmanager):
            pid = daemon.stop()
            lines.append(f"{daemon.name} stopped (pid {pid})" if pid
                         else f"{daemon.name} not running")
        return "\n".join(lines)

    def running(self) -> bool:
        return self.prometheus.pid() is not None and self.alertmanager.pid() is not None

    def status(self) -> str:
        lines = []
        for daemon, port in ((self.prometheus, self.prom_port), (self.alertmanager, self.am_port),
                             (self.daily, self.daily_port)):
            pid = daemon.pid()
            lines.append(f"{daemon.name} running on 127.0.0.1:{port} (pid {pid})" if pid
                         else f"{daemon.name} not running")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("OBSERVE_STATE_DIR", REPO / ".observe")))
    parser.add_argument("--rules-dir", type=Path, default=RULES)
    parser.add_argument("--no-exporter", action="store_true",
                        help="do not start the daily-side exporter")
    args = parser.parse_args(argv)
    stack = Stack(args.state_dir, args.rules_dir, exporter=not args.no_exporter)
    return run_cli(getattr(stack, args.command),
                   ok=lambda: args.command != "status" or stack.running())


if __name__ == "__main__":
    sys.exit(main())
