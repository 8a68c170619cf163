"""Who holds a stream checkpoint, asked without taking its lock (`checkpoint_holder`), on a local
root: the kernel's file locks decide, so a holder in another process is named (pid, host, since,
role) while it holds the lock, and nobody is once it released it or died, whatever record it
left in the lock file. The catch-up schedule skips naming that holder."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest
from dagster import RunRequest, SkipReason, build_schedule_context, instance_for_test

from assets.resources import LakehouseResource
from lakehouse.config.settings import Settings
from lakehouse.tables.locks import (
    CATCH_UP_ROLE,
    SERVICE_ROLE,
    CheckpointBusy,
    acting_as,
    checkpoint_holder,
    checkpoint_lock,
)


def holder_process(root, role: str | None) -> subprocess.Popen:
    """Another process holding the stream's lock (as `role`) until told to release it (a line
    on its stdin) or killed; prints 'held' once it has it."""
    code = textwrap.dedent(f"""
        import sys
        from lakehouse.config.settings import Settings
        from lakehouse.tables.locks import checkpoint_lock, set_role
        set_role({role!r})
        s = Settings.from_env({{"LAKEHOUSE_ROOT": {str(root)!r}}})
        with checkpoint_lock(s, "ingest"):
            print("held", flush=True)
            sys.stdin.readline()
        print("released", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture()
def settings(tmp_path):
    return Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lakehouse")})


def test_a_holder_in_another_process_is_named_until_it_releases(settings):
    assert checkpoint_holder(settings) is None  # never taken
    proc = holder_process(settings.root, SERVICE_ROLE)
    try:
        holder = checkpoint_holder(settings)
        assert holder is not None
        assert (holder.pid, holder.host, holder.role) == (proc.pid, socket.gethostname(),
                                                          SERVICE_ROLE)
        assert abs(datetime.now(UTC) - holder.since) < timedelta(minutes=1)
        assert not holder.is_this_process
        assert f"{SERVICE_ROLE} (pid {proc.pid} on {socket.gethostname()}, since " \
            in holder.describe()
        assert holder.lock == "the stream checkpoint 'ingest'"
        # Asking did not take it: the holder keeps it, a runner is still refused.
        with pytest.raises(CheckpointBusy, match=f"pid {proc.pid}"):
            with checkpoint_lock(settings, "ingest"):
                pass
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        proc.wait(30)
    finally:
        proc.kill()
    assert checkpoint_holder(settings) is None
    with checkpoint_lock(settings, "ingest"):  # free indeed
        pass


def test_the_record_of_a_killed_holder_is_not_a_holder(settings):
    proc = holder_process(settings.root, None)
    assert checkpoint_holder(settings).pid == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with open(os.path.join(str(settings.root), "_locks", "ingest.lock")) as f:
        record = f.read()
    assert record.startswith(f"pid {proc.pid} on ")  # the dead holder's record is still there
    assert checkpoint_holder(settings) is None


def test_this_process_as_holder_is_named_as_such(settings):
    with checkpoint_lock(settings, "ingest", role="a test"):
        holder = checkpoint_holder(settings)
        assert (holder.pid, holder.role, holder.is_this_process) == (os.getpid(), "a test", True)
    assert checkpoint_holder(settings) is None
    with acting_as(CATCH_UP_ROLE), checkpoint_lock(settings, "ingest"):
        assert checkpoint_holder(settings).role == CATCH_UP_ROLE


def test_the_catch_up_schedule_skips_naming_the_holder(settings, monkeypatch):
    from orchestration.definitions import defs

    monkeypatch.setenv("LAKEHOUSE_ROOT", str(settings.root) + "-not-here")  # the resource's root
    schedule = defs.get_schedule_def("stream_catch_up_schedule")
    resources = {"lakehouse": LakehouseResource(lakehouse_root=str(settings.root))}
    with instance_for_test() as instance, build_schedule_context(
            instance=instance, resources=resources) as context:
        assert isinstance(schedule(context), RunRequest)
        proc = holder_process(settings.root, SERVICE_ROLE)
        try:
            skip = schedule(context)
            assert isinstance(skip, SkipReason)
            assert skip.skip_message.startswith(f"{SERVICE_ROLE} (pid {proc.pid} on ")
            assert skip.skip_message.endswith(
                "holds the stream checkpoint 'ingest': it is ingesting; no catch-up needed")
        finally:
            proc.kill()
            proc.wait(30)
        assert isinstance(schedule(context), RunRequest)
