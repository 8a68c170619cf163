"""Table totals from the Delta log alone: the add actions' statistics (`numRecords`, per-column
max), no data file read. Their cost follows the number of files in the snapshot, not the rows,
so run metadata stays as cheap on years of history as on a fresh lakehouse."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from lakehouse.settings import Settings


@dataclass(frozen=True)
class LogStats:
    """`rows` is None when a file of the snapshot carries no statistics (the total would be a
    guess); `max` maps each requested column to its largest value over the files' statistics
    (None when the table is empty or a file lacks the statistic)."""

    rows: int | None
    files: int
    max: dict[str, object] = field(default_factory=dict)


def log_stats(settings: Settings, name: str, max_of: tuple[str, ...] = ()) -> LogStats:
    uri, options = settings.delta_rs(name)
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return LogStats(0, 0, dict.fromkeys(max_of))
    actions = pa.table(DeltaTable(uri, storage_options=options).get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return LogStats(0, 0, dict.fromkeys(max_of))
    return LogStats(
        rows=_total(actions, "num_records"),
        files=actions.num_rows,
        max={c: _max(actions, f"max.{c}") for c in max_of},
    )


def _total(actions: pa.Table, column: str) -> int | None:
    if column not in actions.column_names or actions[column].null_count:
        return None
    return int(pc.sum(actions[column]).as_py() or 0)


def _max(actions: pa.Table, column: str):
    if column not in actions.column_names or actions[column].null_count:
        return None
    return pc.max(actions[column]).as_py()
