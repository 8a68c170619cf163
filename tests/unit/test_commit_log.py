"""The Spark settings of the fenced log store (lakehouse.tables.commit_log): only for an s3a://
root, the lock server as a JDBC URL without credentials, its password a secret setting (never on
a command line); and the fence's tokens and commit lock agree with the store's Java side."""

import pytest

from lakehouse.config import spark_secrets
from lakehouse.config.settings import Settings
from lakehouse.tables import commit_log
from lakehouse.tables.locks import Fence, Fences, commit_lock
from spark_jobs.session import spark_conf

URL = "postgresql://dagster:s3cr%2Ft@db.example:5433/locks?sslmode=require&application_name=x"


def test_a_local_root_gets_no_log_store_and_no_jar(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path), "LAKEHOUSE_LOCK_URL": URL})
    conf = spark_conf(settings)
    assert not any(k.startswith(("spark.lakehouse.", "spark.delta.logStore")) for k in conf)
    assert "logstore" not in conf["spark.jars"]


def test_an_s3a_root_gets_the_store_and_the_lock_server_with_its_password_secret():
    settings = Settings.from_env({"LAKEHOUSE_ROOT": "s3a://bucket/lake", "LAKEHOUSE_LOCK_URL": URL})
    conf = spark_conf(settings)
    assert conf["spark.delta.logStore.s3a.impl"] == "lakehouse.delta.PgLogStore"
    assert conf[commit_log.URL_KEY] == "jdbc:postgresql://db.example:5433/locks?sslmode=require"
    assert conf[commit_log.USER_KEY] == "dagster" and conf[commit_log.PASSWORD_KEY] == "s3cr/t"
    plain, secret = spark_secrets.split(conf)
    assert secret == {commit_log.PASSWORD_KEY: "s3cr/t"}
    assert not any("s3cr" in v for v in plain.values())
    assert "lakehouse-logstore.jar" in conf["spark.jars"]


@pytest.mark.parametrize("dsn, url", [
    ("host=127.0.0.1 port=5433 dbname=locks user=u password=p",
     "jdbc:postgresql://127.0.0.1:5433/locks"),
    ("postgresql://u@[::1]/locks", "jdbc:postgresql://[::1]:5432/locks"),
])
def test_key_value_and_uri_forms(dsn, url):
    assert commit_log.jdbc(dsn)[0] == url


def test_a_socket_folder_is_refused_naming_why():
    with pytest.raises(ValueError, match="over TCP"):
        commit_log.jdbc("postgresql:///locks?host=/var/run/postgresql")


def test_the_commit_lock_is_the_keys_halves_as_java_casts_them():
    for key in (0, 1, -1, 2**63 - 1, -(2**63), -37309717551975828, 8530027758793502978):
        hi, lo = commit_lock(key)
        assert -(2**31) <= hi < 2**31 and -(2**31) <= lo < 2**31
        assert ((hi & 0xFFFFFFFF) << 32 | (lo & 0xFFFFFFFF)) == key & (2**64 - 1)


def test_a_file_lock_has_no_tokens_and_fences_gather_theirs():
    class Held(Fence):
        def __init__(self, token):
            self.token = token

        def tokens(self):
            return (self.token,)

    fences = Fences()
    fences.add(Fence())
    fences.add(Held("1:2:3"))
    fences.add(Held("4:5:6"))
    assert Fence().tokens() == () and fences.tokens() == ("1:2:3", "4:5:6")
