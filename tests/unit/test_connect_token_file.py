"""The local Spark Connect server's token (lakehouse.config.connect_token): a new one per start in
an owner-only file of the server's state folder, presented by the project's clients when
SPARK_REMOTE names that server (host `localhost`: pyspark's client sends a token without TLS to
no other host), a user's own URL left as it is. Files and URLs only: the live server is
tests/e2e/test_connect_token.py."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from lakehouse.config import connect_token
from lakehouse.config.connect_token import new_token, read_token, token_file, with_local_token
from lakehouse.config.settings import Settings, remote_shown
from lakehouse.tables.locks import RemoteWork
from testkit.infra import infra_module

REPO = Path(__file__).resolve().parents[2]


def test_each_start_writes_a_new_token_only_its_owner_reads(tmp_path):
    first = new_token(tmp_path / "state", 15002)
    path = token_file(tmp_path / "state", 15002)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.name == "connect-15002.token"
    assert read_token(tmp_path / "state", 15002) == first and len(first) >= 40
    os.chmod(path, 0o644)  # a file left readable is replaced by a new owner-only one
    second = new_token(tmp_path / "state", 15002)
    assert second != first and read_token(tmp_path / "state", 15002) == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / "state").iterdir()] == [path.name]
    assert read_token(tmp_path / "state", 15010) is None  # another port's server: none


@pytest.mark.parametrize(("url", "want"), [
    ("sc://127.0.0.1:15002", "sc://localhost:15002/;token=T"),
    ("sc://localhost:15002/", "sc://localhost:15002/;token=T"),
    ("sc://127.0.0.1:15002/;user_id=me", "sc://localhost:15002/;token=T;user_id=me"),
    ("sc://localhost", "sc://localhost:15002/;token=T"),  # pyspark's default port
    # A user's own: a token or TLS of its own, another host, another port's server.
    ("sc://localhost:15002/;token=mine", None),
    ("sc://127.0.0.1:15002/;use_ssl=true", None),
    ("sc://spark.example.com:15002", None),
    ("sc://127.0.0.1:15010", None),
    (None, None),
])
def test_the_local_servers_url_presents_its_token_and_others_stay_as_given(tmp_path, url, want):
    token_file(tmp_path, 15002).write_text("T\n")
    assert with_local_token(url, tmp_path) == (want or url)


def test_settings_read_the_token_of_the_server_in_their_state_folder(tmp_path):
    token = new_token(tmp_path, 15010)
    settings = Settings.from_env({"SPARK_REMOTE": "sc://127.0.0.1:15010/;user_id=me",
                                  "SPARK_CONNECT_STATE_DIR": str(tmp_path)})
    assert settings.spark_remote == "sc://127.0.0.1:15010/;user_id=me"  # as given
    assert settings.spark_remote_url == f"sc://localhost:15010/;token={token};user_id=me"
    assert token not in repr(settings) and token not in remote_shown(settings.spark_remote_url)
    # A restart's new token is the one presented next (read at each session's start).
    again = new_token(tmp_path, 15010)
    assert settings.spark_remote_url.startswith(f"sc://localhost:15010/;token={again};")
    # Without SPARK_CONNECT_STATE_DIR: `make spark-up`'s folder.
    assert connect_token.DEFAULT_STATE_DIR == REPO / ".spark-connect"
    # A user's URL with a token of its own is used as it is.
    own = "sc://localhost:15010/;token=mine"
    assert Settings.from_env({"SPARK_REMOTE": own, "SPARK_CONNECT_STATE_DIR": str(tmp_path)}
                             ).spark_remote_url == own


def test_a_dead_sessions_url_carries_the_local_servers_token(tmp_path):
    from spark_jobs.connect_work import _url

    token = new_token(tmp_path, 15010)
    settings = Settings.from_env({"SPARK_REMOTE": "sc://127.0.0.1:15010",
                                  "SPARK_CONNECT_STATE_DIR": str(tmp_path)})
    for endpoint in ("localhost:15010", "127.0.0.1:15010"):  # recorded now, and before
        url = _url(settings, RemoteWork(endpoint, "s-1", "me"))
        assert url.startswith("sc://localhost:15010/;") and url.count(";token=") == 1, url
        assert f";token={token}" in url and ";session_id=s-1" in url and ";user_id=me" in url


def test_the_server_takes_no_token_of_the_launch_configuration(monkeypatch):
    """spark.connect.authenticate.token would win over the token in the server's environment,
    and the project's clients would present the wrong one: refused, naming the variable."""
    connect = infra_module("spark/connect.py")
    monkeypatch.setenv("SPARK_CONF_spark.connect.authenticate.token", "tok-5e1f")
    with pytest.raises(connect.ServerError) as refused:
        connect.server_conf(15002)
    assert "SPARK_CONF_spark.connect.authenticate.token" in str(refused.value)
    assert "tok-5e1f" not in str(refused.value)


def test_make_ui_clusters_runs_read_the_clusters_server_token():
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    plan = subprocess.run(["make", "-n", "ui-cluster", "SPARK_REMOTE=sc://127.0.0.1:15002"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60).stdout
    up = re.search(r"infra/spark/connect\.py --state-dir (\S+) up", plan)
    assert up, plan
    assert re.search(rf"SPARK_CONNECT_STATE_DIR={re.escape(up.group(1))}\s+\\?\s*\S*dagster dev",
                     plan), plan
