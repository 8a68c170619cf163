"""The local KRaft broker: start, idempotent start, status, stop, and clear failures."""

import os
import socket
import subprocess
import sys

import pytest
from conftest import REPO, free_port

from testkit.infra import broker_module

broker = broker_module()


def run(*args):
    """broker.py with `args`; its controller on --port + 1 (free_port(span=2) checked it)."""
    if "--port" in args:
        args = (*args, "--controller-port", str(int(args[args.index("--port") + 1]) + 1))
    return subprocess.run([sys.executable, str(REPO / "infra/kafka/broker.py"), *args],
                          capture_output=True, text=True, timeout=180)


def test_up_is_idempotent_and_down_stops_it(tmp_path):
    port = free_port(span=101)  # the controller: port + 1 here, then the default port + 100
    state = str(tmp_path / "k")
    first = run("up", "--state-dir", state, "--port", str(port))
    try:
        assert first.returncode == 0, first.stderr
        assert f"Kafka up on 127.0.0.1:{port}" in first.stdout
        assert broker._answers(port)
        again = run("up", "--state-dir", state, "--port", str(port))
        assert again.returncode == 0 and "already running" in again.stdout
        status = run("status", "--state-dir", state, "--port", str(port))
        assert status.returncode == 0 and "running" in status.stdout
    finally:
        down = run("down", "--state-dir", state, "--port", str(port))
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not broker.port_open(port)
    assert run("status", "--state-dir", state, "--port", str(port)).returncode == 3
    # Restart on the formatted storage works (format happens once), with the controller on its
    # default port (the broker's + 100) while the port after the broker's is held, as Debian's
    # Alertmanager holds 9093 after Kafka's 9092.
    with socket.socket() as held:
        # (Address reuse: the first broker's controller connections may linger in TIME_WAIT;
        # a listening socket still keeps any other listener off the port.)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        again = subprocess.run([sys.executable, str(REPO / "infra/kafka/broker.py"), "up",
                                "--state-dir", state, "--port", str(port)],
                               capture_output=True, text=True, timeout=180, env={
                                   k: v for k, v in os.environ.items()
                                   if k != "KAFKA_CONTROLLER_PORT"})
        try:
            assert again.returncode == 0, again.stderr
            assert broker._answers(port) and broker.port_open(port + 100)
        finally:
            run("down", "--state-dir", state, "--port", str(port))


def test_port_taken_is_a_one_line_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = run("up", "--state-dir", str(tmp_path / "k"), "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert f"port {port} is taken by pid {os.getpid()} (" in done.stderr  # its holder
    assert "KAFKA_BOOTSTRAP_SERVERS" in done.stderr  # and the variable that moves it


def test_missing_jars_say_run_make_setup(tmp_path, monkeypatch):
    monkeypatch.setattr(broker, "JARS", tmp_path / "none")
    b = broker.Broker(tmp_path / "k", free_port())
    with pytest.raises(broker.BrokerError, match="make setup"):
        b.up()


def test_missing_java_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    b = broker.Broker(tmp_path / "k", free_port())
    with pytest.raises(broker.BrokerError, match="java not found"):
        b.up()


def test_storage_formats_with_a_cluster_id_that_starts_with_a_dash(tmp_path, monkeypatch):
    """One random id in 64 starts with '-'; CI once failed on exactly that."""
    assert not any(broker.new_cluster_id().startswith("-") for _ in range(2000))
    monkeypatch.setattr(broker, "new_cluster_id", lambda: "-" + "A" * 21)
    b = broker.Broker(tmp_path / "k", free_port())
    b.state_dir.mkdir(parents=True)
    b._render_config()
    b._format_once(b._java(), b._classpath())
    meta = (b.data_dir / "meta.properties").read_text()
    assert "cluster.id=-" + "A" * 21 in meta

