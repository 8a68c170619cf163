"""The observability timeline: rendering from hand-made data (no Spark), and the Spark collection
on a few hand-made rows with hand-computed lateness, lag-behind-max and what-if counts."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from reporting.timeline_plot import (
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
ALL_SERIES = set(TIMELINE_SERIES) | {HISTOGRAM, WHAT_IF}


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def json_block(page: str, element_id: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m, f"no embedded JSON {element_id}"
    return json.loads(m.group(1))


def embedded(page: str) -> dict:
    return json_block(page, "timeline-data")


def traces(page: str) -> dict[str, dict]:
    """The plotly figure's traces by series name (trace `meta`), each exactly once."""
    data = json_block(page, "timeline-figure")["data"]
    found = {t["meta"]: t for t in data}
    assert len(found) == len(data), "a series is drawn twice"
    return found


def no_data_panels(page: str) -> list[str]:
    """The panels (by y axis: y = first panel ... y6 = histogram) that say "no data yet"."""
    layout = json_block(page, "timeline-figure")["layout"]
    refs = [a["yref"].split()[0] for a in layout["annotations"] if a["text"] == "no data yet"]
    assert len(refs) == len(set(refs)), "a panel says it twice"
    return sorted(refs, key=lambda r: int(r[1:] or 1))


def visible(page: str) -> str:
    """The page without its scripts (plotly.js, the figure and data JSON)."""
    return re.sub(r"<script.*?</script>", "", page, flags=re.S)


