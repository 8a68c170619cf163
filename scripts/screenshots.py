"""README screenshots with headless Chromium (`make screenshots`).

Starts dagster-webserver on a free loopback port over the project's DAGSTER_HOME (default
`.dagster_home`), screenshots the global asset graph with every group expanded into
docs/images/asset-graph.png, and the timeline report `$LAKEHOUSE_ROOT/reports/timeline.html` into
docs/images/timeline.png when it exists, and Prometheus' graph page of the end-to-end latency SLI
into docs/images/prometheus-latency.png when `make observe-up`'s Prometheus answers
(PROMETHEUS_PORT). The graph renders from the definitions alone, so an
instance without runs still gives a picture; with runs, the nodes show their latest status.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from testkit.ports import free_port
from testkit.webserver import graph_url, webserver

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs/images"
INSTALL = "apt-get update && apt-get install -y chromium"
# At 1600 px wide the graph is zoomed out to name-only boxes; 1920 px shows the node details.
GRAPH_WINDOW = "1920,1080"
REPORT_WINDOW = "1600,1000"
# Prometheus' own graph page of the latency SLI (its recording rule), over the last half hour.
LATENCY_SLI = "pipeline:lakehouse_end_to_end_latency_seconds:p95_5m"
PROMETHEUS_RANGE = "30m"


def dagster_home() -> Path:
    """$DAGSTER_HOME (or .dagster_home), with the project's dagster.yaml as `make setup` puts it."""
    home = Path(os.environ.get("DAGSTER_HOME") or REPO / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(REPO / "infra/dagster.yaml", home / "dagster.yaml")
    # The UI opens a "Join the Dagster community" dialog over every page until it has been
    # dismissed once on the instance; dismissing it writes this file (dagster._core.nux).
    nux = home / ".nux/nux.yaml"
    if not nux.exists():
        nux.parent.mkdir(exist_ok=True)
        nux.write_text("seen: 1\n")
    return home


def lakehouse_root() -> Path:
    sys.path.insert(0, str(REPO))
    from lakehouse.config.settings import Settings

    return Path(Settings.from_env().lakehouse_root).resolve()


def screenshot(chromium: str, url: str, out: Path, window: str) -> None:
    """One page to PNG. The virtual time budget lets the UI finish its queries and the graph
    layout before the capture; a fresh profile keeps saved UI state out of the picture."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        done = subprocess.run(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={window}", "--virtual-time-budget=15000",
             f"--screenshot={out}", url],
            capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        raise SystemExit(f"chromium failed on {url} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    print(f"wrote {out}")


def main() -> int:
    chromium = shutil.which("chromium")
    if not chromium:
        print(f"error: chromium not found: install it with `{INSTALL}`", file=sys.stderr)
        return 1
    IMAGES.mkdir(parents=True, exist_ok=True)
    home = dagster_home()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_DISABLE_TELEMETRY": "true",
           "GX_ANALYTICS_ENABLED": "false"}
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        with webserver(env, free_port(), Path(tmp) / "webserver.log") as url:
            screenshot(chromium, graph_url(url), IMAGES / "asset-graph.png", GRAPH_WINDOW)

    report = lakehouse_root() / "reports/timeline.html"
    if report.exists():
        screenshot(chromium, report.as_uri(), IMAGES / "timeline.png", REPORT_WINDOW)
    else:
        print(f"skipped the timeline: {report} does not exist (the report writes it)")

    prometheus = f"http://127.0.0.1:{os.environ.get('PROMETHEUS_PORT') or 9190}"
    try:
        urllib.request.urlopen(f"{prometheus}/-/ready", timeout=5).close()
    except OSError:
        print(f"skipped Prometheus: nothing answers at {prometheus} (`make observe-up`)")
    else:
        graph = urllib.parse.urlencode({"g0.expr": LATENCY_SLI, "g0.tab": "0",
                                        "g0.range_input": PROMETHEUS_RANGE})
        screenshot(chromium, f"{prometheus}/graph?{graph}", IMAGES / "prometheus-latency.png",
                   REPORT_WINDOW)
    return 0


if __name__ == "__main__":
    sys.exit(main())
