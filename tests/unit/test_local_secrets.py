"""The local stack's generated secrets (infra/local_secrets.py): made once per checkout in an
owner-only file, kept from then on, overridden by the environment, and in no file of the repo
(the PostgreSQL and S3Proxy scripts read them: tests/e2e/test_infra_servers.py)."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

from testkit.infra import infra_module

REPO = Path(__file__).resolve().parents[2]


def test_the_secrets_are_generated_once_in_an_owner_only_file(tmp_path, monkeypatch):
    secrets = infra_module("local_secrets.py")
    file = tmp_path / "state" / "local.env"
    monkeypatch.setenv("LOCAL_SECRETS_FILE", str(file))
    for key in secrets.KEYS:
        monkeypatch.delenv(key, raising=False)
    first = secrets.ensure()
    assert set(secrets.KEYS) <= set(first)
    assert all(len(v) >= 32 and re.fullmatch(r"[\w-]+", v) for v in first.values())
    assert len(set(first.values())) == len(first)  # one value per key
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
    assert secrets.ensure() == first  # kept: a server set up with a password keeps it
    assert secrets.value("DAGSTER_PG_PASSWORD") == first["DAGSTER_PG_PASSWORD"]
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "from-the-environment")
    assert secrets.value("DAGSTER_PG_PASSWORD") == "from-the-environment"

    file.chmod(0o644)  # widened by hand: narrowed again, the values kept
    assert secrets.ensure() == first and stat.S_IMODE(file.stat().st_mode) == 0o600


def test_the_cli_prints_the_path_and_never_a_value(tmp_path):
    file = tmp_path / "local.env"
    done = subprocess.run([sys.executable, str(REPO / "infra/local_secrets.py"), "ensure"],
                          capture_output=True, text=True, timeout=30,
                          env={"LOCAL_SECRETS_FILE": str(file), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == str(file), done.stderr
    values = list(infra_module("local_secrets.py").read(file).values())
    assert values and not any(v in done.stdout + done.stderr for v in values)


def test_no_file_of_the_repo_holds_a_password_of_the_local_servers():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    cluster_env = (REPO / "infra/cluster.env").read_text()
    settings = dict(line.split("=", 1) for line in cluster_env.splitlines()
                    if line.strip() and not line.startswith("#"))
    assert "AWS_SECRET_ACCESS_KEY" not in settings and "DAGSTER_PG_PASSWORD" not in settings
    assert "${DAGSTER_PG_PASSWORD}@" in settings["LAKEHOUSE_LOCK_URL"]
    assert ".secrets/local.env" not in tracked
    ignored = subprocess.run(["git", "check-ignore", "-q", ".secrets/local.env"], cwd=REPO)
    assert ignored.returncode == 0, ".secrets/ must be ignored by git"


def test_processes_asking_at_once_all_get_the_one_set_of_values(tmp_path):
    """`make -j` starts PostgreSQL and S3Proxy together: every process reads what the file
    keeps, never a value of its own that the file lost."""
    file = tmp_path / "local.env"
    code = ("import sys; sys.path.insert(0, 'infra'); import local_secrets, json; "
            "print(json.dumps(local_secrets.ensure()))")
    env = {"LOCAL_SECRETS_FILE": str(file), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE) for _ in range(6)]
    import json

    seen = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    kept = infra_module("local_secrets.py").read(file)
    assert all(s == kept for s in seen), seen
