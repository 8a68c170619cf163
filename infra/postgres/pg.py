"""Start, stop and check a throwaway PostgreSQL cluster on 127.0.0.1 (Dagster's instance storage).

Uses the server binaries of the machine's PostgreSQL (Debian: /usr/lib/postgresql/<ver>/bin, from
the `postgresql` package, which `make setup` installs: `make system-deps`). The cluster
lives in `.postgres/` of the repo: data in `.postgres/data`, its unix socket in `.postgres/run`
(mode 0700), log in `.postgres/postgres.log`. It listens on 127.0.0.1:$PG_PORT only (default
5433; DAGSTER_PG_PORT is read too). The runs log in over TCP as DAGSTER_PG_USERNAME with the
password DAGSTER_PG_PASSWORD (when unset, the one generated at set-up in the owner-only
`.secrets/local.env`: infra/local_secrets.py; never printed): a role that is not
a superuser (no `COPY ... TO PROGRAM`, no new roles or databases), owner of the database
DAGSTER_PG_DB (default `dagster`), which `up` creates. The cluster's own superuser (`postgres`)
has no password: it logs in only over the owner-only unix socket, which trusts its owner. PostgreSQL refuses to
run as root: as root, the cluster is owned and run by the OS user `lakehouse-pg` (PG_OS_USER),
created when missing. Usage:

    python infra/postgres/pg.py up|down|status [--state-dir DIR] [--port N]

`up` is idempotent and waits until the server accepts connections; `down` stops it (fast mode).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import local_secrets  # noqa: E402
from daemon import REPO, ServerError, port_open, run_cli, tail, taken  # noqa: E402

DEFAULT_USER = "dagster"
SUPERUSER = "postgres"  # the cluster's bootstrap role: the owner-only socket only
DEFAULT_DB = "dagster"


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def find_bindir() -> Path:
    """The folder holding initdb and pg_ctl: $PG_BINDIR, the newest Debian
    /usr/lib/postgresql/<ver>/bin, or the one of `pg_config` on PATH."""
    candidates = [Path(os.environ["PG_BINDIR"])] if os.environ.get("PG_BINDIR") else []
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted((p for p in debian.iterdir() if p.name.replace(".", "").isdigit()),
                          key=lambda p: float(p.name), reverse=True)
        candidates += [v / "bin" for v in versions]
    if shutil.which("pg_ctl"):
        candidates.append(Path(shutil.which("pg_ctl")).resolve().parent)
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise ServerError("PostgreSQL server binaries (initdb, pg_ctl) not found: run `make setup` "
                      "(Debian/Ubuntu: sudo apt-get install postgresql; or set PG_BINDIR)")


class Postgres:
    def __init__(self, state_dir: Path, port: int):
        self.state_dir = state_dir.resolve()
        self.port = port
        self.data_dir = self.state_dir / "data"
        self.socket_dir = self.state_dir / "run"
        self.log_file = self.state_dir / "postgres.log"
        self.user = _env("DAGSTER_PG_USERNAME", DEFAULT_USER)
        self.db = _env("DAGSTER_PG_DB", DEFAULT_DB)
        # As root, a dedicated unprivileged OS user owns and runs the cluster.
        self.os_user = _env("PG_OS_USER", "lakehouse-pg") if os.geteuid() == 0 else None

    # ---- running commands as the cluster's owner ----------------------------------------------
    def _as_owner(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", self.os_user, "--", *cmd] if self.os_user else cmd

    def _run(self, cmd: list[str], stdin: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self._as_owner(cmd), input=stdin, capture_output=True, text=True,
                              cwd=self.state_dir)
        if check and done.returncode != 0:
            raise ServerError(f"{Path(cmd[0]).name} failed: "
                              + (done.stderr.strip() or done.stdout.strip()).replace("\n", " | "))
        return done

    def _ensure_os_user(self) -> None:
        if not self.os_user:
            return
        try:
            pwd.getpwnam(self.os_user)
        except KeyError:
            subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                            "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                            self.os_user], check=True)
        shutil.chown(self.state_dir, self.os_user, self.os_user)
        for path in (self.data_dir, self.socket_dir):
            if path.exists():
                subprocess.run(["chown", "-R", f"{self.os_user}:{self.os_user}", str(path)],
                               check=True)
        if self._run(["test", "-w", str(self.state_dir)], check=False).returncode != 0:
            raise ServerError(f"OS user {self.os_user} cannot reach {self.state_dir}: let other "
                              "users traverse its parent folders, or set PG_STATE_DIR elsewhere")

    # ---- commands ----------------------------------------------------------------------------
    def running(self, bindir: Path | None = None) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        bindir = bindir or find_bindir()
        return self._run([str(bindir / "pg_ctl"), "status", "-D", str(self.data_dir)],
                         check=False).returncode == 0

    def _initdb(self, bindir: Path) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self._run([str(bindir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                   "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
                   "--no-locale"])

    def _psql(self, bindir: Path, sql: str, db: str = "postgres") -> str:
        """Run SQL (given on stdin, so nothing shows in `ps`) over the owner-only socket."""
        return self._run([str(bindir / "psql"), "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                          "-h", str(self.socket_dir), "-p", str(self.port), "-U", SUPERUSER,
                          "-d", db], stdin=sql).stdout.strip()

    def up(self, wait_s: int = 60) -> str:
        if self.user == SUPERUSER:
            raise ServerError(f"DAGSTER_PG_USERNAME={SUPERUSER!r} is the cluster's own "
                              "superuser: the runs need a role of their own (e.g. dagster)")
        bindir = find_bindir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._ensure_os_user()
        already = self.running(bindir)
        if not already:
            if port_open(self.port):
                raise taken(self.port, "PG_PORT")
            self._initdb(bindir)
            options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                       f"-c unix_socket_directories={self.socket_dir}")
            done = self._run([str(bindir / "pg_ctl"), "start", "-D", str(self.data_dir), "-w",
                              "-t", str(wait_s), "-l", str(self.log_file), "-o", options],
                             check=False)
            if done.returncode != 0:
                raise ServerError(f"PostgreSQL did not start: see {self.log_file}\n"
                                  + tail(self.log_file))
        # The runs' role: not a superuser, its password from the environment or the generated
        # local secrets (TCP logins use it), owner of the database.
        try:
            self._psql(bindir, "SELECT 1;")
        except ServerError:
            raise ServerError(f"{self.data_dir} was created by an older version of this script "
                              f"(its superuser is not {SUPERUSER}): stop it and delete "
                              f"{self.state_dir} (make pg-down; rm -rf {self.state_dir})") from None
        password = local_secrets.value("DAGSTER_PG_PASSWORD").replace("'", "''")
        exists = self._psql(bindir, f"SELECT 1 FROM pg_roles WHERE rolname = '{self.user}';")
        verb = "ALTER" if exists == "1" else "CREATE"
        try:
            self._psql(bindir, f"{verb} ROLE \"{self.user}\" LOGIN NOSUPERUSER NOCREATEDB "
                               f"NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '{password}';")
        except ServerError:  # psql may echo the statement: say what failed, not the secret
            raise ServerError(f"setting up role {self.user} failed: see {self.log_file}") from None
        if self._psql(bindir, f"SELECT 1 FROM pg_database WHERE datname = '{self.db}';") != "1":
            self._psql(bindir, f'CREATE DATABASE "{self.db}" OWNER "{self.user}";')
        else:
            self._psql(bindir, f'ALTER DATABASE "{self.db}" OWNER TO "{self.user}";')
        version = self._psql(bindir, "SHOW server_version;")
        state = "already running" if already else "up"
        return (f"PostgreSQL {version} {state} on 127.0.0.1:{self.port}, database {self.db}, "
                f"user {self.user}, log: {self.log_file}")

    def down(self) -> str:
        if not (self.data_dir / "PG_VERSION").exists():
            return "PostgreSQL not running"
        bindir = find_bindir()
        if not self.running(bindir):
            return "PostgreSQL not running"
        self._run([str(bindir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast", "-w"])
        return "PostgreSQL stopped"

    def status(self) -> str:
        if self.running():
            return f"PostgreSQL running on 127.0.0.1:{self.port} (data {self.data_dir})"
        return "PostgreSQL not running"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("PG_STATE_DIR", REPO / ".postgres")))
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("PG_PORT")
                                    or os.environ.get("DAGSTER_PG_PORT") or 5433))
    args = parser.parse_args(argv)
    pg = Postgres(args.state_dir, args.port)
    return run_cli(getattr(pg, args.command),
                   ok=lambda: args.command != "status" or pg.running())


if __name__ == "__main__":
    sys.exit(main())
