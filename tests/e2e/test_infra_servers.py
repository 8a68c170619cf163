"""The cluster stack's quick servers, started from the repo's own scripts on free ports in
throwaway folders: S3Proxy (signed S3 reads and writes, the bucket made at start) and the
PostgreSQL cluster behind Dagster's instance (password login, the database, the instance file).
A server that cannot start fails the test with its script's message. The Spark and three-broker
Kafka clusters take longer to start and are exercised by the cluster tests."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, free_port

from testkit.infra import infra_module

KEY_ID, SECRET = "infra-test", "infra-test-secret"


def script(path: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / path), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def started(done: subprocess.CompletedProcess, what: str) -> None:
    assert done.returncode == 0, f"{what} did not start: {done.stderr.strip() or done.stdout}"


def test_s3proxy_serves_signed_requests_on_its_bucket(tmp_path):
    from pyarrow import fs

    port, state = free_port(), str(tmp_path / "s3")
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
    args = ["--state-dir", state, "--port", str(port), "--bucket", "probe-bucket"]
    up = script("infra/s3/s3proxy.py", "up", *args, env=env)
    try:
        started(up, "S3Proxy")
        assert SECRET not in up.stdout + up.stderr
        again = script("infra/s3/s3proxy.py", "up", *args, env=env)
        assert again.returncode == 0 and "already running" in again.stdout

        def s3(secret: str):
            return fs.S3FileSystem(access_key=KEY_ID, secret_key=secret, scheme="http",
                                   endpoint_override=f"127.0.0.1:{port}", region="us-east-1")

        with s3(SECRET).open_output_stream("probe-bucket/a/b.txt") as out:
            out.write(b"hello")
        assert s3(SECRET).open_input_stream("probe-bucket/a/b.txt").read() == b"hello"
        listed = s3(SECRET).get_file_info(fs.FileSelector("probe-bucket", recursive=True))
        assert "probe-bucket/a/b.txt" in [i.path for i in listed]
        with pytest.raises(OSError, match="ACCESS_DENIED|403"):
            s3("wrong-secret").open_input_stream("probe-bucket/a/b.txt").read()
        assert SECRET not in (tmp_path / "s3" / "s3proxy.log").read_text(errors="replace")
    finally:
        down = script("infra/s3/s3proxy.py", "down", *args)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert script("infra/s3/s3proxy.py", "status", *args).returncode == 3


def test_postgres_holds_a_dagster_instance(monkeypatch):
    import psycopg2

    # As root the cluster runs as an unprivileged user, who must reach the folder: not under
    # pytest's tmp_path (its root is private to the current user).
    state = Path(tempfile.mkdtemp(prefix="lakehouse-pg-test-", dir="/tmp"))
    state.chmod(0o755)
    port = free_port()
    # No password given: the role's is generated at set-up into the owner-only secrets file.
    secrets_file = state / "secrets" / "local.env"
    env = {"DAGSTER_PG_USERNAME": "dagster", "DAGSTER_PG_PASSWORD": "",
           "LOCAL_SECRETS_FILE": str(secrets_file),
           "DAGSTER_PG_DB": "dagster_test", "DAGSTER_PG_HOST": "127.0.0.1",
           "DAGSTER_PG_PORT": str(port)}
    args = ["--state-dir", str(state / "pg"), "--port", str(port)]
    try:
        up = script("infra/postgres/pg.py", "up", *args, env=env)
        started(up, "PostgreSQL")
        assert oct(secrets_file.stat().st_mode & 0o777) == "0o600"
        password = infra_module("local_secrets.py").read(secrets_file)["DAGSTER_PG_PASSWORD"]
        assert len(password) >= 32 and password not in up.stdout + up.stderr
        again = script("infra/postgres/pg.py", "up", *args, env=env)
        assert again.returncode == 0 and "already running" in again.stdout
        env["DAGSTER_PG_PASSWORD"] = password
        with psycopg2.connect(host="127.0.0.1", port=port, user="dagster", password=password,
                              dbname="dagster_test") as conn, conn.cursor() as cur:
            cur.execute("SELECT inet_server_addr()::text")
            assert cur.fetchone()[0].startswith("127.0.0.1")
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=port, user="dagster", password="wrong",
                             dbname="dagster_test")

        from dagster import DagsterInstance

        home = state / "dagster_home"
        home.mkdir()
        shutil.copy(REPO / "infra/dagster-postgres.yaml", home / "dagster.yaml")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert instance.get_runs() == []
    finally:
        down = script("infra/postgres/pg.py", "down", *args)
        shutil.rmtree(state, ignore_errors=True)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr


def test_cluster_env_names_the_settings_the_pipeline_reads():
    from lakehouse.config.settings import Settings

    env = dict(line.split("=", 1) for line in (REPO / "infra/cluster.env").read_text().splitlines()
               if line.strip() and not line.startswith("#"))
    settings = Settings.from_env(env)
    assert settings.kafka_bootstrap_servers == env["KAFKA_BOOTSTRAP_SERVERS"]
    assert settings.spark_master == "spark://127.0.0.1:7077"
    assert settings.spark_driver_host == "127.0.0.1"
    assert env["LAKEHOUSE_ROOT"].startswith("s3a://lakehouse/")
    assert env["DAGSTER_INSTANCE"] == "postgres"
