"""Shared fixtures: a real Kafka broker, one SparkSession for the suite, isolated instances."""

from __future__ import annotations

import importlib.util
import os
import socket
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")


def load_broker_module():
    spec = importlib.util.spec_from_file_location("broker", REPO / "infra/kafka/broker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    """The broker at KAFKA_BOOTSTRAP_SERVERS when it answers (make test starts one), else a
    broker of the suite's own on free ports, stopped at the end."""
    broker = load_broker_module()
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    port = int(configured.split(",")[0].rsplit(":", 1)[1])
    if broker._answers(port):
        yield f"127.0.0.1:{port}"
        return
    own = broker.Broker(tmp_path_factory.mktemp("kafka"), free_port(), free_port())
    own.up()
    try:
        yield own.bootstrap
    finally:
        own.down()


@pytest.fixture()
def instance_env(tmp_path, kafka_bootstrap, monkeypatch):
    """An independent pipeline instance: its own LAKEHOUSE_ROOT and topic."""
    topic = f"test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("EVENTS_TOPIC", topic)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    from lakehouse.settings import Settings

    return Settings.from_env()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from lakehouse.settings import Settings
    from spark_jobs.session import get_spark

    root = tmp_path_factory.mktemp("spark")
    session = get_spark(Settings.from_env({"LAKEHOUSE_ROOT": str(root)}))
    yield session
    session.stop()
