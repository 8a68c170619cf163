"""The Grafana dashboard's queries (infra/grafana/dashboard.py; the committed JSON is the
generator's output: tests/unit/test_dashboard.py): every panel's PromQL runs in a real Prometheus
(the Debian binary, started by `observe_stack` with the project's rules) scraping the service's
metrics (`StreamMetrics`, fed progress reports and topic offsets) and the daily exporter over the
end-to-end scenario's tables: each query parses and finds data."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from conftest import free_port, observe_stack

from testkit.infra import infra_module

dashboard = infra_module("grafana/dashboard.py")


def query(stack, expr: str) -> dict:
    url = f"{stack.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:  # 400 bad_data: the query does not parse
        return json.loads(exc.read())


def test_every_panel_query_parses_and_finds_data(tmp_path, scenario):
    from prometheus_client import CollectorRegistry, start_http_server
    from test_metrics import progress

    from assets.pipelines import Pipeline
    from lakehouse.kafka.admin import PartitionOffsets
    from orchestration.daily_metrics import DailyCollector
    from orchestration.service.metrics import StreamMetrics

    settings, _expected, _dates, outcomes, _chunks = scenario
    stream_port, daily_port = free_port(), free_port()
    metrics = StreamMetrics(settings, offsets=lambda _s: [PartitionOffsets(0, 0, 100)],
                            poll_seconds=0.5)
    metrics.start(stream_port)
    metrics.lock_held(True)
    registry = CollectorRegistry()
    registry.register(DailyCollector([Pipeline.of(settings)], outcomes["instance"]))
    daily, _ = start_http_server(daily_port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def batches() -> None:  # a batch every half second, 90 records behind the topic
        for i in range(10_000):
            now = datetime.now(UTC)
            metrics.observe_progress("ingest", [progress(i, now, rows=5, end={settings.events_topic: {"0": 10}})])
            if stop.wait(0.5):
                return

    feeder = threading.Thread(target=batches, daemon=True)
    feeder.start()
    try:
        with observe_stack(tmp_path / "observe", [stream_port], daily_port=daily_port) as stack:
            exprs = [e.replace("$pipeline", ".*") for e in dashboard.queries()]
            # No quarantine, failure or late event happens here: those panels may stay empty.
            allowed = {e for e in exprs if "quarantined" in e}
            deadline = time.monotonic() + 60
            while True:
                results = {e: query(stack, e) for e in exprs}
                bad = {e: r.get("error") for e, r in results.items() if r["status"] != "success"}
                assert not bad, f"queries that do not parse: {bad}"
                empty = [e for e, r in results.items() if not r["data"]["result"]]
                if set(empty) <= allowed or time.monotonic() > deadline:
                    break
                time.sleep(1)
    finally:
        stop.set()
        metrics.stop()
        daily.shutdown()
        daily.server_close()
    assert set(empty) <= allowed, f"panels without data: {empty}"
