"""Alerts end to end: the real service (`make stream`), the real Prometheus and Alertmanager
(`observe_stack`, the Debian binaries with the project's rules, `for:` shortened to 0s and the
quarantine alert's window to 20 s), and a webhook receiver in the test. Malformed records raise
LakehouseDeserializationFailures, resolved when none came for the window; with
records flowing, stopping the service's Spark driver (SIGSTOP to its JVM: the service's Python
process keeps serving /metrics, as in a hung JVM or a long GC pause) raises
LakehouseStreamStalled, which resolves after SIGCONT; the whole service stopped raises
LakehouseServiceDown, resolved after SIGCONT. On the daily side, a gold row tampered with fails
the next proof (`verify_dates`), which the daily exporter turns into LakehouseDateUnproven for a
date past its deadline; reconciling the date resolves it."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, free_port, observe_stack, publish_instance

from testkit.faults import output, start_service
from testkit.generator import Record, produce

STALL_AFTER_S = 15


class Webhook:
    """Alertmanager's webhook receiver: every notification's alerts, in arrival order."""

    def __init__(self):
        self.alerts: list[dict] = []
        received = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.extend(body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def seen(self, name: str, status: str) -> list[dict]:
        return [a for a in list(self.alerts)
                if a["labels"]["alertname"] == name and a["status"] == status]


def wait(predicate, svc, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert svc.poll() is None, f"the service exited: {output(svc)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def wait_until(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def has_data(stack, expr: str) -> bool:
    url = f"{stack.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return bool(json.loads(r.read())["data"]["result"])


def jvm_of(pid: int) -> int:
    """The Spark driver JVM the service (pid, its own process group) started."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        if pgrp == pid and comm == "java":
            return int(proc.name)
    raise AssertionError(f"no JVM in the service's process group {pid}")


def event(i: int, at: datetime) -> Record:
    payload = json.dumps({"event_id": f"e{i}", "key": f"k{i % 3}",
                          "event_time": at.isoformat(), "value": 1})
    return Record(b"k", payload.encode(), "event")


QUARANTINE_WINDOW = "[10m]"  # of LakehouseDeserializationFailures; the test's is 20 s


def fast_rules(tmp: Path) -> Path:
    """The project's rules with every `for:` at 0s and the quarantine alert's window at 20 s:
    the test waits for conditions, not hours."""
    out = tmp / "rules"
    out.mkdir()
    for f in (REPO / "infra/prometheus/rules").glob("*.yml"):
        text = re.sub(r"^(\s+for:) \S+$", r"\1 0s", f.read_text(), flags=re.MULTILINE)
        if f.name == "alerts.yml":
            quarantine = f"increase(lakehouse_quarantined_records_total{QUARANTINE_WINDOW})"
            assert quarantine in text
            text = text.replace(quarantine, quarantine.replace(QUARANTINE_WINDOW, "[20s]"))
        (out / f.name).write_text(text)
    return out


@pytest.mark.slow
def test_stall_and_deserialization_alerts_reach_the_webhook(instance_env, tmp_path):
    settings = instance_env
    port = free_port()
    env = {**os.environ, "STREAM_TRIGGER_INTERVAL": "1 second", "METRICS_PORT": str(port),
           "STALL_AFTER": f"{STALL_AFTER_S} seconds"}
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    produce(settings, [event(i, base + timedelta(seconds=i)) for i in range(5)]
            + [Record(b"k", b"not json", "invalid_json")])
    hook = Webhook()
    svc = start_service(env, tmp_path / "service.log")
    stop = threading.Event()

    def traffic() -> None:  # records keep arriving throughout
        i = 100
        while not stop.wait(1.0):
            produce(settings, [event(i, datetime.now(UTC))])
            i += 1

    producer = threading.Thread(target=traffic, daemon=True)
    jvm, group_stopped = None, False
    try:
        with observe_stack(tmp_path / "observe", [port], rules_dir=fast_rules(tmp_path),
                           webhook=hook.url) as stack:
            wait(lambda: hook.seen("LakehouseDeserializationFailures", "firing"), svc,
                 "the deserialization alert", timeout=240)
            fired = hook.seen("LakehouseDeserializationFailures", "firing")[0]
            assert fired["labels"]["reason"] == "invalid_json"
            assert fired["annotations"]["runbook_url"].endswith("#lakehousedeserializationfailures")
            assert not hook.seen("LakehouseStreamStalled", "firing")  # batches keep coming

            # The stream's position and last batch are known (after its first batch): a stall
            # is lag with an old last batch.
            wait(lambda: has_data(stack, "lakehouse_stream_batches_total >= 1")
                 and has_data(stack, "pipeline:lakehouse_consumer_lag_records:sum")
                 and has_data(stack, "pipeline:lakehouse_last_batch_age_seconds"), svc,
                 "the first batch, seen by Prometheus")
            producer.start()
            # Valid records only from now on: resolved once the window has passed.
            wait(lambda: hook.seen("LakehouseDeserializationFailures", "resolved"), svc,
                 "the deserialization alert resolved")
            # Traffic after an idle spell is lag with an old last batch until the next batch:
            # a stall for the rule (`for: 1m` keeps it from paging), so it may have fired here.
            wait(lambda: has_data(stack, "pipeline:lakehouse_last_batch_age_seconds < 5")
                 and not has_data(stack, 'ALERTS{alertname="LakehouseStreamStalled"}'), svc,
                 "a batch of the traffic, no stall")
            jvm = jvm_of(svc.pid)
            os.kill(jvm, signal.SIGSTOP)
            stopped_at, stopped_wall = time.monotonic(), datetime.now(UTC)

            def since_stopped(name: str, status: str) -> list[dict]:
                return [a for a in hook.seen(name, status)
                        if datetime.fromisoformat(a["startsAt"].replace("Z", "+00:00"))
                        >= stopped_wall]

            wait(lambda: since_stopped("LakehouseStreamStalled", "firing"), svc, "the stall alert")
            assert time.monotonic() - stopped_at >= STALL_AFTER_S - 5
            # /metrics kept answering (the target was down only before the service served it)
            assert not since_stopped("LakehouseServiceDown", "firing")
            os.kill(jvm, signal.SIGCONT)
            jvm = None
            wait(lambda: since_stopped("LakehouseStreamStalled", "resolved"), svc,
                 "the stall alert resolved")

            # The whole service stopped (its Python process too): /metrics does not answer.
            os.killpg(svc.pid, signal.SIGSTOP)
            group_stopped = True
            wait(lambda: since_stopped("LakehouseServiceDown", "firing"), svc,
                 "the service-down alert")
            n = len(hook.seen("LakehouseServiceDown", "resolved"))
            os.killpg(svc.pid, signal.SIGCONT)
            group_stopped = False
            wait(lambda: len(hook.seen("LakehouseServiceDown", "resolved")) > n, svc,
                 "the service-down alert resolved")
    finally:
        stop.set()
        if jvm is not None:
            os.kill(jvm, signal.SIGCONT)
        if group_stopped:
            os.killpg(svc.pid, signal.SIGCONT)
        hook.server.shutdown()
        if svc.poll() is None:
            svc.send_signal(signal.SIGTERM)
        svc.wait(timeout=120)
    assert svc.returncode == 0, output(svc)