def sample() -> TimelineData:
    t = [BASE + s(60 * i) for i in range(4)]
    series = (
        Series("lateness_p50", ((t[0], 1.0), (t[1], 2.0), (t[2], 1.5))),
        Series("lateness_p99", ((t[0], 9.0), (t[1], 20.0), (t[2], 8.0))),
        Series("lateness_max", ((t[0], 30.0), (t[1], 95.5), (t[2], 12.0))),
        Series("watermark", ((t[1], BASE - s(30)), (t[2], BASE + s(20)))),
        Series("consumer_lag", ((t[0], 1200), (t[1], 300), (t[2], 0), (t[3], 5))),
        Series("batch_duration", ((t[0], 2.5), (t[1], 1.25))),
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
def test_every_series_is_drawn_with_its_values():
    data = sample()
    page = render(data)
    body, drawn = embedded(page), traces(page)
    assert set(drawn) == ALL_SERIES
    for series in data.series:
        points = body["series"][series.name]["points"]
        assert len(points) == len(series.points) == len(drawn[series.name]["x"])
    # Times are plotted as UTC wall-clock strings (plotly.js has no zones), values as given.
    assert drawn["lateness_max"]["y"] == [30.0, 95.5, 12.0]
    assert drawn["lateness_max"]["x"][1] == "2025-01-01 12:01:00.000000"
    assert drawn["lateness_max"]["customdata"][1] == "1.59 min"
    assert drawn["consumer_lag"]["y"] == [1200, 300, 0, 5]
    assert drawn["watermark"]["y"] == ["2025-01-01 11:59:30.000000", "2025-01-01 12:00:20.000000"]
    assert drawn[HISTOGRAM]["type"] == "bar" and drawn[HISTOGRAM]["y"] == [500, 40, 7, 1]
    assert drawn[HISTOGRAM]["customdata"] == ["< 0 s", "0 s – 30 s", "30 s – 1 min", "≥ 1 min"]
    # What-if points sit on the bin edges: edge k is between bar k and bar k + 1.
    assert drawn[WHAT_IF]["x"] == [0.5, 1.5, 2.5] and drawn[WHAT_IF]["y"] == [48, 8, 1]
    layout = json_block(page, "timeline-figure")["layout"]
    titles = [a["text"] for a in layout["annotations"]]
    for title in ("Event time vs broker append time", "Watermark progress",
                  "Consumer lag", "Batch duration", "Aggregate freshness",
                  "Lateness histogram and what-if WATERMARK_DELAY"):
        assert title in titles
    assert "configured WATERMARK_DELAY 30 s" in titles and "WATERMARK_DELAY 30 s" in titles
    assert "no data yet" not in titles
    assert layout["yaxis2"]["type"] == "date" and layout["yaxis6"]["type"] == "log"
    # The five timeline panels zoom together; the shared range is the data's span.
    assert all(layout[f"xaxis{i}"]["matches"] == "x" for i in range(2, 6))
    assert layout["xaxis"]["range"] == ["2025-01-01 12:00:00.000000", "2025-01-01 12:04:00.000000"]
    assert body["series"]["lateness_max"]["points"][1] == ["2025-01-01T12:01:00.000000Z", 95.5]
    assert body["series"][HISTOGRAM]["points"] == [[None, 500], [0.0, 40], [30.0, 7], [60.0, 1]]
    assert body["series"][WHAT_IF]["points"] == [[0.0, 48], [30.0, 8], [60.0, 1]]
    assert (body["bucket_seconds"], body["late_events_rows"]) == (60.0, 3)


def test_report_is_self_contained_and_labelled():
    page = render(sample())
    # plotly.js is inline, exactly once; nothing is loaded from elsewhere.
    assert page.count(get_plotlyjs()) == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", page) and '<script src="http' not in page
    assert "<link" not in page and "cdn.plot.ly" not in page.replace(get_plotlyjs(), "")
    assert "<svg" not in page.replace(get_plotlyjs(), "")  # no hand-drawn SVG left
    head = visible(page)
    assert "topic events&lt;x&gt;" in head and "events<x>" not in head
    assert "generated 2025-01-01 12:05:00 UTC" in head
    assert "late_events table has 3 rows" in head and "estimated 8 late records" in head
    assert "lateness p50 1.5 s, p99 20 s, max 1.59 min" in head
    layout = json_block(page, "timeline-figure")["layout"]
    assert layout["xaxis5"]["title"]["text"] == "arrival / batch time (UTC, 2025-01-01, 1 min buckets)"


def test_empty_data_renders_no_data_yet_in_every_panel():
    page = render(TimelineData(topic="events", generated_at=BASE, watermark_delay=s(30)))
    body, drawn = embedded(page), traces(page)
    assert no_data_panels(page) == ["y", "y2", "y3", "y4", "y5", "y6"]
    assert set(drawn) == ALL_SERIES and all(t["x"] == [] and t["y"] == [] for t in drawn.values())
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
    drawn = traces(page)
    # Lateness (y) and the histogram (y6) have data; watermark, lag, durations, freshness do not.
    assert no_data_panels(page) == ["y2", "y3", "y4", "y5"]
    assert len(drawn["lateness_p99"]["y"]) == 3 and drawn["consumer_lag"]["y"] == []
    assert drawn[HISTOGRAM]["y"] == [500, 40, 7, 1]


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
    from spark_jobs.tables import ensure_tables, read_table

    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path_factory.mktemp("timeline"))})
    ensure_tables(spark, settings)
    for table, dicts in ((BRONZE, bronze_dicts(settings.events_topic)), (PROGRESS, progress_dicts()),
                         (LATE, late_dicts(settings.events_topic))):
        schema = read_table(spark, settings, table).schema
        spark.createDataFrame(rows_for(schema, dicts), schema).write.format("delta").mode("append") \
            .save(settings.table_path(table.name))
    return settings


def test_write_timeline_on_hand_made_tables(spark, lakehouse):
    from reporting.timeline import write_timeline

    result = write_timeline(spark, lakehouse)
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
    from reporting.timeline import collect_timeline

    data = collect_timeline(spark, lakehouse, since=BASE + s(3), delays=[s(5)])
    # Rows arriving from 12:00:03 on: event times +3, -3, -57, +5, 0 -> lags none, 6, 60, -2, 5.
    assert data.bronze_rows == 5 and data.late_events_rows == 2
    assert data.what_if == ((s(5), 3), (s(30), 1))  # the configured delay is always a candidate
    assert data.histogram.counts == (2, 2, 1)
    assert data.start == BASE + s(3)


def test_collect_timeline_with_nothing_in_range_renders_empty(spark, lakehouse):
    from reporting.timeline import collect_timeline

    data = collect_timeline(spark, lakehouse, since=BASE + timedelta(days=1))
    assert (data.start, data.bronze_rows, data.late_events_rows, data.histogram) == (None, 0, 0, None)
    assert data.series == () and data.lateness_overall == {}
    assert no_data_panels(render(data)) == ["y", "y2", "y3", "y4", "y5", "y6"]
