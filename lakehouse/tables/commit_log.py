"""The commit log of the s3a:// tables, kept by the lock server: the Python side of the Delta log
store `lakehouse.delta.PgLogStore` (infra/jars/logstore), which Spark uses for every table
under an `s3a://` root. No Spark here.

A commit of version N of such a table is a row of `lakehouse_delta_commits` (table, N.json, its
temporary file, complete), inserted in one transaction of the lock server that first checks the
writer still holds its writer lock: its fence (`fence_token`, set by spark_jobs/writer.py in the
session as `spark.lakehouse.fence.<table path>` around each commit). The row is the commit
point; the store writes N.json right after, and whoever finds the row incomplete first (a Spark
reader, or the lock's next holder: `complete_interrupted`) copies the temporary file there.
Readers without the store (delta-rs) see a commit once its N.json is written.

`spark_conf` is what a session on an s3a:// root needs for it: the store for the `s3a` scheme,
its jar with the PostgreSQL JDBC driver, and the lock server (LAKEHOUSE_LOCK_URL) as a JDBC URL,
user and password (the password a secret setting: spark_secrets keeps it off command lines)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from lakehouse.config import storage

LOG_STORE_CLASS = "lakehouse.delta.PgLogStore"
SCHEME_KEY = "spark.delta.logStore.s3a.impl"  # Delta's log store of the scheme
LOG_STORE_JARS = Path(__file__).resolve().parents[2] / ".jars" / "logstore"
TABLE = "lakehouse_delta_commits"  # created by the store on first use
FENCE_PREFIX = "spark.lakehouse.fence."
URL_KEY = "spark.lakehouse.lockServer.url"
USER_KEY = "spark.lakehouse.lockServer.user"
PASSWORD_KEY = "spark.lakehouse.lockServer.password"
LOST = "WriterLockLost"  # in the message of a commit the store refused for a lost lock
# The libpq parameters a JDBC URL carries over (pgjdbc's names are the same).
_JDBC_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


def log_store_jars() -> list[str]:
    """The store's jar and the JDBC driver (`make setup` builds them into .jars/logstore)."""
    jars = sorted(str(p) for p in LOG_STORE_JARS.glob("*.jar"))
    if not any(Path(j).name == "lakehouse-logstore.jar" for j in jars):
        raise RuntimeError(f"the Delta log store of s3a roots is missing in {LOG_STORE_JARS}: "
                           "run `make setup` first")
    return jars


def jdbc(dsn: str) -> tuple[str, str | None, str | None]:
    """(JDBC URL without credentials, user, password) of a libpq URL or key=value string."""
    from psycopg2.extensions import parse_dsn

    parts = parse_dsn(dsn)
    host = parts.get("host") or "localhost"
    if host.startswith("/") or "," in host:
        raise ValueError("LAKEHOUSE_LOCK_URL: the Delta log store reaches the lock server over "
                         "TCP at one host (not a socket folder or a host list)")
    if ":" in host:
        host = f"[{host}]"
    port = parts.get("port") or "5432"
    database = parts.get("dbname") or parts.get("user") or "postgres"
    params = "&".join(f"{k}={parts[k]}" for k in _JDBC_PARAMS if parts.get(k))
    url = f"jdbc:postgresql://{host}:{port}/{database}" + (f"?{params}" if params else "")
    return url, parts.get("user"), parts.get("password")


def spark_conf(root: str, lock_dsn: str | None) -> dict[str, str]:
    """The store's Spark settings for `root`: for an s3a:// root the store for the scheme and
    the lock server (when LAKEHOUSE_LOCK_URL is set; without it nothing writes there, and
    reads list the tables as the object store holds them); nothing for other roots. The jars
    are `log_store_jars()` (spark.jars: the loader of Delta's own classes)."""
    if storage.scheme(root) != "s3a":
        return {}
    conf = {SCHEME_KEY: LOG_STORE_CLASS}
    if lock_dsn:
        url, user, password = jdbc(lock_dsn)
        conf[URL_KEY] = url
        if user:
            conf[USER_KEY] = user
        if password:
            conf[PASSWORD_KEY] = password
    return conf


def fence_key(table_uri: str) -> str:
    """The session setting that carries the fence of a commit to `table_uri`."""
    return FENCE_PREFIX + table_uri.rstrip("/")


@dataclass(frozen=True)
class Entry:
    """A row of the commit log: a commit of `table` (a Hadoop path, `s3a://...`)."""

    table: str
    file_name: str
    temp_path: str  # relative to the table's _delta_log
    complete: bool
    lock_keys: tuple[int, ...]  # the writer locks that fenced it (none: a table's creation)
    fence: str | None  # the fence as given: key:pid:start of each lock
    committed_at: datetime

    @property
    def version(self) -> int:
        return int(self.file_name.split(".", 1)[0])


def _exists(cur) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
    return cur.fetchone()[0]


def entries(conn, table_uri: str) -> list[Entry]:
    """The commit log's rows of a table (completed ones are kept for a day), by version."""
    with conn.cursor() as cur:
        if not _exists(cur):
            return []
        cur.execute(f"SELECT table_path, file_name, temp_path, complete, "
                    f"coalesce(lock_keys, '{{}}'), fence, committed_at FROM {TABLE} "
                    "WHERE table_path = %s ORDER BY file_name", (table_uri.rstrip("/"),))
        return [Entry(t, f, p, c, tuple(k), fe, at) for t, f, p, c, k, fe, at in cur.fetchall()]


def complete_interrupted(conn, key: int, env: Mapping[str, str] | None = None) -> list[Entry]:
    """Complete the commits fenced by lock `key` whose N.json was never written (their writer
    died or paused after the commit point): the temporary file copied to N.json, the row marked
    complete, as the store's readers do. Called by the lock's new holder before it writes or
    reads anything, so its delta-rs reads see every commit that landed. The entries completed."""
    with conn.cursor() as cur:
        if not _exists(cur):
            return []
        cur.execute(f"SELECT table_path, file_name, temp_path, complete, lock_keys, fence, "
                    f"committed_at FROM {TABLE} WHERE NOT complete AND %s = ANY(lock_keys) "
                    "ORDER BY table_path, file_name", (key,))
        found = [Entry(t, f, p, c, tuple(k), fe, at) for t, f, p, c, k, fe, at in cur.fetchall()]
    done = []
    for entry in found:
        log = f"{entry.table}/_delta_log"
        target = f"{log}/{entry.file_name}"
        if storage.read_text(target, env) is None:
            text = storage.read_text(f"{log}/{entry.temp_path}", env)
            if text is None:
                if storage.read_text(target, env) is None:
                    continue  # neither file: its table was deleted
            else:
                storage.write_text(target, text, env)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {TABLE} SET complete = true, expire_time = "
                        "extract(epoch FROM now())::int8 + 86400 WHERE table_path = %s AND "
                        "file_name = %s AND NOT complete", (entry.table, entry.file_name))
        done.append(entry)
    return done
