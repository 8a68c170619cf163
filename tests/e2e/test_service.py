"""`make stream` as a service: SIGKILL inside a batch (after its bronze commit, before its
aggregates MERGE) and a Dagster-style catch-up on the same checkpoint lose and duplicate nothing;
the checkpoint lock refuses a second runner. (A service killed with a batch in flight, offsets
written and commit not, and restarted: the orders pipeline of
tests/e2e/test_service_pipelines.py, `make test-long`.)"""

import os
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from reference import aggregate, dedup, rows_of

from lakehouse.tables.locks import CheckpointBusy
from lakehouse.tables.reads import read
from spark_jobs import stream
from testkit.faults import kill_inside_batch, next_batch, running_service, wait_for
from testkit.generator import GeneratorConfig, generate, produce


def bronze_rows(settings):
    try:
        return read(settings, "bronze_events").num_rows
    except Exception:
        return 0


@pytest.mark.slow
def test_a_crash_inside_a_batch_and_a_catch_up_lose_and_duplicate_nothing(instance_env, spark):
    settings = instance_env
    env = {**os.environ, "STREAM_TRIGGER_INTERVAL": "2 seconds",
           "MAX_OFFSETS_PER_TRIGGER": "600"}
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=2700, seed=5, end=end, span=timedelta(hours=3),
                                       keys=6, late_fraction=0.05)).records
    chunks = [records[:900], records[900:1800], records[1800:2600], records[2600:]]
    produce(settings, chunks[0])

    with running_service(env) as svc:
        wait_for(lambda: bronze_rows(settings) > 0, svc, what="first bronze batch")
        with pytest.raises(CheckpointBusy, match="in use"):
            stream.run_available_now(spark, settings)
        produce(settings, chunks[1])
        wait_for(lambda: bronze_rows(settings) > 900, svc, what="progress on the second chunk")
        produce(settings, chunks[2])
        # Killed inside a batch, after its bronze commit and before its aggregates MERGE.
        kill_inside_batch(svc, settings, "bronze_before_aggregates",
                          next_batch(settings.checkpoint_path(stream.INGEST_QUERY)))

    # A Dagster-style catch-up on the same checkpoint (a killed runner holds no lock): it re-runs
    # the batch the kill interrupted (its bronze commit landed, its aggregates' did not)
    # and ingests the rest, recording its batches in stream_progress. (A clean SIGTERM stop:
    # tests/e2e/test_metrics_service.py.)
    produce(settings, chunks[3])
    stream.catch_up(spark, settings)

    def valid_in(rs):
        return sum(1 for r in rs if r.kind in ("event", "late", "duplicate", "late_duplicate"))

    valid = valid_in(records)

    bronze = read(settings, "bronze_events")
    positions = Counter(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(),
                            strict=True))
    quarantine = read(settings, "quarantined_events")
    q_positions = Counter(zip(quarantine["partition"].to_pylist(),
                              quarantine["offset"].to_pylist(), strict=True))
    assert max(positions.values()) == 1 and max(q_positions.values()) == 1  # no duplicate
    assert bronze.num_rows == valid
    per_partition = Counter(p for p, _ in positions) + Counter(p for p, _ in q_positions)
    for p, n in per_partition.items():  # no missing offset: dense 0..n-1 per partition
        offsets = {o for (pp, o) in positions if pp == p} | {o for (pp, o) in q_positions if pp == p}
        assert offsets == set(range(n)), p

    # Aggregates: every event counted once, except exactly the ones the late lane recorded.
    rows, _ = rows_of([records])
    late_ids = Counter(read(settings, "late_events")["event_id"].to_pylist())
    kept = []
    for r in reversed(rows):  # a late copy arrives after the copy that counted
        if late_ids[r.event_id]:
            late_ids[r.event_id] -= 1
        else:
            kept.append(r)
    assert not +late_ids
    want = aggregate(dedup(list(reversed(kept))))
    got = {(r["window_start"].astimezone(UTC).replace(tzinfo=None), r["key"]):
           (r["event_count"], r["value_sum"], r["value_min"], r["value_max"])
           for r in read(settings, "streaming_aggregates").to_pylist()}
    assert got == want
    progress = read(settings, "stream_progress").to_pylist()
    assert {p["query"] for p in progress} == {"ingest"}
    assert read(settings, "late_events").num_rows > 0
