"""Table maintenance: the stream's small files are compacted where no writer races it, no row
changes, old versions stay readable (VACUUM keeps the log's retention), and the stream carries on
over the compacted tables without reading anything twice."""

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import run_job
from dagster import DagsterInstance

from lakehouse.tables import delta_log
from lakehouse.tables.catalog import ALL_TABLES, BRONZE, STREAMING
from lakehouse.tables.commit_tags import PIPELINE_TAG
from lakehouse.tables.delta_log import commits, open_table
from lakehouse.tables.stats import add_actions
from spark_jobs import stream
from spark_jobs.maintenance import maintain_table, maintain_tables, parse_interval
from spark_jobs.tables import read_table
from testkit.generator import GeneratorConfig, generate, produce


def files_per_date(settings, table) -> Counter:
    actions = add_actions(settings, table.name)
    return Counter(actions[f"partition.{table.partition_by}"].to_pylist())


def bronze_rows(spark, settings, version=None):
    return sorted(tuple(r) for r in read_table(spark, settings, BRONZE, version)
                  .select("partition", "offset", "event_id", "value").collect())


@pytest.mark.slow
def test_compaction_and_vacuum_keep_rows_versions_and_the_stream(instance_env, spark):
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    # Two past dates; the stream's watermark ends up on the second one.
    config = GeneratorConfig(count=240, seed=11, end=today - timedelta(hours=12),
                             span=timedelta(hours=24), keys=8, late_fraction=0,
                             duplicate_fraction=0, malformed_fraction=0)
    records = generate(config).records
    settings = instance_env
    # Both dates in every Kafka partition: one bronze batch writes a file per partition and date.
    produce(settings, random.Random(3).sample(records, len(records)))
    stream.catch_up(spark, settings)
    first, second = sorted(files_per_date(settings, BRONZE))
    assert min(files_per_date(settings, BRONZE).values()) >= 3
    aggregates_before = files_per_date(settings, STREAMING)
    rows, version = bronze_rows(spark, settings), delta_log.version(settings, BRONZE.name)

    # min_files=1: every partition is a candidate, so the rules alone decide what is touched.
    done = {m.table: m for m in maintain_tables(spark, settings, min_files=1)}

    assert done["bronze_events"].dates_compacted == [first, second]
    assert files_per_date(settings, BRONZE) == {first: 1, second: 1}
    assert bronze_rows(spark, settings) == rows
    # streaming_aggregates only before the watermark's date: the stream still writes there.
    assert done["streaming_aggregates"].dates_compacted == [first]
    assert files_per_date(settings, STREAMING) == {first: 1, second: aggregates_before[second]}
    assert not done["stream_progress"].dates_compacted  # today's: still being appended to
    # The pre-compaction version is still readable: VACUUM kept the log retention (30 days).
    assert done["bronze_events"].retention_hours == 30 * 24
    assert bronze_rows(spark, settings, version) == rows
    optimize = [c for c in commits(settings, BRONZE.name) if c["operation"] == "OPTIMIZE"]
    assert len(optimize) == 1 and optimize[0]["userMetadata"].startswith(PIPELINE_TAG)

    # Nothing crowded any more: a second run compacts nothing.
    again = {m.table: m for m in maintain_tables(spark, settings, min_files=2)}
    assert not any(m.dates_compacted or m.files_vacuumed for m in again.values())
    # The Dagster job runs the same, reporting per table.
    with DagsterInstance.ephemeral() as instance:
        result, _ = run_job("table_maintenance", instance)
    assert result.success
    output = next(e for e in result.all_events if e.event_type_value == "STEP_OUTPUT")
    metadata = output.event_specific_data.metadata
    assert metadata["files_removed"].value == 0 and metadata["files_vacuumed"].value == 0
    assert {r.data["table"] for r in metadata["tables"].value.records} == {t.name for t in ALL_TABLES}

    # The stream goes on over the compacted tables: new events once, nothing re-read.
    more = generate(replace(config, count=60, seed=12, end=today - timedelta(hours=1),
                            span=timedelta(hours=2))).records
    produce(settings, more)
    stream.catch_up(spark, settings)
    bronze = read_table(spark, settings, BRONZE)
    assert bronze.count() == len(records) + len(more)
    assert bronze.select("partition", "offset").distinct().count() == bronze.count()
    counted = read_table(spark, settings, STREAMING).agg({"event_count": "sum"}).first()[0]
    late = read_table(spark, settings, BRONZE).count() - counted
    assert late == spark.read.format("delta").load(settings.table_path("late_events")).count()

    # With the tables' retention cut to nothing, VACUUM deletes the compacted-away files: the
    # data files left on disk are exactly the snapshot's.
    spark.sql(f"ALTER TABLE delta.`{settings.table_path(BRONZE.name)}` SET TBLPROPERTIES ("
              "'delta.deletedFileRetentionDuration' = 'interval 0 hours', "
              "'delta.logRetentionDuration' = 'interval 0 hours')")
    vacuumed = maintain_table(spark, settings, BRONZE, today.date())
    assert vacuumed.files_vacuumed == done["bronze_events"].files_removed
    on_disk = {p.name for p in Path(settings.table_path(BRONZE.name)).rglob("*.parquet")
               if "_delta_log" not in p.parts}
    assert on_disk == {Path(f).name for f in open_table(settings, BRONZE.name).file_uris()}


def test_delta_intervals():
    assert parse_interval("interval 30 days") == timedelta(days=30)
    assert parse_interval("interval 2 weeks") == timedelta(days=14)
    assert parse_interval("12 hours") == timedelta(hours=12)
    with pytest.raises(ValueError, match="cannot read the Delta interval"):
        parse_interval("a month")


def test_a_lakehouse_without_tables_has_nothing_to_maintain(spark, tmp_path):
    from lakehouse.config.settings import Settings

    done = maintain_tables(spark, Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)}))
    assert [m.table for m in done] == [t.name for t in ALL_TABLES]
    assert not any(m.files_before or m.dates_compacted or m.files_vacuumed for m in done)
