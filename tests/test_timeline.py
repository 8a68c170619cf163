"""The observability timeline: rendering from hand-made data (no Spark), and the Spark collection
on a few hand-made rows with hand-computed lateness, lag-behind-max and what-if counts."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from spark_jobs.timeline_html import (
    HISTOGRAM,
    TIMELINE_SERIES,
    WHAT_IF,
    Histogram,
    Series,
    TimelineData,
    choose_bucket,
    render,
    summary,
)

BASE = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
SERIES_G = re.compile(r'<g class="series" data-series="([^"]+)" data-points="(\d+)"[^>]*>(.*?)</g>', re.S)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S)
    assert m, "no embedded JSON"
    return json.loads(m.group(1))


def markers(page: str) -> dict[str, tuple[int, str]]:
    found = {name: (int(n), body) for name, n, body in SERIES_G.findall(page)}
    assert len(found) == len(SERIES_G.findall(page)), "a series marker appears twice"
    return found


def sample() -> TimelineData:
    t = [BASE + s(60 * i) for i in range(4)]
    series = (
        Series("lateness_p50", ((t[0], 1.0), (t[1], 2.0), (t[2], 1.5))),
        Series("lateness_p99", ((t[0], 9.0), (t[1], 20.0), (t[2], 8.0))),
        Series("lateness_max", ((t[0], 30.0), (t[1], 95.5), (t[2], 12.0))),
        Series("watermark", ((t[1], BASE - s(30)), (t[2], BASE + s(20)))),
        Series("consumer_lag", ((t[0], 1200), (t[1], 300), (t[2], 0), (t[3], 5))),
        Series("batch_duration_bronze", ((t[0], 2.5), (t[1], 1.25))),
        Series("batch_duration_aggregates", ((t[1], 4.0),)),
        Series("aggregate_freshness", ((t[1], 90.0), (t[2], 100.0))),
    )
    return TimelineData(
        topic="events<x>", generated_at=BASE + s(300), watermark_delay=s(30), start=BASE,
        end=BASE + s(240), bucket=s(60), series=series,
        histogram=Histogram((s(0), s(30), s(60)), (500, 40, 7, 1)),
        what_if=((s(0), 48), (s(30), 8), (s(60), 1)), late_events_rows=3, bronze_rows=548,
        newest_event_time=BASE + s(230), lateness_overall={"p50": 1.5, "p99": 20.0, "max": 95.5},
    )


# ---- rendering, no Spark --------------------------------------------------------------------------
def test_every_series_has_a_marker_with_its_points_and_values():
    data = sample()
    page = render(data)
    body, found = embedded(page), markers(page)
    assert set(found) == set(TIMELINE_SERIES) | {HISTOGRAM, WHAT_IF}
    for series in data.series:
        points = body["series"][series.name]["points"]
        assert len(points) == len(series.points) == found[series.name][0]
        assert found[series.name][1].count("<circle") == len(series.points)
    assert body["series"]["lateness_max"]["points"][1] == ["2025-01-01T12:01:00.000000Z", 95.5]
    assert body["series"]["consumer_lag"]["points"][0] == ["2025-01-01T12:00:00.000000Z", 1200]
    assert body["series"]["watermark"]["points"][0][1] == "2025-01-01T11:59:30.000000Z"
    assert body["series"][HISTOGRAM]["points"] == [[None, 500], [0.0, 40], [30.0, 7], [60.0, 1]]
    assert found[HISTOGRAM][0] == 4 and found[HISTOGRAM][1].count("<rect") == 4
    assert body["series"][WHAT_IF]["points"] == [[0.0, 48], [30.0, 8], [60.0, 1]]
    assert found[WHAT_IF][0] == 3
    assert (body["bucket_seconds"], body["late_events_rows"]) == (60.0, 3)
    assert "no data yet" not in page


def test_report_is_self_contained_and_labelled():
    page = render(sample())
    assert "http" not in page and "<link" not in page and "src=" not in page
    assert page.count("<script") == 1  # the JSON block only
    assert "topic events&lt;x&gt;" in page and "events<x>" not in page.split("<script")[0]
    assert "generated 2025-01-01 12:05:00 UTC" in page
    assert "configured WATERMARK_DELAY 30 s" in page
    assert "late_events table has 3 rows" in page and "estimated 8 late records" in page
    assert "12:01" in page and "UTC, 2025-01-01" in page  # time ticks and axis label


def test_empty_data_renders_no_data_yet():
    page = render(TimelineData(topic="events", generated_at=BASE, watermark_delay=s(30)))
    body, found = embedded(page), markers(page)
    assert page.count("no data yet") == 6  # five timeline panels and the histogram
    assert {n for n, _ in found.values()} == {0} and len(found) == 10
    assert all(v["points"] == [] for v in body["series"].values())
    assert body["start"] is None and body["lateness_seconds"] == {}


def test_missing_progress_leaves_only_those_panels_empty():
    data = sample()
    lateness_only = TimelineData(
        topic="events", generated_at=BASE, watermark_delay=s(30), start=BASE, end=BASE + s(60),
        bucket=s(1), series=tuple(x for x in data.series if x.name.startswith("lateness")),
        histogram=data.histogram, what_if=data.what_if,
    )
    page = render(lateness_only)
    found = markers(page)
    assert page.count("no data yet") == 4
    assert found["lateness_p99"][0] == 3 and found["consumer_lag"][0] == 0 and found[HISTOGRAM][0] == 4


def test_summary_for_metadata():
    out = summary(sample())
    assert out["series_points"]["consumer_lag"] == 4 and out["series_points"][HISTOGRAM] == 4
    assert out["what_if_late_records"] == {"0 s": 48, "30 s": 8, "1 min": 1}
    assert out["estimated_late_at_watermark_delay"] == 8 and out["late_events_rows"] == 3
    json.dumps(out)  # plain JSON values only


@pytest.mark.parametrize("span", [s(3), s(90), s(600), s(7200), s(86400), s(7 * 86400)])
def test_bucket_gives_at_most_120_round_buckets(span):
    bucket = choose_bucket(span)
    assert span / bucket <= 120
    assert bucket == s(1) or span / bucket > 48


# ---- Spark ---------------------------------------------------------------------------------------
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
    ("bronze", 0, 10, None, 2000, 100),
    ("bronze", 1, 20, None, 1000, 40),
    ("bronze", 2, 30, None, 500, None),
    ("aggregates", 0, 12, "epoch", 3000, None),  # watermark 0 before the first event
    ("aggregates", 1, 22, -30, 1200, None),
    ("aggregates", 2, 32, -25, 800, None),
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
    from lakehouse.settings import Settings
    from spark_jobs.tables import BRONZE, LATE, PROGRESS, ensure_tables, read_table

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path_factory.mktemp("timeline"))})
    ensure_tables(spark, settings)
    for table, dicts in ((BRONZE, bronze_dicts(settings.events_topic)), (PROGRESS, progress_dicts()),
                         (LATE, late_dicts(settings.events_topic))):
        schema = read_table(spark, settings, table).schema
        spark.createDataFrame(rows_for(schema, dicts), schema).write.format("delta").mode("append") \
            .save(settings.table_path(table.name))
    return settings


def test_write_timeline_on_hand_made_tables(spark, lakehouse):
    from spark_jobs.timeline import write_timeline

    result = write_timeline(spark, lakehouse)
    assert result.path == lakehouse.root / "reports" / "timeline.html" and result.path.exists()
    page = result.path.read_text(encoding="utf-8")
    body, found = embedded(page), markers(page)
    series = {name: v["points"] for name, v in body["series"].items()}
    assert all(found[name][0] == len(points) for name, points in series.items())

    # Span 12:00:00-12:00:32 -> 1 s buckets, so each batch is its own point.
    assert (body["bucket_seconds"], body["start"], body["end"]) == (1.0, iso(0), iso(33))
    assert series["consumer_lag"] == [[iso(10), 100], [iso(20), 40]]  # null lag skipped
    assert series["batch_duration_bronze"] == [[iso(10), 2.0], [iso(20), 1.0], [iso(30), 0.5]]
    assert series["batch_duration_aggregates"] == [[iso(12), 3.0], [iso(22), 1.2], [iso(32), 0.8]]
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
    assert render(data).count("no data yet") == 6