@pytest.mark.slow
def test_proof_alert_after_gold_is_tampered_and_resolved_by_reconciling(instance_env, spark,
                                                                        tmp_path):
    from dagster import DagsterInstance
    from delta.tables import DeltaTable
    from prometheus_client import CollectorRegistry, start_http_server
    from pyspark.sql import functions as F

    from assets.pipelines import Pipeline
    from orchestration.daily_metrics import DailyCollector, deadline
    from testkit.generator import GeneratorConfig
    from testkit.runs import run_job

    settings = instance_env
    instance = DagsterInstance.ephemeral()
    # A date two days back: past its deadline (03:00 UTC the next day), within the horizon.
    end = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=2)
    cfg = GeneratorConfig(count=300, seed=5, end=end, span=timedelta(hours=1), keys=4,
                          late_fraction=0.0, duplicate_fraction=0.02, malformed_fraction=0.0)
    publish_instance(settings, cfg, 1, instance)
    d = end.date()
    assert deadline(settings, d) < datetime.now(UTC)

    registry = CollectorRegistry()
    registry.register(DailyCollector([Pipeline.of(settings)], instance))
    daily_port = free_port()
    daily, _ = start_http_server(daily_port, addr="127.0.0.1", registry=registry)
    hook = Webhook()
    proven = f'lakehouse_daily_proven{{event_date="{d.isoformat()}"}}'

    def unproven(status: str) -> list[dict]:
        return [a for a in hook.seen("LakehouseDateUnproven", status)
                if a["labels"]["event_date"] == d.isoformat()]

    try:
        # No service runs here: its scrape target (a free port) is down, which is not this test's.
        with observe_stack(tmp_path / "observe", [free_port()], rules_dir=fast_rules(tmp_path),
                           webhook=hook.url, daily_port=daily_port) as stack:
            wait_until(lambda: has_data(stack, f"{proven} == 1"), "the date proven, scraped")
            time.sleep(3)  # rules evaluated every second: a firing alert would be out by now
            assert not unproven("firing")

            gold = settings.table_path("reconciled_aggregates")
            row = (spark.read.format("delta").load(gold).where(F.col("event_date") == F.lit(d))
                   .orderBy("window_start", "key").first())
            DeltaTable.forPath(spark, gold).update(
                condition=(F.col("window_start") == F.lit(row.window_start))
                & (F.col("key") == F.lit(row.key)),
                set={"value_sum": F.col("value_sum") + F.lit(1)})
            result, checks = run_job("verify_dates", instance, quiet=True,
                                     partition_key=d.isoformat())
            assert not result.success
            assert not next(c for c in checks if c.check_name == "reconciled_equals_replay").passed
            wait_until(lambda: unproven("firing"), "the proof alert")
            fired = unproven("firing")[0]
            assert fired["labels"]["severity"] == "page"
            assert fired["annotations"]["runbook_url"].endswith("#lakehousedateunproven")

            result, checks = run_job("reconcile_dates", instance, quiet=True,
                                     partition_key=d.isoformat())
            assert result.success and all(c.passed for c in checks)
            wait_until(lambda: unproven("resolved"), "the proof alert resolved")
            assert has_data(stack, f"{proven} == 1")
    finally:
        hook.server.shutdown()
        daily.shutdown()
        daily.server_close()
