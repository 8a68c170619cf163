"""A Dagster webserver over the repo's workspace.yaml, in a process group of its own, and its
GraphQL API: for the tests that check what the UI shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
STARTUP_TIMEOUT = 120


class GraphQLError(AssertionError):
    pass


def gql(url: str, query: str, variables: dict | None = None) -> dict:
    """POST a GraphQL query; returns `data` (GraphQLError on any error)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            payload = json.load(resp)
    except urllib.error.HTTPError as exc:  # the server answers invalid queries with 400 + errors
        raise GraphQLError(f"GraphQL HTTP {exc.code}: {exc.read()[:2000]!r}") from exc
    if payload.get("errors"):
        raise GraphQLError(str(payload["errors"]))
    return payload["data"]


def graph_url(url: str) -> str:
    """The global asset lineage with every group expanded: with more than one group the UI
    collapses them to boxes unless they are listed in `expanded` (ids `global@global:<group>`)."""
    groups = sorted({n["groupName"] for n in gql(url, "{ assetNodes { groupName } }")["assetNodes"]})
    expanded = ",".join(f"global@global:{g}" for g in groups)
    return f"{url}/asset-groups?{urllib.parse.urlencode({'expanded': expanded})}"


def stop(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """Stop the webserver's process group (it spawns a gRPC code server): SIGTERM, then KILL
    after `grace_s` (0: KILL at once)."""
    steps = ((signal.SIGTERM, grace_s),) if grace_s > 0 else ()
    for sig, wait in (*steps, (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; kill what is left of the group (the code server)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def start(env: dict, port: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w",
             "workspace.yaml"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)


def wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    """Until the webserver answers /server_info (AssertionError naming its log otherwise)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        assert proc.poll() is None, f"webserver exited {proc.returncode}: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, (f"no /server_info after {STARTUP_TIMEOUT}s: "
                                             f"{log.read_text()[-3000:]}")
        time.sleep(0.5)


@contextmanager
def webserver(env: dict, port: int, log: Path):
    """A webserver on 127.0.0.1:`port` for the block; yields its base URL."""
    proc = start(env, port, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url, log)
        yield url
    finally:
        stop(proc)
