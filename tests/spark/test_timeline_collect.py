"""The observability timeline's Spark collection on a few hand-made rows with hand-computed
lateness, lag-behind-max and what-if counts (the rendering: tests/unit/test_timeline.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from test_timeline import BASE, embedded, no_data_panels, s, traces

from assets.observe.timeline_page import render
from spark_jobs.timeline import HISTOGRAM, WHAT_IF, collect_timeline

# (kafka_timestamp offset s, partition, offset, event_time offset s) -> lag behind the running max
BRONZE_ROWS = [
    (0, 0, 0, 0),     # first record: no lag
    (1, 0, 1, 1),     # new max: lag -1
    (2, 0, 2, -10),   # max +1: lag 11, lateness 12
    (3, 0, 3, 3),     # new max: lag -2
    (4, 0, 4, -3),    # max +3: lag 6
    (5, 0, 5, -57),   # max +3: lag 60, lateness 62
    (5, 1, 0, 5),     # same arrival, later partition: after the row above; new max: lag -2
    (6, 0, 6, 0),     # max +5: lag 5 (exactly a candidate delay: late under it)
]
# (query, batch_id, batch offset s, watermark offset s or None, trigger_ms, kafka_lag)
PROGRESS_ROWS = [
    ("ingest", 0, 12, "epoch", 2000, 100),  # watermark 0 before the first event
    ("ingest", 1, 22, -30, 1000, 40),
    ("ingest", 2, 32, -25, 500, None),
]


def rows_for(schema, dicts: list[dict]) -> list[tuple]:
    return [tuple(d.get(f.name) for f in schema) for d in dicts]


def bronze_dicts(topic: str) -> list[dict]:
    out = []
    for kt, partition, offset, et in BRONZE_ROWS:
        event_time = BASE + s(et)
        out.append({"event_id": f"e{partition}-{offset}", "key": "k", "event_time": event_time,
                    "payload_event_time": event_time, "value": Decimal("1.000000"), "topic": topic,
                    "partition": partition, "offset": offset, "kafka_timestamp": BASE + s(kt),
                    "event_date": event_time.date(), "ingested_at": BASE + s(kt), "bronze_batch_id": 0})
    return out


def progress_dicts() -> list[dict]:
    out = []
    for query, batch_id, at, wm, trigger_ms, lag in PROGRESS_ROWS:
        watermark = datetime(1970, 1, 1, tzinfo=UTC) if wm == "epoch" else None if wm is None else BASE + s(wm)
        out.append({"query": query, "batch_id": batch_id, "batch_timestamp": BASE + s(at), "input_rows": 1,
                    "watermark": watermark, "trigger_ms": trigger_ms, "kafka_lag": lag,
                    "progress_date": BASE.date()})
    return out


def late_dicts(topic: str) -> list[dict]:
    return [{"event_id": f"late{i}", "key": "k", "event_time": BASE - s(60), "value": Decimal("2.000000"),
             "event_date": BASE.date(), "window_start": BASE - s(60), "window_end": BASE, "lateness_ms": 5000,
             "batch_id": 2, "batch_watermark": BASE - s(25), "topic": topic, "partition": 0, "offset": 5 + i,
             "kafka_timestamp": BASE + s(5), "recorded_at": BASE + s(40)} for i in range(2)]


def iso(offset_s: float) -> str:
    return (BASE + s(offset_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(scope="module")
def lakehouse(spark, tmp_path_factory):
    """One tiny lakehouse for both Spark tests (creating tables is the slow part)."""
    from lakehouse.config.settings import Settings
    from lakehouse.tables.catalog import BRONZE, LATE, PROGRESS
    from spark_jobs.tables import read_table
    from spark_jobs.writer import ensure_tables

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path_factory.mktemp("timeline"))})
    ensure_tables(spark, settings)
    for table, dicts in ((BRONZE, bronze_dicts(settings.events_topic)), (PROGRESS, progress_dicts()),
                         (LATE, late_dicts(settings.events_topic))):
        schema = read_table(spark, settings, table).schema
        spark.createDataFrame(rows_for(schema, dicts), schema).write.format("delta").mode("append") \
            .save(settings.table_path(table.name))
    return settings


def test_write_timeline_on_hand_made_tables(spark, lakehouse):
    from assets.observe.timeline_page import write_timeline

    result = write_timeline(collect_timeline(spark, lakehouse), lakehouse)
    assert result.path == lakehouse.path("reports", "timeline.html")
    page = Path(result.path).read_text(encoding="utf-8")
    body, drawn = embedded(page), traces(page)
    series = {name: v["points"] for name, v in body["series"].items()}
    assert all(len(drawn[name]["y"]) == len(points) for name, points in series.items())

    # Span 12:00:00-12:00:32 -> 1 s buckets, so each batch is its own point.
    assert (body["bucket_seconds"], body["start"], body["end"]) == (1.0, iso(0), iso(33))
    assert series["consumer_lag"] == [[iso(12), 100], [iso(22), 40]]  # null lag skipped
    assert drawn["consumer_lag"]["y"] == [100, 40] and drawn["watermark"]["y"][0] == "2025-01-01 11:59:30.000000"
    assert series["batch_duration"] == [[iso(12), 2.0], [iso(22), 1.0], [iso(32), 0.5]]
    assert series["watermark"] == [[iso(22), iso(-30)], [iso(32), iso(-25)]]  # epoch-0 watermark dropped
    assert series["aggregate_freshness"] == [[iso(22), 52.0], [iso(32), 57.0]]

    assert [v for _, v in series["lateness_max"]] == [0.0, 0.0, 12.0, 0.0, 7.0, 62.0, 6.0]
    assert [t for t, _ in series["lateness_max"]] == [iso(i) for i in range(7)]
    assert series["lateness_p50"][2] == [iso(2), 12.0]
    assert body["lateness_seconds"]["max"] == 62.0 and body["bronze_rows"] == 8

    # Lags behind the running max: none, -1, 11, -2, 6, 60, -2, 5.
    what_if = dict((d, n) for d, n in series[WHAT_IF])
    assert (what_if[5.0], what_if[10.0], what_if[30.0], what_if[60.0], what_if[120.0]) == (4, 2, 1, 1, 0)
    assert [n for _, n in series[HISTOGRAM]] == [4, 0, 2, 1, 0, 1, 0, 0, 0, 0]
    assert body["late_events_rows"] == 2 and "late_events table has 2 rows" in page
    assert result.summary["estimated_late_at_watermark_delay"] == 1
    assert result.summary["series_points"]["consumer_lag"] == 2


def test_collect_timeline_since_and_custom_delays(spark, lakehouse):
    from spark_jobs.timeline import collect_timeline

    data = collect_timeline(spark, lakehouse, since=BASE + s(3), delays=[s(5)])
    # Rows arriving from 12:00:03 on: event times +3, -3, -57, +5, 0 -> lags none, 6, 60, -2, 5.
    assert data.bronze_rows == 5 and data.late_events_rows == 2
    assert data.what_if == ((s(5), 3), (s(30), 1))  # the configured delay is always a candidate
    assert data.histogram.counts == (2, 2, 1)
    assert data.start == BASE + s(3)


def test_collect_timeline_with_nothing_in_range_renders_empty(spark, lakehouse):
    from spark_jobs.timeline import collect_timeline

    data = collect_timeline(spark, lakehouse, since=BASE + timedelta(days=1))
    assert (data.start, data.bronze_rows, data.late_events_rows, data.histogram) == (None, 0, 0, None)
    assert data.series == () and data.lateness_overall == {}
    assert no_data_panels(render(data)) == ["y", "y2", "y3", "y4", "y5", "y6"]
