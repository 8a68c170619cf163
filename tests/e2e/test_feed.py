"""The downstream feed on the real broker, from a gold table written with delta-rs (Change Data
Feed on, versions made by hand: first publication, a correction, a finalization, a change
without a new revision, a removal): the publisher SIGKILLed just before and just after a
commit publishes every (key, revision) once after its restart; a second publisher fences the
first; a `read_committed` fold of the topic holds exactly gold's closed rows. (The feed of a
Spark-written gold after real corrections: tests/e2e/test_reconciliation.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from conftest import REPO

from lakehouse.kafka import feed
from testkit.feed import committed_messages, fold, window_of

D = date(2026, 11, 30)
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
SCHEMA = pa.schema([
    ("event_date", pa.date32()), ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_end", pa.timestamp("us", tz="UTC")), ("key", pa.string()),
    ("event_count", pa.int64()), ("value_sum", pa.decimal128(38, 6)),
    ("value_min", pa.decimal128(38, 6)), ("value_max", pa.decimal128(38, 6)),
    ("event_fingerprint", pa.decimal128(38, 0)), ("revision", pa.int32()),
    ("status", pa.string()), ("updated_at", pa.timestamp("us", tz="UTC")),
])


def window(i: int, key: str, total: str, revision: int = 0, status: str = "final") -> dict:
    start = T0 + timedelta(minutes=i)
    v = Decimal(total)
    return {"event_date": D, "window_start": start, "window_end": start + timedelta(minutes=1),
            "key": key, "event_count": 2, "value_sum": v, "value_min": v / 2, "value_max": v / 2,
            "event_fingerprint": Decimal(i), "revision": revision, "status": status,
            "updated_at": datetime.now(UTC)}


def merge(path: str, rows: list[dict]) -> None:
    from deltalake import DeltaTable

    (DeltaTable(path).merge(pa.Table.from_pylist(rows, schema=SCHEMA),
                            "t.window_start = s.window_start AND t.key = s.key",
                            source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def gold_versions(settings) -> str:
    """Gold in four versions: 0 first publication (one window still open), 1 a correction, a
    finalization and a change at the same revision (as a write outside the pipeline would),
    2 a removal, 3 the removed window back at its next revision."""
    from deltalake import DeltaTable, write_deltalake

    path = settings.table_path("reconciled_aggregates")
    write_deltalake(path, pa.Table.from_pylist(
        [window(0, "a", "3"), window(1, "a", "4"), window(2, "b", "5"),
         window(3, "b", "6", status="open")], schema=SCHEMA),
        partition_by=["event_date"], configuration={"delta.enableChangeDataFeed": "true"})
    merge(path, [window(0, "a", "7", revision=1, status="corrected"),
                 window(3, "b", "6"), window(1, "a", "40")])
    DeltaTable(path).delete("window_start = '2026-11-30T10:02:00Z' AND key = 'b'")
    merge(path, [window(2, "b", "9", revision=2, status="corrected")])
    return path


PUBLISHER = textwrap.dedent("""
    import os, signal, sys
    from confluent_kafka import Producer
    from lakehouse.config.settings import Settings
    from lakehouse.kafka import feed

    point = sys.argv[1]

    class Dying(Producer):
        def commit_transaction(self, *args):
            if point == "before_commit":
                self.flush(10)  # the transaction's records are on the broker, uncommitted
                os.kill(os.getpid(), signal.SIGKILL)
            super().commit_transaction(*args)
            if point == "after_commit":
                os.kill(os.getpid(), signal.SIGKILL)

    feed.publish(Settings.from_env(), producer_factory=Dying)
