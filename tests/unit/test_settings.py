import os
from datetime import timedelta

import pytest

from lakehouse.config import storage
from lakehouse.config.settings import Settings, SettingsError, parse_duration, spark_interval


def test_defaults_match_the_contract():
    s = Settings.from_env({})
    assert s.kafka_bootstrap_servers == "localhost:9092"
    assert s.events_topic == "events"
    assert s.lakehouse_root == "./.lakehouse"
    assert s.window_size == timedelta(minutes=1)
    assert s.watermark_delay == timedelta(seconds=30)
    assert s.correction_horizon == timedelta(days=7)
    assert s.timestamp_policy == "event_time"
    assert s.spark_master == "local[*]"
    # Sized for the machine, never Spark's 200.
    assert s.shuffle_partitions == max(2, 2 * (os.cpu_count() or 2))


def test_env_overrides_are_parsed():
    s = Settings.from_env({
        "KAFKA_BOOTSTRAP_SERVERS": "a:1,b:2", "EVENTS_TOPIC": "meters",
        "LAKEHOUSE_ROOT": "/data/lh", "WINDOW_SIZE": "5 minutes", "WATERMARK_DELAY": "2 minutes",
        "CORRECTION_HORIZON": "3 days", "TIMESTAMP_POLICY": "kafka_timestamp",
        "SPARK_MASTER": "spark://h:7077",
    })
    assert (s.window_size, s.watermark_delay, s.correction_horizon) == (
        timedelta(minutes=5), timedelta(minutes=2), timedelta(days=3))
    assert s.timestamp_policy == "kafka_timestamp"
    assert s.table_path("bronze_events") == "/data/lh/bronze_events"
    assert s.spark_kafka_options["kafka.bootstrap.servers"] == "a:1,b:2"


def test_lakehouse_root_is_a_uri_on_every_store():
    """s3a:// stays a URI (a Path would make it `s3a:/b`); delta-rs gets s3:// and non-secret
    options from the same env; Spark gets s3a settings; no secret appears in either."""
    env = {"LAKEHOUSE_ROOT": "s3a://bucket/lake/", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
           "AWS_ACCESS_KEY_ID": "AKIDSECRET", "AWS_SECRET_ACCESS_KEY": "shh-secret"}
    s = Settings.from_env(env)
    assert s.root == "s3a://bucket/lake" and s.local_root is None
    assert s.table_path("bronze_events") == "s3a://bucket/lake/bronze_events"
    assert s.checkpoint_path("bronze") == "s3a://bucket/lake/_checkpoints/bronze"
    uri, options = storage.delta_rs_uri(s.table_path("x")), storage.delta_rs_options(s.root, env)
    assert uri == "s3://bucket/lake/x"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ALLOW_HTTP"] == "true"
    conf = storage.s3a_spark_conf(s.root, env)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert not any("SECRET" in v.upper() or "shh" in v for v in [*options.values(), *conf.values()])

    local = Settings.from_env({"LAKEHOUSE_ROOT": "file:///data/lh"})
    assert local.root == "/data/lh" and str(local.local_root) == "/data/lh"
    relative = Settings.from_env({"LAKEHOUSE_ROOT": "lh"})
    assert relative.root == os.path.abspath("lh")
    assert storage.s3a_spark_conf(relative.root) == {} and storage.delta_rs_options("/x") == {}


