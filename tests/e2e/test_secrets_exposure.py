"""What every local user can read holds no secret while the runs work: the catch-up (classic, its
own driver JVM) and a daily run over Spark Connect, each `dagster job execute` in a fresh
process as the daemon launches them, with a Spark setting that is a secret (`SPARK_CONF_*`), the
Kafka SASL password (and its JAAS line) and a SPARK_REMOTE carrying the Connect server's token.
All the while no process's command line (`/proc/*/cmdline`) holds any of them, and no file under
the lakehouse root or the Dagster home that others may read does (files holding one are the
owner's alone: mode 0600)."""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO

from lakehouse.config.connect_token import read_token
from testkit.faults import _spawn, output

# A catch-up and a daily run in fresh processes, over the session's Connect server (shared with
# the other `long` tests): a few minutes, in `make test-long`.
pytestmark = [pytest.mark.long, pytest.mark.timeout(1800)]


def cmdlines_holding(needles: list[str]) -> dict[int, str]:
    """The processes whose command line holds one of `needles`: pid -> the needle."""
    found = {}
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = path.read_bytes().decode(errors="replace")
        except OSError:
            continue
        for needle in needles:
            if needle in text:
                found[int(path.parent.name)] = needle[:6] + "..."
    return found


class Files:
    """The files under some folders, each read once per (size, mtime): those others may read
    (any group or other permission) that hold a needle."""

    def __init__(self, roots: list[Path], needles: list[str]):
        self.roots, self.needles = roots, [n.encode() for n in needles]
        self.seen: dict[Path, tuple[int, int, int]] = {}
        self.exposed: dict[str, str] = {}
        self.read = 0

    def scan(self) -> None:
        for root in self.roots:
            for path in root.rglob("*"):
                try:
                    st = path.stat()
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    key = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
                    if self.seen.get(path) == key:
                        continue
                    self.seen[path] = key
                    if not st.st_mode & 0o077:
                        continue  # the owner's alone
                    data = path.read_bytes()
                    self.read += 1
                except OSError:
                    continue  # gone meanwhile (a temp file, a lock released)
                for needle in self.needles:
                    if needle in data:
                        self.exposed[str(path)] = f"mode {oct(key[2])}"


def executions(server_log: Path) -> int:
    """How many operations the Connect server has run (one log line each)."""
    return server_log.read_text(errors="replace").count("ExecuteHolder ExecuteKey")


def watched(args: list[str], env: dict[str, str], log: Path, needles: list[str],
            files: Files) -> dict[int, str]:
    """Runs `args` to its end, sampling every process's command line and the files meanwhile;
    the command lines that held a needle."""
    run = _spawn(args, env, log)
    on_cmdlines: dict[int, str] = {}
    while run.poll() is None:
        on_cmdlines.update(cmdlines_holding(needles))
        files.scan()
        time.sleep(0.5)
    files.scan()
    assert run.returncode == 0, output(run, 8000)
    text = output(run, 10**7)
    assert "RUN_SUCCESS" in text and "STEP_FAILURE" not in text, text[-6000:]
    return on_cmdlines


def test_no_secret_on_a_command_line_or_in_a_file_others_read(instance_env, spark_connect,
                                                              tmp_path):
    from testkit.generator import GeneratorConfig, generate, produce

    settings = instance_env
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "infra/dagster.yaml").read_text())
    end = (datetime.now(UTC) - timedelta(days=1)).replace(hour=20, minute=0, second=0,
                                                          microsecond=0)
    produce(settings, generate(GeneratorConfig(count=400, seed=21, end=end, keys=3,
                                               span=timedelta(hours=2))).records)

    spark_secret = "s3key-" + secrets.token_urlsafe(12)
    sasl_password = "sasl-" + secrets.token_urlsafe(12)
    token = read_token(spark_connect.state, spark_connect.port)
    needles = [spark_secret, sasl_password, token]
    base = {k: v for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_STATE_DIR", "SPARK_CONNECT_MODE_ENABLED")}
    env = {**base, "DAGSTER_HOME": str(home),
           # A secret Spark setting (a key the local filesystem root never uses) and Kafka
           # credentials the local PLAINTEXT broker ignores: every client is handed them.
           "SPARK_CONF_spark.hadoop.fs.s3a.secret.key": spark_secret,
           "KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": sasl_password,
           "KAFKA_SASL_JAAS_CONFIG": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                     f'required username="svc" password="{sasl_password}";'}
    files = Files([Path(settings.root.removeprefix("file://")), home], needles)
    job = [sys.executable, "-m", "dagster", "job", "execute", "-m", "orchestration.definitions"]

    seen = watched([*job, "-j", "stream_catch_up"], env, tmp_path / "catch_up.log", needles,
                   files)
    assert not seen, f"secrets on command lines during the catch-up: {seen}"
    # The daily run over Connect, SPARK_REMOTE carrying the token as a user's own URL would.
    remote = {**env, "SPARK_REMOTE": f"sc://localhost:{spark_connect.port}/;token={token}"}
    operations = executions(spark_connect.log)
    seen = watched([*job, "-j", "reconcile_dates", "--tags",
                    json.dumps({"dagster/partition": end.date().isoformat()})],
                   remote, tmp_path / "daily.log", needles, files)
    assert not seen, f"secrets on command lines during the daily run: {seen}"

    assert files.read > 10, "the scan read next to nothing: the runs wrote elsewhere?"
    assert not files.exposed, f"files others may read hold a secret: {files.exposed}"
    assert executions(spark_connect.log) > operations, "the daily run did not use Connect"
    for log in ("catch_up.log", "daily.log"):
        assert not any(n in (tmp_path / log).read_text(errors="replace") for n in needles)