""")


def killed_publisher(point: str) -> None:
    done = subprocess.run([sys.executable, "-c", PUBLISHER, point], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, (point, done.returncode, done.stderr[-2000:])


def every_revision_once_and_the_fold_is_gold(settings) -> None:
    """The topic after the restarted publisher: each window's revisions in order, none twice
    and none missing; the messages' fields; the fold equal to gold's closed rows (the window
    changed outside the pipeline at the same revision stays at what its revision published)."""
    from lakehouse.tables.reads import read

    messages = committed_messages(settings, settings.feed_topic)
    revisions = [(k["window_start"], k["key"], v and v["revision"]) for k, v in messages]
    assert len(set(revisions)) == len(revisions), revisions  # no (key, revision) twice
    per_key = defaultdict(list)
    for ws, key, revision in revisions:
        per_key[(ws, key)].append(revision)
    assert per_key == {
        ("2026-11-30T10:00:00Z", "a"): [0, 1],
        ("2026-11-30T10:01:00Z", "a"): [0],  # its same-revision change not sent
        ("2026-11-30T10:02:00Z", "b"): [0, None, 2],  # removed, then back at revision 2
        ("2026-11-30T10:03:00Z", "b"): [0],  # first sent when it closed
    }
    corrected = next(v for k, v in messages if v and v["revision"] == 1)
    assert corrected["before"] == {"event_count": 2, "value_sum": "3.000000",
                                   "value_min": "1.500000", "value_max": "1.500000"}
    assert corrected["value_sum"] == "7.000000" and corrected["status"] == "corrected"
    assert corrected["gold_version"] == 1 and corrected["window_end"] == "2026-11-30T10:01:00Z"
    assert "event_fingerprint" not in corrected

    gold = {window_of({"window_start": r["window_start"].isoformat().replace("+00:00", "Z"),
                       "key": r["key"]}): r
            for r in read(settings, "reconciled_aggregates").to_pylist()}
    folded = fold(messages)
    assert set(folded) == set(gold)
    touched = window_of({"window_start": "2026-11-30T10:01:00Z", "key": "a"})
    for k, v in folded.items():
        g = gold[k]
        assert (v["revision"], v["status"]) == (g["revision"], g["status"])
        assert (Decimal(v["value_sum"]) == g["value_sum"]) == (k != touched), k


def test_a_publisher_killed_before_its_commit_leaves_nothing_and_the_next_sends_it_once(
        instance_env):
    settings = instance_env
    gold_versions(settings)
    killed_publisher("before_commit")  # version 0's transaction left open, never committed
    assert feed.published_version(settings) == -1
    assert committed_messages(settings, settings.feed_topic) == []  # nothing visible
    # It aborts the open transaction and sends every version, through a local queue of one
    # message (a version larger than the queue drains it inside its transaction).
    result = feed.publish(settings, producer_factory=lambda conf: Producer(
        {**conf, "queue.buffering.max.messages": 1}))
    assert (result.first, result.last, result.transactions, result.messages) == (0, 3, 4, 7)
    every_revision_once_and_the_fold_is_gold(settings)


def test_a_publisher_killed_after_its_commit_is_continued_once_and_a_second_one_fences_it(
        instance_env, spark):
    from lakehouse.tables.catalog import RECONCILED
    from spark_jobs.maintenance import maintain_table

    settings = instance_env
    gold_versions(settings)
    # Nothing sent yet: table maintenance keeps gold's change data (no VACUUM), saying why.
    kept = maintain_table(spark, settings, RECONCILED, date.today())
    assert kept.files_vacuumed == 0 and "carries gold up to version -1 of 3" in kept.skipped

    killed_publisher("after_commit")  # version 0 committed, the process gone before version 1
    assert feed.published_version(settings) == 0
    first = committed_messages(settings, settings.feed_topic)
    assert sorted((k["window_start"], k["key"], v["revision"]) for k, v in first) == [
        ("2026-11-30T10:00:00Z", "a", 0), ("2026-11-30T10:01:00Z", "a", 0),
        ("2026-11-30T10:02:00Z", "b", 0)]  # the open window held back

    # A publisher that another one fences in the middle of its transaction stops, naming it.
    class Fenced(Producer):
        def begin_transaction(self):
            super().begin_transaction()
            rival = Producer({**settings.client_config,
                              "transactional.id": feed.transactional_id(settings)})
            rival.init_transactions(30)

    with pytest.raises(feed.FeedFenced, match="another publisher"):
        feed.publish(settings, producer_factory=Fenced)
    assert feed.published_version(settings) == 0

    result = feed.publish(settings)
    assert (result.first, result.last, result.published_version) == (1, 3, 3)
    assert (result.transactions, result.tombstones, result.unrevised) == (3, 1, 1)
    assert result.withheld_open == 0  # version 0's open window: closed by version 1
    assert feed.publish(settings).transactions == 0  # nothing new: nothing sent
    assert maintain_table(spark, settings, RECONCILED, date.today()).skipped == ""
    every_revision_once_and_the_fold_is_gold(settings)