@pytest.mark.parametrize("text,expected", [
    ("30 seconds", timedelta(seconds=30)), ("1 minute", timedelta(minutes=1)),
    ("7 days", timedelta(days=7)), ("500 ms", timedelta(milliseconds=500)),
    ("2 hours", timedelta(hours=2)), ("10s", timedelta(seconds=10)),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("env,needle", [
    ({"WINDOW_SIZE": "soon"}, "WINDOW_SIZE='soon' is not a duration"),
    ({"WINDOW_SIZE": "7 minutes"}, "divide a day"),
    ({"WATERMARK_DELAY": "-5 seconds"}, "WATERMARK_DELAY"),
    ({"TIMESTAMP_POLICY": "wallclock"}, "TIMESTAMP_POLICY='wallclock': input should be "
                                        "'event_time' or 'kafka_timestamp'"),
    ({"KAFKA_BOOTSTRAP_SERVERS": "nohostport"}, "host:port"),
    ({"EVENTS_TOPIC": "bad topic!"}, "not a valid Kafka topic"),
    ({"CORRECTION_HORIZON": "10 seconds"}, "at least WATERMARK_DELAY"),
    ({"MAX_EVENT_BYTES": "0"}, "MAX_EVENT_BYTES='0': input should be greater than 0"),
    ({"TOPIC_PARTITIONS": "four"}, "TOPIC_PARTITIONS='four': input should be a valid integer"),
    ({"METRICS_PORT": "70000"}, "METRICS_PORT='70000': input should be less than or equal to 65535"),
    ({"SPARK_UI": "maybe"}, "SPARK_UI='maybe': input should be a valid boolean"),
    ({"CATCH_UP_CRON": "every 5 minutes"}, "CATCH_UP_CRON='every 5 minutes' must be a 5-field cron"),
    ({"PARTITIONS_START": "2024-12-31"}, "PARTITIONS_START=2024-12-31 is before LAKEHOUSE_START_DATE"),
    ({"LAKEHOUSE_START_DATE": "21/11/2026"}, "YYYY-MM-DD"),
])
def test_bad_values_fail_with_a_clear_message(env, needle):
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(").replace("'", "'")):
        Settings.from_env(env)


def test_kafka_security_passes_through_to_spark_and_confluent():
    s = Settings.from_env({
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "PLAIN",
        "KAFKA_SASL_JAAS_CONFIG": "org.apache.kafka.common.security.plain.PlainLoginModule x;",
        "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p",
        "KAFKA_SSL_CA_LOCATION": "/ca.pem",
    })
    spark = s.spark_kafka_options
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert spark["kafka.sasl.mechanism"] == "PLAIN"
    assert "kafka.sasl.jaas.config" in spark and "kafka.sasl.username" not in spark
    client = s.client_config
    assert client["security.protocol"] == "SASL_SSL"
    assert client["sasl.username"] == "u" and client["ssl.ca.location"] == "/ca.pem"
    assert "sasl.jaas.config" not in client


def test_secrets_stay_out_of_the_repr():
    secret = "s3cr3t-Pa55"
    s = Settings.from_env({
        "KAFKA_SASL_PASSWORD": secret,
        "KAFKA_SASL_JAAS_CONFIG": f'ScramLoginModule required username="u" password="{secret}";',
        "SPARK_CONF_spark.hadoop.fs.s3a.secret.key": secret,
    })
    assert s.client_config["sasl.password"] == secret  # still passed on
    assert secret not in repr(s) and secret not in str(s)


def test_the_lock_url_is_a_secret_and_every_bad_variable_is_named():
    s = Settings.from_env({"LAKEHOUSE_LOCK_URL": "postgresql://u:pw-123@db/locks"})
    assert s.lock_dsn == "postgresql://u:pw-123@db/locks" and "pw-123" not in repr(s)
    assert Settings.from_env({"LAKEHOUSE_LOCK_URL": ""}).lock_dsn is None
    with pytest.raises(SettingsError) as bad:
        Settings.from_env({"WINDOW_SIZE": "soon", "METRICS_PORT": "0", "EVENTS_TOPIC": "a b"})
    assert all(name in str(bad.value) for name in ("WINDOW_SIZE", "METRICS_PORT", "EVENTS_TOPIC"))


def test_the_resource_reads_the_environment_once(monkeypatch):
    from assets.resources import LakehouseResource

    monkeypatch.setenv("EVENTS_TOPIC", "first")
    resource = LakehouseResource()
    assert resource.settings.events_topic == "first"
    monkeypatch.setenv("EVENTS_TOPIC", "second")
    assert resource.settings is resource.settings and resource.settings.events_topic == "first"
    assert LakehouseResource().settings.events_topic == "second"  # a new resource reads it again


def test_the_stream_reads_committed_records_only():
    assert Settings.from_env({}).spark_kafka_options["kafka.isolation.level"] == "read_committed"
    s = Settings.from_env({"KAFKA_ISOLATION_LEVEL": "read_uncommitted"})
    assert s.spark_kafka_options["kafka.isolation.level"] == "read_uncommitted"
    # A consumer setting: never handed to the producers and admin clients.
    assert "isolation.level" not in s.client_config


def test_spark_interval_is_exact():
    assert spark_interval(timedelta(seconds=30)) == "30 seconds"
    assert spark_interval(timedelta(milliseconds=1500)) == "1500 milliseconds"


def test_spark_pass_through_and_driver_host():
    from spark_jobs.session import avro_limits, spark_conf

    s = Settings.from_env({"SPARK_CONF_SPARK_EXECUTOR_MEMORY": "3g",
                           "SPARK_CONF_spark.executor.extraJavaOptions": "-Dx=1",
                           "SPARK_DRIVER_HOST": "10.1.2.3"})
    assert s.spark_conf_overrides == {"spark.executor.memory": "3g",
                                      "spark.executor.extraJavaOptions": "-Dx=1"}
    conf = spark_conf(s, class_archive=False)
    assert conf["spark.executor.memory"] == "3g"
    limits = avro_limits(s)
    assert limits == ("-Dorg.apache.avro.limits.string.maxLength=65536 "
                      "-Dorg.apache.avro.limits.bytes.maxLength=65536 "
                      "-Dorg.apache.avro.limits.collectionItems.maxLength=65536")
    assert conf["spark.executor.extraJavaOptions"] == f"-Dx=1 -Duser.timezone=UTC {limits}"
    assert conf["spark.driver.extraJavaOptions"] == f"-Duser.timezone=UTC {limits}"
    assert conf["spark.driver.host"] == "10.1.2.3"
    assert not s.shuffle_partitions_explicit
    assert Settings.from_env({"SPARK_SHUFFLE_PARTITIONS": "6"}).shuffle_partitions_explicit


def test_a_driver_maps_the_class_archive_only_where_its_class_path_is_the_archived_one(
        monkeypatch, tmp_path):
    from spark_jobs import session

    monkeypatch.setattr(session, "CLASS_ARCHIVES", tmp_path)
    local = Settings.from_env({})
    driver = "spark.driver.extraJavaOptions"
    assert "SharedArchiveFile" not in session.spark_conf(local)[driver]  # none dumped yet
    archive = session.class_archive_path()
    assert archive.parent == tmp_path and archive.name.startswith("driver-")
    archive.write_bytes(b"x")
    conf = session.spark_conf(local, short_run=True)
    assert conf[driver] == (f"{session.SHORT_RUN_JAVA_OPTIONS} -XX:SharedArchiveFile={archive} "
                            f"-Duser.timezone=UTC {session.avro_limits(local)}")
    assert "SharedArchiveFile" not in conf["spark.executor.extraJavaOptions"]
    assert "SharedArchiveFile" not in session.spark_conf(local, class_archive=False)[driver]
    # Another class path than the archived one: an s3a:// root's jars, a deployment's own.
    extra = Settings.from_env({"SPARK_CONF_spark.driver.extraClassPath": "/opt/x.jar"})
    assert "SharedArchiveFile" not in session.spark_conf(extra)[driver]
    monkeypatch.setattr(session, "object_store_classpath",
                        lambda settings: {"spark.driver.extraClassPath": "/opt/aws.jar"})
    assert "SharedArchiveFile" not in session.spark_conf(local)[driver]
    # Another jar set names another archive: a stale one is never offered.
    monkeypatch.setattr(session, "spark_jars", lambda: ["/j/delta-spark_2.13-9.9.9.jar"])
    assert session.class_archive_path() != archive


def test_shuffle_blocks_are_compressed_only_where_they_cross_a_network():
    from spark_jobs.session import spark_conf

    assert spark_conf(Settings.from_env({}))["spark.shuffle.compress"] == "false"
    cluster = spark_conf(Settings.from_env({"SPARK_MASTER": "spark://127.0.0.1:7077"}))
    assert "spark.shuffle.compress" not in cluster  # Spark's default: compressed
    forced = Settings.from_env({"SPARK_CONF_SPARK_SHUFFLE_COMPRESS": "true"})
    assert spark_conf(forced)["spark.shuffle.compress"] == "true"


def test_run_config_overrides_are_validated_like_the_environment(monkeypatch):
    from assets.resources import LakehouseResource

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-a:9092")
    assert LakehouseResource(events_topic="meters").settings.events_topic == "meters"
    with pytest.raises(SettingsError, match="EVENTS_TOPIC"):
        _ = LakehouseResource(events_topic="no spaces/allowed").settings
    with pytest.raises(SettingsError, match="KAFKA_BOOTSTRAP_SERVERS"):
        _ = LakehouseResource(kafka_bootstrap_servers="not a broker").settings
    # Without credentials a run may use another broker (tests, a local stack)...
    assert LakehouseResource(kafka_bootstrap_servers="kafka-b:9092").settings \
        .kafka_bootstrap_servers == "kafka-b:9092"
    # ...with them it may not: they would be sent to it.
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cr3t-pw")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "PLAIN")
    with pytest.raises(SettingsError, match="may not be overridden") as refused:
        _ = LakehouseResource(kafka_bootstrap_servers="evil:9092").settings
    assert "s3cr3t-pw" not in str(refused.value)
    assert LakehouseResource(events_topic="meters").settings.kafka_bootstrap_servers == "kafka-a:9092"


def test_spark_config_of_a_run_is_limited_to_sizes():
    from pydantic import ValidationError

    from assets.resources import LakehouseResource, SparkResource

    ok = SparkResource(lakehouse=LakehouseResource(),
                       spark_config={"spark.executor.memory": "2g",
                                     "spark.sql.shuffle.partitions": "8"})
    assert ok.spark_config["spark.executor.memory"] == "2g"
    for key in ("spark.jars", "spark.driver.extraJavaOptions", "spark.hadoop.fs.s3a.endpoint"):
        with pytest.raises(ValidationError, match=key.replace(".", r"\.")):
            SparkResource(lakehouse=LakehouseResource(), spark_config={key: "x"})


def test_a_connect_urls_token_is_never_shown():
    """SPARK_REMOTE may carry `;token=`: kept out of the settings' repr, masked where the URL is
    printed, and a bad value's error names the variable without it."""
    from lakehouse.config.settings import remote_shown

    url = "sc://spark.example.com:443/;use_ssl=true;token=tok-5e1f;user_id=me"
    settings = Settings.from_env({"SPARK_REMOTE": url})
    assert settings.spark_remote == url and "tok-5e1f" not in repr(settings)
    assert remote_shown(url) == "sc://spark.example.com:443/;use_ssl=true;token=***;user_id=me"
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"SPARK_REMOTE": "http://x/;token=tok-5e1f"})
    assert "SPARK_REMOTE" in str(refused.value) and "tok-5e1f" not in str(refused.value)


@pytest.mark.parametrize("raw, want", [("true", "true"), ("No", "false"), ("0", "false"),
                                       (" yes ", "true"), ("ture", None)])
def test_an_object_stores_path_style_is_a_boolean_or_an_error(raw, want):
    from lakehouse.config.storage import delta_rs_options, s3a_spark_conf

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_S3_PATH_STYLE": raw}
    if want is None:
        with pytest.raises(ValueError, match="AWS_S3_PATH_STYLE='ture' must be true or false"):
            s3a_spark_conf("s3a://b/lake", env)
        with pytest.raises(ValueError, match="must be true or false"):
            delta_rs_options("s3a://b/lake", env)
        return
    assert s3a_spark_conf("s3a://b/lake", env)["spark.hadoop.fs.s3a.path.style.access"] == want
    assert ("AWS_S3_ADDRESSING_STYLE" in delta_rs_options("s3a://b/lake", env)) == (want == "true")
