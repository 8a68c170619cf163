"""The newest row of a date in the small append-only state tables (`corrections_state`,
`replay_state`), read with delta-rs: a few milliseconds instead of a Spark query per read (about
a second each on 2 cores, three per reconciliation run, all log replay and job scheduling for a
one-partition table of a few rows). Their rows are appended by `spark_jobs.writer`
(`Writer.append_rows`)."""

from __future__ import annotations

from datetime import date
from types import SimpleNamespace

import pyarrow.compute as pc

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.reads import read


def latest_row(settings: Settings, name: str, d: date, order_by: tuple[str, ...],
               **equal) -> SimpleNamespace | None:
    """The row of event date `d` in table `name` that is first by the `order_by` columns, all
    descending, among those where column == value for each keyword; None when there is none or
    the table does not exist yet. Columns are attributes of the row; timestamps are aware UTC
    datetimes."""
    if not delta_log.exists(settings, name):
        return None
    rows = read(settings, name, d)
    for column, value in equal.items():
        rows = rows.filter(pc.equal(rows[column], value))
    if rows.num_rows == 0:
        return None
    first = rows.sort_by([(c, "descending") for c in order_by]).slice(0, 1).to_pylist()[0]
    return SimpleNamespace(**first)

