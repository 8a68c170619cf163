"""A Spark setting that holds a secret (SPARK_CONF_<key> with a secret's name) reaches the driver
JVM through an owner-only properties file, not its command line: while a fresh process's
session runs, no process's command line (`/proc/*/cmdline`, what every local user reads) holds
it, the driver has it exactly, and the file is gone once the JVM has read it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lakehouse.config import spark_secrets

REPO = Path(__file__).resolve().parents[2]
# Characters a properties file escapes, in the value.
SECRET = "s3kr=t:9 #x\\y!z"
CHILD = """
import os
import sys
from lakehouse.config.settings import Settings
from spark_jobs.session import get_spark
spark = get_spark(Settings.from_env(), short_run=True)
got = spark.sparkContext.getConf().get("spark.hadoop.fs.s3a.secret.key")
want = os.environ["SPARK_CONF_spark.hadoop.fs.s3a.secret.key"]
print("seen" if got == want else f"differs: {got!r}", flush=True)
sys.stdin.readline()
"""


def cmdlines() -> dict[int, str]:
    out = {}
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out[int(path.parent.name)] = path.read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
    return out


def test_a_secret_setting_never_reaches_a_command_line(tmp_path):
    before = set(Path(tempfile.gettempdir()).glob("spark-secrets-*"))
    env = {**os.environ, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "SPARK_CONF_spark.hadoop.fs.s3a.secret.key": SECRET,
           "SPARK_CONF_spark.executor.memory": "1g"}  # a plain one stays a --conf
    env.pop("SPARK_REMOTE", None)
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        assert line == "seen", (line, child.stderr.read() if child.poll() is not None else "")
        lines = cmdlines()
        assert not [pid for pid, text in lines.items() if "s3kr=t" in text]
        assert any("spark.executor.memory=1g" in text for text in lines.values())
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(120)
    assert set(Path(tempfile.gettempdir()).glob("spark-secrets-*")) == before  # removed


def test_the_secret_file_is_its_owners_alone(tmp_path):
    plain, secret = spark_secrets.split({"spark.ssl.keyStorePassword": "p", "spark.a": "1",
                                         "spark.hadoop.fs.s3a.access.key": "k",
                                         "spark.authenticate.secret": "s"})
    assert plain == {"spark.a": "1"} and len(secret) == 3
    path = spark_secrets.write_properties(secret, tmp_path / "s.properties")
    assert path.stat().st_mode & 0o777 == 0o600
    with spark_secrets.properties_file(secret) as held:
        assert held.stat().st_mode & 0o777 == 0o600
        assert held.parent.stat().st_mode & 0o777 == 0o700
    assert not held.exists()
