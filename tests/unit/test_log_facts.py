"""Facts a corrections run takes from the Delta log instead of a Spark job: whether commits
changed a date's partition (`partition_changed`), and a partition's row counts from the files'
statistics (`partition_rows`). Each says None when the log cannot tell, never a guess (tables
written with delta-rs here: no JVM)."""

import os
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.tables.delta_log import partition_changed
from lakehouse.tables.stats import partition_rows

D1, D2 = date(2026, 11, 25), date(2026, 11, 26)
T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)
SCHEMA = pa.schema([("event_date", pa.date32()), ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
                    ("x", pa.int64())])


def rows(day: date, *stamps: datetime) -> pa.Table:
    return pa.table({"event_date": [day] * len(stamps), "kafka_timestamp": list(stamps),
                     "x": range(len(stamps))}, schema=SCHEMA)


def append(path: str, table: pa.Table) -> None:
    write_deltalake(path, table, mode="append", partition_by=["event_date"])


def test_a_partition_changes_only_by_data_changing_files_in_it(tmp_path):
    path = str(tmp_path / "bronze")
    append(path, rows(D1, T0))                         # v0
    append(path, rows(D2, T0))                         # v1: the other date
    assert partition_changed(path, "event_date", D1.isoformat(), 1, 1) is False
    assert partition_changed(path, "event_date", D2.isoformat(), 1, 1) is True
    append(path, rows(D1, T0, T0))                     # v2
    DeltaTable(path).optimize.compact()                # v3: rewrites files, changes no row
    assert DeltaTable(path).version() == 3
    assert partition_changed(path, "event_date", D1.isoformat(), 3, 3) is False
    assert partition_changed(path, "event_date", D1.isoformat(), 1, 3) is True
    DeltaTable(path).delete("event_date = '2026-11-26'")  # v4: removes with data change
    assert partition_changed(path, "event_date", D2.isoformat(), 4, 4) is True
    assert partition_changed(path, "event_date", D1.isoformat(), 4, 4) is False


def test_it_cannot_tell_without_the_commits_or_the_partitioning(tmp_path):
    path = str(tmp_path / "bronze")
    for _ in range(3):
        append(path, rows(D2, T0))
    assert partition_changed(path, "event_date", D1.isoformat(), 1, 2, max_commits=1) is None
    os.remove(f"{path}/_delta_log/{1:020d}.json")  # a log cleanup
    assert partition_changed(path, "event_date", D1.isoformat(), 1, 2) is None
    flat = str(tmp_path / "flat")
    write_deltalake(flat, rows(D1, T0))
    write_deltalake(flat, rows(D2, T0), mode="append")
    assert partition_changed(flat, "event_date", D1.isoformat(), 1, 1) is None


def test_partition_rows_from_statistics(tmp_path):
    settings = Settings(lakehouse_root=str(tmp_path))
    path = settings.table_path("bronze_events")
    assert partition_rows(settings, "bronze_events", "event_date", D1) == 0  # no table
    ms = timedelta(milliseconds=1)
    append(path, rows(D1, T0, T0 + ms))                          # v0: one file
    append(path, rows(D1, T0 + timedelta(hours=1)))              # v1
    append(path, rows(D2, T0, T0, T0))                           # v2
    count = lambda **kw: partition_rows(settings, "bronze_events", "event_date", D1, **kw)  # noqa: E731
    assert count() == 3
    assert count(at=0) == 2
    assert partition_rows(settings, "bronze_events", "event_date", D2) == 3
    assert count(above=("kafka_timestamp", T0 - ms)) == 3           # every file above
    assert count(above=("kafka_timestamp", T0 + timedelta(hours=2))) == 0
    assert count(above=("kafka_timestamp", T0 + 2 * ms)) == 1        # only the later file
    # The first file holds T0 and T0 + 1 ms: a bound between them needs the rows, not the stats.
    assert count(above=("kafka_timestamp", T0)) is None
    # Its recorded maximum may be up to 1 ms below its true one: at that edge, no guess either.
    assert count(above=("kafka_timestamp", T0 + ms)) is None
    flat = Settings(lakehouse_root=str(tmp_path / "flat"))
    write_deltalake(flat.table_path("late_events"), rows(D1, T0))
    assert partition_rows(flat, "late_events", "event_date", D1) is None  # not partitioned by it


