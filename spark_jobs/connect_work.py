"""What a run killed over Spark Connect leaves running, and how the next writer stops it.

Over Connect a run's operations execute in the server. pyspark 4.2's client sends them as
reattachable executions, so when the client process dies (SIGKILL, OOM) the server keeps running
the one in flight, detached, until `spark.connect.execute.manager.detachedTimeout` (5 minutes by
default) closes it; a MERGE into gold in flight at the kill can still commit after the run's
writer lock was released by the kernel. The run's session records itself with every lock it
takes (`lakehouse.tables.locks.set_remote_work`), and the next holder of such a lock calls
`stop_orphaned` (registered with `on_orphaned_work`) before it writes: it attaches to the dead
session by its id, interrupts all of its operations and waits until the server reports none
running (GetStatus: an interrupted operation stays RUNNING until its thread has ended, so a
commit it was making is either made or not by then), then releases the session. What the
operation committed before that is the state the next run starts from (its changelog repair,
the re-planned recomputation, Delta's conflict checks on concurrent commits).
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from lakehouse.config.connect_token import with_local_token
from lakehouse.tables.locks import RemoteWork, on_orphaned_work, set_remote_work

log = logging.getLogger(__name__)

GONE = ("SESSION_NOT_FOUND", "SESSION_CLOSED", "INVALID_HANDLE")


def record_session(spark) -> None:
    """Record `spark` (a Connect session) with the locks this process takes from now on."""
    client = spark.client
    set_remote_work(RemoteWork(client._builder.endpoint, spark.session_id, client._user_id))


def _reachable(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def _url(settings, work: RemoteWork) -> str:
    """The dead session's URL: this run's SPARK_REMOTE parameters (token, TLS) when it names the
    same server, the recorded session and user; on the local server, its current token."""
    extra = ""
    remote = settings.spark_remote_url or ""
    if remote.startswith(f"sc://{work.endpoint}/;"):
        extra = ";" + ";".join(p for p in remote.split("/;", 1)[1].split(";")
                               if p and not p.startswith(("session_id=", "user_id=")))
    user = f";user_id={work.user_id}" if work.user_id else ""
    state = settings.spark_connect_state_dir
    return with_local_token(f"sc://{work.endpoint}/;session_id={work.session_id}{user}{extra}",
                            Path(state) if state else None)


def stop_orphaned(settings, what: str, work: RemoteWork, timeout_s: float = 900.0) -> int:
    """Interrupt every operation of the dead holder's session `work` and return once none runs
    (the number interrupted). A server that is gone, or no longer knows the session, runs
    nothing of it."""
    if not _reachable(work.endpoint):
        return 0  # the server is down: its operations died with it
    from pyspark.sql.connect.client import SparkConnectClient
    from pyspark.sql.connect.proto import base_pb2

    running = base_pb2.GetStatusResponse.OperationStatus.OperationState.OPERATION_STATE_RUNNING
    client = SparkConnectClient(_url(settings, work))
    try:
        try:
            interrupted = client.interrupt_all() or []
        except Exception as exc:  # noqa: BLE001 - only a session the server forgot is no error
            if any(g in str(exc) for g in GONE):
                return 0
            raise
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = client._get_operation_statuses().operation_statuses
            left = [s.operation_id for s in statuses if s.state == running]
            if not left:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {len(left)} operations of a dead run's Spark "
                                   f"Connect session {work.session_id} still run after "
                                   f"{timeout_s:.0f}s")
            client.interrupt_all()
            time.sleep(0.2)
        try:
            client.release_session()
        except Exception:  # noqa: BLE001 - stopped is what counts; the server expires it anyway
            pass
    finally:
        client.close()
    log.warning("%s: stopped the Spark Connect session %s of a run that died holding it "
                "(%d operations interrupted, none running)", what, work.session_id,
                len(interrupted))
    print(f"lakehouse: {what}: stopped the Spark Connect session {work.session_id} of a dead "
          f"holder ({len(interrupted)} operations interrupted, none running)", flush=True)
    return len(interrupted)


on_orphaned_work(stop_orphaned)
