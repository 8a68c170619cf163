"""The fast subset of `make drills` (drill 6, authentication): a broker of the test's own with a
SASL_PLAINTEXT/SCRAM-SHA-512 listener; the right credentials produce and consume with
confluent-kafka; a `stream_catch_up` run with a wrong password fails fast with an error naming
authentication, makes a bounded number of attempts (none after it failed) and leaks the secret
nowhere: not in the exception, the captured output, or the run's Dagster event log."""

import os
import secrets
import time
import uuid

import pytest
from conftest import free_port, run_job

from testkit.run_report import event_log_text, failure_text

MAX_FAILED_HANDSHAKES = 30  # the drill's bound (bench/drills/auth.py)


@pytest.fixture(scope="module")
def sasl(tmp_path_factory):
    from testkit.infra import sasl_broker_module

    SaslBroker = sasl_broker_module().SaslBroker  # noqa: N806

    user, password = "lakehouse", "right-" + secrets.token_urlsafe(16)
    broker = SaslBroker(tmp_path_factory.mktemp("sasl"), free_port(), free_port(),
                        users={user: password})
    broker.up()
    try:
        yield broker, user, password
    finally:
        broker.down()
        from lakehouse.kafka.admin import forget_admins

        forget_admins(broker.bootstrap)  # no reconnects to a broker that is gone


def test_the_users_credentials_are_on_no_command_line_when_the_storage_is_formatted(
        tmp_path, monkeypatch):
    """The salted passwords the format adds (enough to log in as the user) reach the JVM in an
    owner-only argument file that is gone afterwards: the format's argv holds none of them."""
    import subprocess

    from testkit.infra import sasl_broker_module

    module = sasl_broker_module()
    password = "fmt-" + secrets.token_urlsafe(16)
    broker = module.SaslBroker(tmp_path / "b", free_port(), free_port(), users={"u": password})
    broker.state_dir.mkdir(parents=True, exist_ok=True)
    broker._render_config()
    launched, real_run = [], subprocess.run

    def spy(args, **kw):  # the real format, its argv and argument file recorded
        launched.append(list(args))
        files = [a[1:] for a in args if str(a).startswith("@")]
        launched.append([oct(os.stat(f).st_mode & 0o777) for f in files])
        launched.append([open(f).read() for f in files])
        return real_run(args, **kw)

    monkeypatch.setattr(module.subprocess, "run", spy)
    broker._format_once(broker._java(), broker._classpath())
    argv, modes, contents = launched
    assert (broker.data_dir / "meta.properties").exists()  # formatted
    assert modes == ["0o600"] and "saltedpassword=" in contents[0] and "name=u," in contents[0]
    assert not any("salt" in a or "scram" in a.lower() for a in argv), argv
    assert not (broker.state_dir / "format.args").exists()


def test_right_credentials_produce_and_consume(sasl, monkeypatch):
    from confluent_kafka import Consumer

    from lakehouse.config.settings import Settings
    from testkit.generator import Record, produce

    broker, user, password = sasl
    for k, v in broker.client_env(user, password).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EVENTS_TOPIC", f"sasl-{uuid.uuid4().hex[:8]}")
    settings = Settings.from_env()
    values = [f'{{"n": {i}}}'.encode() for i in range(5)]
    assert produce(settings, [Record(None, v, "event") for v in values]) == 5
    consumer = Consumer({**settings.client_config, "group.id": "drills-fast",
                         "auto.offset.reset": "earliest", "log_level": 3})
    consumer.subscribe([settings.events_topic])
    got, deadline = [], time.monotonic() + 30
    try:
        while len(got) < 5 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)