def test_an_idempotent_append_writes_a_version_of_its_application_once(tmp_path):
    """`append_rows` with (application id, version), the `txn` action Spark's
    txnAppId/txnVersion writes: the same or an older version of the id appends nothing."""
    from lakehouse.tables.local_writes import append_rows

    settings = Settings(lakehouse_root=str(tmp_path))
    append(str(tmp_path / "t"), rows(D1, T0))
    row = {"event_date": D1, "kafka_timestamp": T0, "x": 7}
    assert append_rows(settings, "t", [row, row], ("query-1", 3))
    assert append_rows(settings, "t", [row], ("query-1", 3))      # again: nothing
    assert append_rows(settings, "t", [row], ("query-1", 2))      # older: nothing
    assert append_rows(settings, "t", [row], ("query-2", 0))      # another id
    assert append_rows(settings, "t", [row], ("query-1", 4))
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().num_rows == 1 + 2 + 1 + 1
    assert table.transaction_version("query-1") == 4
    assert not append_rows(settings, "missing", [row], ("query-1", 5))  # no such table


def test_replacing_a_date_rewrites_that_partition_only_in_one_commit(tmp_path):
    """`replace_date` (a small replay's write on a local root): the date's rows become the
    given ones (None: none), other dates stay, rows of another date are refused, and it is
    for local roots only."""
    import pytest

    from lakehouse.tables.local_writes import replace_date

    settings = Settings(lakehouse_root=str(tmp_path))
    path = str(tmp_path / "t")
    append(path, rows(D1, T0, T0))
    append(path, rows(D2, T0))
    before = DeltaTable(path).version()
    new = pa.table({"x": [41, 42, 43], "kafka_timestamp": [T0] * 3, "event_date": [D1] * 3})
    replace_date(settings, "t", D1, new)  # columns in another order, int64 cast
    table = DeltaTable(path)
    assert table.version() == before + 1
    got = table.to_pyarrow_table()
    assert sorted(got.filter(pc.equal(got["event_date"], D1))["x"].to_pylist()) == [
        41, 42, 43]
    assert got.filter(pc.equal(got["event_date"], D2))["x"].to_pylist() == [0]
    with pytest.raises(Exception, match="validation"):
        replace_date(settings, "t", D1, rows(D2, T0))
    replace_date(settings, "t", D1, None)
    assert DeltaTable(path).to_pyarrow_table()["event_date"].to_pylist() == [D2]
    with pytest.raises(ValueError, match="local root"):
        replace_date(Settings(lakehouse_root="s3a://bucket/lh"), "t", D1, None)


def test_replacing_different_dates_at_once_loses_no_commit(tmp_path):
    """Replays of different dates run at once (each under its own date lock): their delta-rs
    overwrites race for the same table versions, and each date ends with its last rows."""
    import threading

    from lakehouse.tables.local_writes import replace_date

    settings = Settings(lakehouse_root=str(tmp_path))
    path = str(tmp_path / "t")
    append(path, rows(D1, T0))
    before = DeltaTable(path).version()
    days = [D1, D2, date(2026, 11, 27)]
    errors: list[BaseException] = []

    def replay(day: date) -> None:
        for i in range(8):
            try:
                replace_date(settings, "t", day, pa.table(
                    {"event_date": [day] * 2, "kafka_timestamp": [T0] * 2, "x": [i, i]}))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

    threads = [threading.Thread(target=replay, args=(day,)) for day in days]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = DeltaTable(path).to_pyarrow_table()
    assert sorted(zip(got["event_date"].to_pylist(), got["x"].to_pylist(), strict=True)) == sorted(
        (day, 7) for day in days for _ in range(2))
    assert DeltaTable(path).version() == before + len(days) * 8  # every commit landed


