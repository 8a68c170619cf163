"""`make test-cluster`: one streaming service for two pipelines (the default and the order spec's)
on the scale-out stack: its Spark application on the standalone cluster, the root on S3Proxy
through s3a://, the writer locks in PostgreSQL, three brokers. Both pipelines ingest every
record once and the default's aggregates are exact; SIGTERM stops both cleanly."""

from __future__ import annotations

import os
import signal
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from test_service_pipelines import default_aggregates, default_expected, positions, rows

from lakehouse.config.settings import Settings
from lakehouse.specs.pipeline import load_spec
from testkit.faults import output, running_service, wait_for
from testkit.generator import GeneratorConfig, generate, produce
from testkit.reference import VALID_KINDS
from testkit.runs import stop_local_spark
from testkit.spec_events import generate_for_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_two_pipelines_in_one_service_on_the_cluster(tmp_path):
    stop_local_spark()  # a session of this process would hold the cluster's cores
    env = dict(os.environ)
    if not (env.get("LAKEHOUSE_ROOT", "").startswith("s3a://")
            and env.get("SPARK_MASTER", "").startswith("spark://")):
        pytest.fail("run this module through `make test-cluster`")
    run = uuid.uuid4().hex[:8]
    root = env["LAKEHOUSE_ROOT"].rstrip("/").rsplit("/run-", 1)[0]
    spec = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    spec["topic"] = f"orders-{run}"
    spec_path = tmp_path / "orders.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    env.update({"LAKEHOUSE_ROOT": f"{root}/service-{run}", "EVENTS_TOPIC": f"svc-{run}",
                "PIPELINES": str(spec_path), "STREAM_TRIGGER_INTERVAL": "2 seconds",
                "METRICS_PORT": str(free_port())})
    default = Settings.from_env(env)
    orders = load_spec(spec_path).settings(default, env)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = {
        "default": generate(GeneratorConfig(count=1200, seed=21, end=end, keys=5,
                                            span=timedelta(hours=1), late_fraction=0.05)).records,
        "orders": generate_for_spec(load_spec(spec_path), GeneratorConfig(
            count=800, seed=22, end=end, span=timedelta(hours=1), duplicate_fraction=0.04,
            malformed_fraction=0.03)).records}
    settings = {"default": default, "orders": orders}

    def valid(n):
        return sum(1 for r in records[n] if r.kind in VALID_KINDS)

    with running_service(env, tmp_path / "service.log") as svc:
        for n, r in records.items():
            produce(settings[n], r)
        wait_for(lambda: all(rows(s, "bronze_events") >= valid(n) for n, s in settings.items()),
                 svc, timeout=600, what="both pipelines ingested")
        wait_for(lambda: default_aggregates(default) == default_expected(default,
                                                                         records["default"]),
                 svc, timeout=300, what="the default pipeline's aggregates exact")
        log = output(svc, 200_000)
        assert "streaming 2 pipeline(s) in one Spark application: default, orders" in log, log
        svc.send_signal(signal.SIGTERM)
        svc.wait(180)
        assert svc.returncode == 0, output(svc)
    for n, s in settings.items():
        got = positions(s)
        assert max(got.values()) == 1, n
        assert rows(s, "bronze_events") == valid(n), n
        assert sum(got.values()) == len(records[n]), n
