"""Writes of small data to the Delta tables with delta-rs, from the driver, on a local root:
milliseconds instead of a Spark write, which pays for the table's snapshot (the state rebuilt by
Spark jobs, ~6 s in a one-run process's cold JVM on 2 cores) and its own jobs. Spark reads what
these write as any table.

On an object store every writer goes through Spark (delta-rs' commits there need a locking
provider or conditional puts the store may not offer): `append_rows` returns False there,
`replace_date` is for local roots only (`settings.local_root`)."""

from __future__ import annotations

from datetime import date

import pyarrow as pa

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log


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
    if settings.local_root is None:
        raise ValueError(f"replace_date writes on a local root only, not {settings.root}")
    from deltalake import write_deltalake

    table = delta_log.open_table(settings, name)
    if table is None:
        raise FileNotFoundError(f"no Delta table {name} under {settings.root}")
    schema = pa.schema(table.schema().to_arrow())
    data = schema.empty_table() if data is None else data.select(schema.names).cast(schema)
    write_deltalake(table, data, mode="overwrite",
                    predicate=f"event_date = '{d.isoformat()}'")
