"""The local Spark Connect server's token (`make spark-up`, infra/spark/connect.py): whoever
reaches a Connect server runs code as its owner, so the one the project starts admits only
clients that present the token it was started with.

Spark 4's Connect server checks a pre-shared bearer token when `spark.connect.authenticate.token`
or, unset, the environment variable SPARK_CONNECT_AUTHENTICATE_TOKEN holds one (its
`PreSharedKeyAuthenticationInterceptor`: a call without `Authorization: Bearer <token>` is
refused, UNAUTHENTICATED). Each start makes a new token (`new_token`): it reaches the server JVM
in its environment (never its command line, which every local user reads) and the clients in a
file of the server's state folder readable by its owner only (`connect-<port>.token`, mode 0600),
removed when the server stops.

pyspark's client sends a token only over TLS or, without TLS, to host `localhost` (gRPC's local
credentials: loopback connections only), so `with_local_token` gives a URL naming the local server
(`sc://127.0.0.1:<port>` or `sc://localhost:<port>`, no token of its own) host `localhost` and
the token of the server on that port. A URL with a token of its own, or TLS, is the user's and
stays as it is. No Spark here."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

# Spark's own variable: the server reads it when spark.connect.authenticate.token is unset (and
# pyspark's client when its URL has no token).
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
# The conf key the server would take instead of TOKEN_ENV.
TOKEN_CONF = "spark.connect.authenticate.token"
# Where `make spark-up` keeps the server's state (SPARK_CONNECT_STATE_DIR moves it).
DEFAULT_STATE_DIR = Path(__file__).resolve().parents[2] / ".spark-connect"
DEFAULT_PORT = 15002  # pyspark's, for a URL without a port

_LOCAL = re.compile(r"^sc://(127\.0\.0\.1|localhost)(?::(\d+))?/?(;.*)?$", re.I)


def token_file(state_dir: Path, port: int) -> Path:
    """The token of the local server on `port` whose state is in `state_dir`."""
    return Path(state_dir) / f"connect-{port}.token"


def new_token(state_dir: Path, port: int) -> str:
    """A new token for the server about to start on `port`, written to its `token_file`,
    created readable by its owner only (written whole before it replaces an older one)."""
    token = secrets.token_urlsafe(32)
    path = token_file(state_dir, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".new")
    fresh.unlink(missing_ok=True)
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    os.replace(fresh, path)
    return token


def read_token(state_dir: Path, port: int) -> str | None:
    """The token of the local server on `port`, None when it has none (not started here)."""
    try:
        return token_file(state_dir, port).read_text(encoding="ascii").strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def local_port(url: str | None) -> int | None:
    """The port of a Connect URL naming this machine's loopback without TLS and without a token
    of its own (the local server's clients); None for any other URL."""
    found = _LOCAL.match(url or "")
    if not found:
        return None
    params = [p.strip().lower() for p in (found.group(3) or "").split(";") if p.strip()]
    if any(p.startswith("token=") or p == "use_ssl=true" for p in params):
        return None
    return int(found.group(2) or DEFAULT_PORT)


def with_local_token(url: str | None, state_dir: Path | None = None) -> str | None:
    """`url` as a client connects with it: a URL naming the local server started from
    `state_dir` (`local_port`) as `sc://localhost:<port>/;token=<its token>` with the URL's other
    parameters; any other URL, or one whose port has no token there, unchanged."""
    port = local_port(url)
    if port is None:
        return url
    token = read_token(state_dir or DEFAULT_STATE_DIR, port)
    if token is None:
        return url
    params = (_LOCAL.match(url).group(3) or "").strip(";")
    return f"sc://localhost:{port}/;token={token}" + (f";{params}" if params else "")