def sockets_to(port: int) -> list[str]:
    """Inodes of this process's open TCP sockets to `port` (Linux /proc: fds -> net/tcp)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()  # sl local rem st ... inode (column 9)
                if int(cols[2].rsplit(":", 1)[1], 16) == port and cols[9] in mine:
                    found.append(cols[9])
    return found


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_wrong_credentials_fail_fast_naming_authentication_without_leaking(
        sasl, monkeypatch, tmp_path, capfd):
    from dagster import DagsterInstance

    broker, user, password = sasl
    wrong = "wrong-" + secrets.token_urlsafe(16)
    env = broker.client_env(user, password)
    env["KAFKA_SASL_PASSWORD"] = wrong
    env["KAFKA_SASL_JAAS_CONFIG"] = env["KAFKA_SASL_JAAS_CONFIG"].replace(password, wrong)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EVENTS_TOPIC", f"sasl-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    from lakehouse.kafka.admin import forget_admins

    forget_admins(broker.bootstrap)  # the right credentials' clients of another test, if any
    wait_until(lambda: not sockets_to(broker.port), "earlier clients' sockets to close")
    before = broker.failed_authentications()
    instance = DagsterInstance.ephemeral()
    t0 = time.monotonic()
    result, _ = run_job("stream_catch_up", instance)
    took = time.monotonic() - t0
    attempts = broker.failed_authentications() - before

    assert not result.success
    error = failure_text(result)
    assert "KafkaAuthenticationFailed" in error and "authentication failed" in error.lower()
    assert took < 60, took
    assert 0 < attempts <= MAX_FAILED_HANDSHAKES
    # The rejected clients were closed (no socket of this process tree to the broker is left),
    # so nothing can reconnect after the failure.
    wait_until(lambda: not sockets_to(broker.port), "the rejected clients' sockets to close")
    assert broker.failed_authentications() - before == attempts
    out, err = capfd.readouterr()
    texts = {"exception": error, "stdout": out, "stderr": err,
             "event log": event_log_text(instance, result.run_id)}
    assert user in error  # names who was rejected, never the password
    assert [name for name, text in texts.items() if wrong in text or password in text] == []


def test_a_spec_with_its_own_credentials_runs_on_its_own_brokers(sasl, kafka_bootstrap,
                                                                 monkeypatch, tmp_path):
    """The deployment's brokers are the suite's plain one, with credentials of their own set; a
    spec names the SASL broker and brings its own credentials (secret_env): its catch-up runs
    there, and the deployment's credentials are never offered to it (no failed handshake)."""
    import yaml

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.tables.reads import read
    from orchestration.definitions import definitions_for
    from testkit.generator import GeneratorConfig, generate, produce
    from testkit.infra import sasl_broker_module

    broker, user, password = sasl
    spec = {"name": "own", "topic": f"own-{uuid.uuid4().hex[:8]}",
            "fields": {"event_id": "string", "key": "string", "event_time": "timestamp",
                       "value": "decimal(38,6)"},
            "event_id": "event_id", "event_time": {"field": "event_time"},
            "dimensions": ["key"], "measures": [{"field": "value"}],
            "kafka_options": {"bootstrap.servers": broker.bootstrap,
                              "security.protocol": "SASL_PLAINTEXT",
                              "sasl.mechanism": sasl_broker_module().MECHANISM,
                              "sasl.username": user},
            "secret_env": {"sasl.password": "OWN_SASL_PASSWORD",
                           "sasl.jaas.config": "OWN_SASL_JAAS_CONFIG"}}
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(spec))
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_SASL_USERNAME": "deployment",
                 "KAFKA_SASL_PASSWORD": "deployment-" + secrets.token_urlsafe(8),
                 "OWN_SASL_PASSWORD": password,
                 "OWN_SASL_JAAS_CONFIG": sasl_broker_module().jaas(user, password),
                 "LAKEHOUSE_ROOT": str(tmp_path / "lake"), "PIPELINES": str(path)}.items():
        monkeypatch.setenv(k, v)
    before = broker.failed_authentications()
    defs = definitions_for(spec_pipelines(), LakehouseResource())
    settings = defs.resources["lakehouse"].settings_for("own")
    assert settings.client_config["bootstrap.servers"] == broker.bootstrap
    assert "deployment" not in str(settings.client_config)
    ensure_topic(settings)
    records = generate(GeneratorConfig(count=40, seed=8, keys=2, late_fraction=0,
                                       duplicate_fraction=0, malformed_fraction=0)).records
    assert produce(settings, records) == len(records)
    from dagster import DagsterInstance

    from testkit.runs import run_in

    result, _ = run_in(defs, "own__stream_catch_up", DagsterInstance.ephemeral())
    assert result.success
    assert read(settings, "bronze_events").num_rows == len(records)
    assert broker.failed_authentications() == before