def test_replacing_the_open_partitions_lands_every_row_in_one_tagged_commit(tmp_path):
    """`replace_partitions` (a streaming batch's publication on a local root): the files of
    status = 'open' are replaced, rows of other partitions are added there, the commit carries
    the tag as its userMetadata, and the files' statistics hold their row counts and the exact
    bounds of the columns given; the open rows are read only within the caller's bound;
    `plain_table` refuses a table with change data feed."""
    import pytest

    from lakehouse.tables import delta_log
    from lakehouse.tables.local_writes import partition_rows_of, plain_table, replace_partitions
    from lakehouse.tables.stats import add_actions

    settings = Settings(lakehouse_root=str(tmp_path))
    schema = pa.schema([("event_date", pa.date32()), ("status", pa.string()),
                        ("window_end", pa.timestamp("us", tz="UTC")), ("n", pa.int64()),
                        ("updated_at", pa.timestamp("us", tz="UTC"))])
    w1, w2 = T0, T0 + timedelta(minutes=1)
    stamp = T0 + timedelta(microseconds=7)

    def table(*rows):
        return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows],
                                    schema=schema)

    path = str(tmp_path / "agg")
    write_deltalake(path, table((D1, "final", w1 - timedelta(minutes=1), 5, stamp),
                                (D1, "open", w1, 1, stamp), (D2, "open", w2, 2, stamp)),
                    partition_by=["event_date", "status"])
    opened = delta_log.open_table(settings, "agg")
    assert plain_table(settings, opened)
    assert partition_rows_of(opened, "status", "open", at_most=2).num_rows == 2
    # More rows there than the caller's bound (the log's statistics tell): nothing read.
    assert partition_rows_of(opened, "status", "open", at_most=1) is None
    # An empty table's open rows (none) fit any bound but a negative one (a batch's records
    # alone past the driver's bound).
    write_deltalake(str(tmp_path / "empty"), table(), partition_by=["event_date", "status"])
    empty = delta_log.open_table(settings, "empty")
    assert partition_rows_of(empty, "status", "open", at_most=0).num_rows == 0
    assert partition_rows_of(empty, "status", "open", at_most=-1) is None
    # w1 closes (its row goes to the final partition), w2 gets 3 more, a new open window.
    replace_partitions(settings, opened, "status", "open", table(
        (D1, "final", w1, 1, stamp), (D2, "open", w2, 5, stamp),
        (D2, "open", w2 + timedelta(minutes=1), 4, stamp)), "tag:q:7",
        exact_ms=("window_end", "updated_at"))
    dt = DeltaTable(path)
    assert dt.version() == 1
    got = sorted((r["status"], r["window_end"], r["n"]) for r in dt.to_pyarrow_table().to_pylist())
    assert got == sorted([("final", w1 - timedelta(minutes=1), 5), ("final", w1, 1),
                          ("open", w2, 5), ("open", w2 + timedelta(minutes=1), 4)])
    assert delta_log.commits(settings, "agg", 1)[0]["userMetadata"] == "tag:q:7"
    actions = add_actions(settings, "agg")
    new = actions.filter(pc.equal(actions["num_records"], 2))
    assert new["min.window_end"].to_pylist() == [w2]
    assert new["max.window_end"].to_pylist() == [w2 + timedelta(minutes=1)]
    # Statistics are in milliseconds: a maximum between two is rounded up, never down.
    assert new["min.updated_at"].to_pylist() == [T0]
    assert new["max.updated_at"].to_pylist() == [T0 + timedelta(milliseconds=1)]
    assert sum(actions["num_records"].to_pylist()) == 4
    with pytest.raises(ValueError, match="not partitioned by"):
        replace_partitions(settings, opened, "x", "open", table(), "t")
    write_deltalake(str(tmp_path / "cdf"), table((D1, "open", w1, 1, stamp)),
                    configuration={"delta.enableChangeDataFeed": "true"})
    assert not plain_table(settings, delta_log.open_table(settings, "cdf"))
    assert not plain_table(settings, None)
    assert not plain_table(Settings(lakehouse_root="s3a://bucket/lh"), opened)


def test_a_writer_whose_lock_is_lost_commits_nothing(tmp_path):
    """The one writer checks its lock's fence last before the commit: with the lock lost, its
    delta-rs commits (a replay's date, a state row) raise WriterLockLost and the table keeps its
    version; with the lock held they commit."""
    import types

    import pytest

    from lakehouse.tables.locks import Fence, WriterLockLost
    from spark_jobs.writer import Writer

    class Lost(Fence):
        def check(self) -> None:
            raise WriterLockLost("t: the writer lock is no longer held; not committing")

    settings = Settings(lakehouse_root=str(tmp_path))
    path = str(tmp_path / "t")
    append(path, rows(D1, T0))
    before = DeltaTable(path).version()
    table = types.SimpleNamespace(name="t")
    stale = Writer(None, settings, Lost())
    with pytest.raises(WriterLockLost, match="not committing"):
        stale.replace_date(table, D1, None)
    with pytest.raises(WriterLockLost, match="not committing"):
        stale.append_rows(table, [{"x": 1, "kafka_timestamp": T0, "event_date": D1}])
    assert DeltaTable(path).version() == before
    Writer(None, settings).replace_date(table, D1, None)  # a held lock (a file lock's fence)
    assert DeltaTable(path).version() == before + 1
