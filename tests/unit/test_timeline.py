"""The observability timeline, rendered from hand-made data (no Spark; the Spark collection:
tests/spark/test_timeline_collect.py)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from plotly.offline import get_plotlyjs

from assets.observe.timeline_page import render, summary
from spark_jobs.timeline import (
    HISTOGRAM,
    TIMELINE_SERIES,
    WHAT_IF,
    Histogram,
    Series,
    TimelineData,
    choose_bucket,
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
