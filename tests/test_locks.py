"""The stream's one-runner guarantee on an object store: a lease file written through Hadoop's
FileSystem (here its file: scheme, the same code path as s3a:), renewed while held."""

import json
import time

import pytest

from spark_jobs import lock
from spark_jobs.lock import CheckpointBusy, _Hadoop, _lease


def test_a_second_runner_is_refused_while_the_lease_is_held_and_takes_it_once_expired(
        spark, tmp_path):
    path = f"file://{tmp_path}/_locks/bronze.lease"
    with _lease(spark, path, "s3a://bucket/lake", settle_s=0.1):
        held = json.loads(_Hadoop(spark, path).read())
        assert held["expires"] > time.time()
        with pytest.raises(CheckpointBusy, match="in use by"):
            with _lease(spark, path, "s3a://bucket/lake", settle_s=0.1):
                pass
    assert _Hadoop(spark, path).read() is None  # released on exit
    # A runner that died leaves its lease: refused until it expires, then taken over.
    _Hadoop(spark, path).write(json.dumps({"owner": "dead runner", "expires": time.time() + 60}))
    with pytest.raises(CheckpointBusy, match="dead runner"):
        with _lease(spark, path, "s3a://bucket/lake", settle_s=0.1):
            pass
    _Hadoop(spark, path).write(json.dumps({"owner": "dead runner", "expires": time.time() - 1}))
    with _lease(spark, path, "s3a://bucket/lake", settle_s=0.1):
        assert "dead runner" not in _Hadoop(spark, path).read()


def test_the_lease_is_renewed_while_held(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "LEASE_SECONDS", 1.5)
    path = f"file://{tmp_path}/_locks/aggregates.lease"
    with _lease(spark, path, "s3a://bucket/lake", settle_s=0.1):
        first = json.loads(_Hadoop(spark, path).read())["expires"]
        time.sleep(1.2)
        assert json.loads(_Hadoop(spark, path).read())["expires"] > first
