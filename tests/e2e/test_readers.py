"""Tables for other readers: `reconciled_aggregates`, `late_corrections` (docs/design.md §5) and
the live `streaming_aggregates` read without Spark, through delta-rs (`deltalake`) and polars,
hold exactly what Spark reads, and the Change Data Feed of the gold table read by delta-rs shows
the revisions the changelog records, as Spark's `readChangeFeed` does. The tables are the
end-to-end scenario's (conftest `scenario`: a published date corrected by late events), built by
the real pipeline through Dagster."""

from collections import Counter
from datetime import datetime

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakehouse.config.settings import utc
from lakehouse.events.shape import DEFAULT_SHAPE

MEASURES = DEFAULT_SHAPE.measure_columns


def normalized(values) -> tuple:
    """One row as comparable values: aware UTC datetimes (Spark collects naive local ones)."""
    return tuple(utc(v) if isinstance(v, datetime) else v for v in values)


def by_spark(spark, path: str, columns: list[str], change_feed: bool = False) -> Counter:
    reader = spark.read.format("delta")
    if change_feed:
        reader = reader.option("readChangeFeed", "true").option("startingVersion", 0)
    return Counter(normalized(r) for r in reader.load(path).select(*columns).collect())


def by_arrow(table: pa.Table, columns: list[str]) -> Counter:
    return Counter(normalized(r.values()) for r in table.select(columns).to_pylist())


def by_polars(frame, columns: list[str]) -> Counter:
    return Counter(normalized(r) for r in frame.select(columns).rows())


@pytest.mark.parametrize("name", ["reconciled_aggregates", "late_corrections",
                                  "streaming_aggregates"])
def test_delta_rs_and_polars_read_what_spark_reads(scenario, spark, name):
    settings = scenario[0]
    path = settings.table_path(name)
    columns = spark.read.format("delta").load(path).columns
    spark_rows = by_spark(spark, path, columns)
    assert spark_rows, name
    assert by_arrow(DeltaTable(path).to_pyarrow_table(), columns) == spark_rows
    assert by_polars(pl.read_delta(path), columns) == spark_rows
    # Exact types on the way out: decimals stay decimals, times stay UTC instants.
    schema = pl.read_delta(path).schema
    assert schema["window_start"] == pl.Datetime("us", "UTC")
    if name == "reconciled_aggregates":
        assert schema["value_sum"] == pl.Decimal(38, 6)
        revised = pl.read_delta(path).filter(pl.col("revision") > 0)
        assert revised.height and set(revised["status"]) == {"corrected"}
    elif name == "late_corrections":
        assert schema["after_value_sum"] == pl.Decimal(38, 6)
        assert "late_event" in set(pl.read_delta(path)["cause"])
    else:  # the live table: one row per window and key, open or final (a partition column)
        live = pl.read_delta(path)
        assert schema["value_sum"] == pl.Decimal(38, 6)
        assert set(live["status"]) <= {"open", "final"} and "final" in set(live["status"])
        assert live.select("window_start", "key").is_unique().all()
        still_open = pl.scan_delta(path).filter(pl.col("status") == "open").collect()
        assert still_open.height == (live["status"] == "open").sum()


def test_change_feed_of_gold_shows_each_revision_the_changelog_records(scenario, spark):
    from lakehouse.tables import delta_log
    from lakehouse.tables.catalog import RECONCILED

    settings = scenario[0]
    path = settings.table_path("reconciled_aggregates")
    gold = DeltaTable(path)
    assert gold.version() == delta_log.version(settings, RECONCILED.name)
    feed = pa.table(gold.load_cdf(starting_version=0))
    columns = [c for c in feed.column_names if c != "_commit_timestamp"]  # ms vs us precision
    assert by_arrow(feed, columns) == by_spark(spark, path, columns, change_feed=True)

    changes = pl.DataFrame(feed)
    assert set(changes["_change_type"]) >= {"insert", "update_preimage", "update_postimage"}
    changelog = pl.read_delta(settings.table_path("late_corrections"))
    assert changelog.height
    for c in changelog.iter_rows(named=True):
        window = (pl.col("window_start") == c["window_start"]) & (pl.col("key") == c["key"])
        post = changes.filter(window & (pl.col("_change_type") == "update_postimage")
                              & (pl.col("revision") == c["revision"]))
        assert post.height == 1, c
        after = post.row(0, named=True)
        assert after["status"] == "corrected"
        assert tuple(after[m] for m in MEASURES) == tuple(c[f"after_{m}"] for m in MEASURES)
        pre = changes.filter(window & (pl.col("_change_type") == "update_preimage")
                             & (pl.col("_commit_version") == after["_commit_version"]))
        before = pre.row(0, named=True)
        assert before["revision"] == c["revision"] - 1
        assert tuple(before[m] for m in MEASURES) == tuple(c[f"before_{m}"] for m in MEASURES)
