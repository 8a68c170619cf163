"""Table facts from the Delta log alone: the add actions' statistics (`numRecords`, per-column
max), no data file read. Their cost follows the number of files in the snapshot, not the rows,
so run metadata stays as cheap on years of history as on a fresh lakehouse."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.config.settings import Settings
from lakehouse.tables.delta_log import open_table


@dataclass(frozen=True)
class LogStats:
    """`rows` is None when a file of the snapshot carries no statistics (the total would be a
    guess); `max` maps each requested column to its largest value over the files' statistics
    (None when the table is empty or a file lacks the statistic)."""

    rows: int | None
    files: int
    max: dict[str, object] = field(default_factory=dict)


def flat_actions(table) -> pa.Table:
    """A snapshot's add actions, flattened (`num_records`, `min.<col>`, `max.<col>`,
    `null_count.<col>`, `partition.<col>`)."""
    return pa.table(table.get_add_actions(flatten=True))


def add_actions(settings: Settings, name: str) -> pa.Table | None:
    """The current snapshot's add actions (`flat_actions`), or None when the table does not
    exist yet."""
    table = open_table(settings, name)
    return None if table is None else flat_actions(table)


def log_stats(settings: Settings, name: str, max_of: tuple[str, ...] = ()) -> LogStats:
    table = open_table(settings, name)
    actions = None if table is None else flat_actions(table)
    if actions is None or actions.num_rows == 0:
        return LogStats(0, 0, dict.fromkeys(max_of))
    rows = _complete(actions, "num_records", pc.sum)
    if rows is not None and "deletionVectors" in (table.protocol().reader_features or []):
        # Rows a MERGE replaced are still in their files' numRecords: subtract them (each
        # deletion vector of the snapshot is read: small files, one per file with deletions).
        rows -= sum(v.count(False) for v in
                    pa.table(table.deletion_vectors())["selection_vector"].to_pylist())
    return LogStats(
        rows=rows,
        files=actions.num_rows,
        max={c: _complete(actions, f"max.{c}", pc.max) for c in max_of},
    )


def largest_file_max_at_most(settings: Settings, name: str, column: str,
                             bound: datetime) -> datetime | None:
    """The largest per-file maximum of `column` that is <= `bound`. Every row of such a file is
    <= `bound`, so the table's largest value <= `bound` is this one or lies in a file whose
    maximum is above it: a query can skip every other file."""
    actions = add_actions(settings, name)
    if actions is None or f"max.{column}" not in actions.column_names:
        return None
    return max((v for v in actions[f"max.{column}"].to_pylist() if v is not None and v <= bound),
               default=None)


def all_null(settings: Settings, name: str, column: str) -> bool:
    """Whether the files' statistics show `column` null in every row of table `name` (True for
    an empty or missing table; False when a file lacks the statistic): a query for its
    non-null rows can be skipped."""
    actions = add_actions(settings, name)
    if actions is None or actions.num_rows == 0:
        return True
    nulls = f"null_count.{column}"
    if nulls not in actions.column_names or actions[nulls].null_count \
            or actions["num_records"].null_count:
        return False
    return pc.all(pc.equal(actions[nulls], actions["num_records"])).as_py()


def _complete(actions: pa.Table, column: str, fold):
    """`fold` over a statistic every file carries; None if any file lacks it."""
    if column not in actions.column_names or actions[column].null_count:
        return None
    return fold(actions[column]).as_py()


def _in_partitions(actions: pa.Table, column: str, values: list) -> pa.Table:
    """The add actions of the partitions `column` in `values` (dates; the log holds them as
    dates or as ISO text)."""
    held = actions[f"partition.{column}"]
    wanted = [v if pa.types.is_date(held.type) else v.isoformat() for v in values]
    return actions.filter(pc.is_in(held, value_set=pa.array(wanted, held.type)))


def rows_of_dates(settings: Settings, name: str, column: str, dates: list | None) -> int:
    """Rows of table `name` in the partitions of `column` holding `dates` (None: every row),
    from the add actions' `numRecords` (0 when the table does not exist). An upper bound where
    deletion vectors hide rows (a run's size, not a total: `partition_rows` is exact or None)."""
    actions = add_actions(settings, name)
    if actions is None or actions.num_rows == 0:
        return 0
    if dates is not None:
        actions = _in_partitions(actions, column, dates)
    return int(pc.sum(actions["num_records"]).as_py() or 0)


# Delta keeps timestamp statistics in milliseconds, truncated: a file's true maximum can lie up
# to this much above its recorded one (its minimum is never below the recorded one).
_STATS_PRECISION = timedelta(milliseconds=1)


def partition_rows(settings: Settings, name: str, column: str, value: date,
                   at: int | None = None,
                   above: tuple[str, datetime] | None = None) -> int | None:
    """Rows of table `name` (at version `at`, default the newest) in the partition `column` =
    `value`; with `above` = (c, bound), only those whose timestamp column `c` is > bound. From
    the add actions' statistics alone (0 when the table does not exist); None when they cannot
    tell: the table has deletion vectors (`numRecords` counts deleted rows), is not partitioned
    by `column`, a file lacks the statistic, or a file holds values of `c` on both sides of the
    bound (then count with a query)."""
    table = open_table(settings, name, at)
    if table is None:
        return 0
    if "deletionVectors" in (table.protocol().reader_features or []):
        return None
    actions = flat_actions(table)
    if actions.num_rows == 0:
        return 0
    if f"partition.{column}" not in actions.column_names:  # not partitioned by it
        return None
    actions = _in_partitions(actions, column, [value])
    if actions["num_records"].null_count:
        return None
    if above is None:
        return int(pc.sum(actions["num_records"]).as_py() or 0)
    c, bound = above
    stats = [f"min.{c}", f"max.{c}", f"null_count.{c}"]
    if actions.num_rows and any(s not in actions.column_names or actions[s].null_count
                                for s in stats):
        return None
    rows = 0
    for n, lo, hi, nulls in zip(actions["num_records"].to_pylist(),
                                *(actions[s].to_pylist() for s in stats), strict=True):
        if n == nulls:  # every value null: none above
            continue
        if lo > bound:
            rows += n - nulls
        elif hi + _STATS_PRECISION > bound:  # may hold values on either side
            return None
    return rows
