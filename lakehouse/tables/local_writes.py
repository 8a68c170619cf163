"""Writes of small data to the Delta tables with delta-rs, from the driver, on a local root:
milliseconds instead of a Spark write, which pays for the table's snapshot (the state rebuilt by
Spark jobs, ~6 s in a one-run process's cold JVM on 2 cores) and its own jobs. Spark reads what
these write as any table.

The delta-rs half of the one writer: only `spark_jobs.writer` calls these (it checks the
writer's lock first and picks them or Spark). On an object store every commit goes through
Spark (delta-rs' commits there need a locking provider or conditional puts the store may not
offer): `append_rows` returns False there, `replace_date` is for local roots only
(`settings.local_root`)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.stats import flat_actions


def append_rows(settings: Settings, name: str, rows: list[dict],
                app: tuple[str, int] | None = None) -> bool:
    """Append `rows` (column -> value) to table `name` with delta-rs, on a local root; False on
    an object store or when the table does not exist, where the caller appends through Spark.
    On a local root the tables appended this way take no Spark append, which would pay for the
    commits Spark did not write (it rebuilds the state for their missing checksum, ~1.5 s).

    `app` = (application id, version): an idempotent append, as Spark's txnAppId/txnVersion
    (the same `txn` action in the log): nothing is written when the table already records that
    version or a newer one of the application id."""
    if settings.local_root is None:
        return False
    from deltalake import CommitProperties, Transaction, write_deltalake

    table = delta_log.open_table(settings, name)
    if table is None:
        return False
    if app is not None:
        done = table.transaction_version(app[0])
        if done is not None and done >= app[1]:
            return True
    schema = pa.schema(table.schema().to_arrow())
    write_deltalake(table, pa.Table.from_pylist(rows, schema=schema), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(*app)])
                    if app is not None else None)
    return True


def replace_date(settings: Settings, name: str, d: date, data: pa.Table | None) -> None:
    """Replace the rows of event date `d` in table `name` (partitioned by `event_date`, on a
    local root) with `data` (None: no rows), in one commit: Spark's `replaceWhere` overwrite as
    delta-rs' overwrite with a predicate. `data` holds the table's columns (any order; types
    cast to the table's, an error if a value does not fit) and only rows of `d` (delta-rs
    refuses others)."""
    from deltalake import write_deltalake

    if settings.local_root is None:
        raise ValueError(f"replace_date writes on a local root only, not {settings.root}")
    table = delta_log.open_table(settings, name)
    if table is None:
        raise FileNotFoundError(f"no Delta table {name} under {settings.root}")
    schema = pa.schema(table.schema().to_arrow())
    data = schema.empty_table() if data is None else data.select(schema.names).cast(schema)
    write_deltalake(table, data, mode="overwrite",
                    predicate=f"event_date = '{d.isoformat()}'")


# Statistics a `replace_partitions` file carries beyond `numRecords` and `nullCount`: the
# columns whose minimum and maximum are exact as Delta's statistics write them (integers, and
# timestamps on whole milliseconds, as a window's bounds are). Others (decimals, strings,
# microsecond timestamps) carry none: a reader then reads the file rather than skip it wrongly.
EXACT_STATS_TYPES = (pa.types.is_integer, pa.types.is_date)


def _stats_time(v: datetime) -> str:
    """A timestamp as Delta's statistics write it: UTC, milliseconds (cut)."""
    return v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _stats(data: pa.Table, exact_ms: tuple[str, ...]) -> str:
    import json

    import pyarrow.compute as pc

    stats: dict = {"numRecords": data.num_rows,
                   "nullCount": {c: data[c].null_count for c in data.column_names}}
    low, high = {}, {}
    for name in data.column_names:
        kind = data.schema.field(name).type
        if data.num_rows == data[name].null_count:
            continue
        if pa.types.is_timestamp(kind) and name in exact_ms:
            bounds = pc.min_max(data[name]).as_py()
            top = bounds["max"]  # a maximum cut to milliseconds must not fall below the value
            top += timedelta(microseconds=-top.microsecond % 1000)
            low[name], high[name] = (_stats_time(bounds["min"]), _stats_time(top))
        elif any(test(kind) for test in EXACT_STATS_TYPES):
            bounds = pc.min_max(data[name]).as_py()
            low[name], high[name] = (str(v) if pa.types.is_date(kind) else v
                                     for v in (bounds["min"], bounds["max"]))
    if low:
        stats["minValues"], stats["maxValues"] = low, high
    return json.dumps(stats, separators=(",", ":"))


