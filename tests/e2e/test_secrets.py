"""Secrets never leave the settings: a catch-up run with Kafka credentials and an object-store
key in the environment leaves no trace of them in the repr, the run's event log and config in
Dagster's run storage, or anything the process printed (Python, the JVM, librdkafka)."""

from dagster import DagsterInstance
from dagster._serdes import serialize_value

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import ensure_topic
from testkit.generator import GeneratorConfig, generate, produce

SECRET = "pw-9f3b1c-never-printed"


def test_no_secret_in_repr_run_storage_or_output(instance_env, monkeypatch, capfd, tmp_path):
    from tests.conftest import run_job

    settings = instance_env
    ensure_topic(settings)
    produce(settings, generate(GeneratorConfig(count=50, seed=3, keys=2)).records)
    # Credentials the local (PLAINTEXT) broker ignores, but every client is handed them.
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KAFKA_SASL_JAAS_CONFIG", "org.apache.kafka.common.security.plain."
                       f'PlainLoginModule required username="svc" password="{SECRET}";')
    monkeypatch.setenv("SPARK_CONF_spark.hadoop.fs.s3a.secret.key", SECRET)
    configured = Settings.from_env()
    assert configured.client_config["sasl.password"] == SECRET  # handed on...
    assert SECRET not in repr(configured)  # ...never shown

    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    result, _ = run_job("stream_catch_up", instance)
    assert result.success
    run = instance.get_run_by_id(result.run_id)
    stored = serialize_value(run) + "".join(serialize_value(e) for e in
                                            instance.all_logs(result.run_id))
    assert SECRET not in stored
    printed = capfd.readouterr()
    assert SECRET not in printed.out and SECRET not in printed.err
