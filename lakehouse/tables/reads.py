"""Tables read with delta-rs (no Spark): the demo report, proof that the tables are plain Delta
tables any reader opens, and the small date partitions the daily jobs hand to Spark as Arrow."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from lakehouse.config.settings import Settings
from lakehouse.tables.stats import add_actions

# The most rows a daily job moves through the driver as Arrow, with delta-rs on a local root,
# instead of Spark's Delta reader or writer: a date's partition of a window table, a replay's
# windows. Spark's way pays for each table's snapshot (its state rebuilt by Spark jobs: 1-6 s
# per table in a one-run process's cold JVM on 2 cores); a million rows of windows are ~150 MB.
DRIVER_ROWS_MAX = 1_000_000


def read(settings: Settings, name: str, event_date: date | None = None):
    """A table as a pyarrow Table (optionally one event_date partition)."""
    uri, options = settings.delta_rs(name)
    dt = DeltaTable(uri, storage_options=options)
    if "deletionVectors" in (dt.protocol().reader_features or []):
        # A table with deletion vectors (a streaming_aggregates of a release before 2026-11-25):
        # delta-rs' pyarrow dataset does not apply them; its query engine does.
        where = f" WHERE event_date = DATE '{event_date.isoformat()}'" if event_date else ""
        table = pa.table(QueryBuilder().register("t", dt).execute(f"SELECT * FROM t{where}").read_all())
        return table.cast(pa.schema([pa.field(f.name, _plain(f.type), f.nullable)
                                     for f in table.schema]))
    filters = [("event_date", "=", event_date)] if event_date else None
    return dt.to_pyarrow_table(filters=filters)


def _plain(t: pa.DataType) -> pa.DataType:
    """The query engine's view types as the plain ones every other read returns."""
    return {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}.get(t, t)


def bronze_dates(settings: Settings) -> set[date]:
    """Event dates that have bronze data, from the Delta log alone (no data file is read)."""

    actions = add_actions(settings, "bronze_events")
    if actions is None or "partition.event_date" not in actions.column_names:
        return set()
    return {date.fromisoformat(str(v)) for v in actions["partition.event_date"].to_pylist() if v}


def table_counts(settings: Settings) -> dict:
    bronze = read(settings, "bronze_events")
    quarantine = read(settings, "quarantined_events")
    pairs = set(zip(bronze["event_date"].to_pylist(), bronze["event_id"].to_pylist(), strict=True))
    reasons = quarantine.group_by("reason").aggregate([("reason", "count")]).to_pylist()
    return {
        "bronze_rows": bronze.num_rows,
        "bronze_dates": set(bronze["event_date"].to_pylist()),
        "duplicate_rows": bronze.num_rows - len(pairs),
        "quarantined": quarantine.num_rows,
        "quarantine_reasons": {r["reason"]: r["reason_count"] for r in reasons},
        "late_events": read(settings, "late_events").num_rows,
        "streaming_windows": read(settings, "streaming_aggregates").num_rows,
        "reconciled_windows": read(settings, "reconciled_aggregates").num_rows,
        "corrections": read(settings, "late_corrections").num_rows,
        # Each measure field summed over bronze (the default pipeline's: value_sum_bronze).
        **{f"{f}_sum_bronze": pc.sum(bronze[f]).as_py() if bronze.num_rows else 0
           for f in settings.shape.measure_fields},
    }


def _rows(settings: Settings, name: str, d: date) -> dict:
    keys, measures = settings.shape.window_id, settings.shape.measure_columns
    t = read(settings, name, d).select([*keys, *measures]).to_pylist()
    return {tuple(r[k] for k in keys): tuple(r[m] for m in measures) for r in t}


def compare_tables(settings: Settings, d: date, left: str = "reconciled_aggregates",
                   right: str = "replay_aggregates") -> int:
    """Number of windows of `d` that differ (exact Decimal comparison) or exist on one side."""
    a, b = _rows(settings, left, d), _rows(settings, right, d)
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))
