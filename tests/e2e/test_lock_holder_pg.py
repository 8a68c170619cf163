"""Who holds a stream checkpoint of an object-store root, asked of the lock server (a real
PostgreSQL) without taking the advisory lock: the holder's pid, host and role while its session
holds it, nobody once it is killed (the server ends its session, the lock goes with it)."""

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from lakehouse.config.settings import Settings
from lakehouse.tables.locks import SERVICE_ROLE, CheckpointBusy, checkpoint_holder, checkpoint_lock


def test_the_lock_server_names_the_holder_and_forgets_a_killed_one(pg_lock_url):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": f"s3a://bucket/holder-{time.monotonic_ns()}",
                                  "LAKEHOUSE_LOCK_URL": pg_lock_url})
    assert checkpoint_holder(settings) is None
    code = textwrap.dedent(f"""
        import time
        from lakehouse.config.settings import Settings
        from lakehouse.tables.locks import checkpoint_lock, set_role
        set_role({SERVICE_ROLE!r})
        s = Settings.from_env({{"LAKEHOUSE_ROOT": {settings.root!r},
                               "LAKEHOUSE_LOCK_URL": {pg_lock_url!r}}})
        with checkpoint_lock(s, "ingest"):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        holder = checkpoint_holder(settings)
        assert (holder.pid, holder.host, holder.role) == (proc.pid, socket.gethostname(),
                                                          SERVICE_ROLE)
        assert holder.since is not None
        assert f"{SERVICE_ROLE} (pid {proc.pid} on " in holder.describe()
        with pytest.raises(CheckpointBusy, match=f"pid {proc.pid}"):  # still held by it
            with checkpoint_lock(settings, "ingest"):
                pass
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 30
        while checkpoint_holder(settings) is not None:  # the server sees the session end
            assert time.monotonic() < deadline, "a killed holder is still named"
            time.sleep(0.2)
    finally:
        proc.kill()