def plain_table(settings: Settings, table) -> bool:
    """Whether `replace_partitions` may write `table` (a delta-rs `DeltaTable`, None: no
    table): a local root, and a table of the first protocols (reader 1, writer <= 2: NOT NULL
    invariants at most; no table features such as deletion vectors, no change data feed, no
    column mapping), whose files it writes as Spark would. A `streaming_aggregates` of a
    release before 2026-11-25 has deletion vectors: Spark writes it."""
    if settings.local_root is None or table is None:
        return False
    protocol, config = table.protocol(), table.metadata().configuration
    return (protocol.min_reader_version == 1 and protocol.min_writer_version <= 2
            and config.get("delta.enableChangeDataFeed", "false") != "true"
            and config.get("delta.columnMapping.mode", "none") == "none")


def partition_rows_of(table, column: str, value: str, at_most: int) -> pa.Table | None:
    """The rows of `table` (a delta-rs `DeltaTable` that `plain_table` accepts) in the
    partitions where `column` = `value`; None, nothing read, unless the log's file statistics
    show at most `at_most` rows there (the caller then goes through Spark: the driver holds
    only what its memory is sized for)."""
    import pyarrow.compute as pc

    actions = flat_actions(table)
    if actions.num_rows:
        files = actions.filter(pc.equal(actions[f"partition.{column}"], value))
        rows = files["num_records"]
        if rows.null_count or (pc.sum(rows).as_py() or 0) > at_most:
            return None
    elif at_most < 0:
        return None
    return table.to_pyarrow_table(filters=[(column, "=", value)])


def replace_partitions(settings: Settings, table, column: str, value: str,
                       data: pa.Table, user_metadata: str,
                       exact_ms: tuple[str, ...] = ()) -> None:
    """Replace every file of `table`'s partitions (a delta-rs `DeltaTable` opened by the
    caller, on a local root) where `column` = `value` with `data`, which may also
    hold rows of other partitions (they are added there), in one commit tagged with
    `user_metadata` (its commit info's `userMetadata`, as Spark's option of that name). Spark's
    `replaceWhere` overwrite without its check that every row matches the condition, from the
    driver on a local root: no snapshot state rebuilt by Spark jobs, no job for the files to
    remove (a streaming batch's publication: ~2.5 -> ~0.65 s and 4 -> 1 Spark jobs, the fold
    left to Spark; 2026-11-29 on 6aae93d, end to end in
    bench/results/service-peers-2026-11-29T081321.json). Files get `numRecords`,
    `nullCount` and exact minima and maxima (`EXACT_STATS_TYPES`, and the `exact_ms`
    timestamp columns)."""
    import os
    import time
    import uuid

    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from deltalake import CommitProperties
    from deltalake.transaction import AddAction, RemoveAction

    if settings.local_root is None:
        raise ValueError(f"replace_partitions writes on a local root only, not {settings.root}")
    parts = list(table.metadata().partition_columns)
    if column not in parts:
        raise ValueError(f"{table.table_uri} is not partitioned by {column}")
    schema = pa.schema(table.schema().to_arrow())
    data = data.select(schema.names).cast(schema)
    files = pa.table(table.get_add_actions(flatten=True))
    now = int(time.time() * 1000)
    removes = [] if f"partition.{column}" not in files.column_names else [
        RemoveAction(path, True, now, size, None) for path, size, v in zip(
            files["path"].to_pylist(), files["size_bytes"].to_pylist(),
            files[f"partition.{column}"].to_pylist(), strict=True) if v == value]
    root = Path(table.table_uri.removeprefix("file://"))
    adds = []
    for key in data.select(parts).group_by(parts).aggregate([]).to_pylist():
        where = None
        for c in parts:
            cond = pc.is_null(data[c]) if key[c] is None else pc.equal(data[c], key[c])
            where = cond if where is None else pc.and_(where, cond)
        rows = data.filter(where).drop_columns(parts)
        values = {c: None if key[c] is None else
                  (key[c].isoformat() if hasattr(key[c], "isoformat") else str(key[c]))
                  for c in parts}
        folder = "/".join(f"{c}={'__HIVE_DEFAULT_PARTITION__' if v is None else v}"
                          for c, v in values.items())
        path = f"{folder}/part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        os.makedirs(root / folder, exist_ok=True)
        pq.write_table(rows, root / path, compression="snappy")
        adds.append(AddAction(path, (root / path).stat().st_size, values, now, True,
                              _stats(rows, exact_ms)))
    table.create_write_transaction(
        [*adds, *removes], "append", schema, partition_by=parts,
        commit_properties=CommitProperties(custom_metadata={"userMetadata": user_metadata}))
