"""The observability timeline as ONE self-contained HTML file, drawn with plotly.

`spark_jobs.timeline` collects a `TimelineData`; this module turns it into a page (the rendering
is testable with hand-made data) and `write_timeline` writes it next to the pipeline's tables. The page holds:

- plotly.js itself, inline, once (what `include_plotlyjs=True` embeds: nothing is fetched from a
  network or CDN when the file is opened);
- one plotly figure of six panels: five timeline panels on one shared, zoomable time axis
  (lateness, watermark, consumer lag, batch durations, aggregate freshness) and the lateness
  histogram with the what-if WATERMARK_DELAY line. The figure's JSON sits in
  `<script type="application/json" id="timeline-figure">`; every trace carries its series name in
  `meta` (an empty trace when the series has no point), and a panel without data says
  "no data yet";
- the raw numbers in `<script type="application/json" id="timeline-data">` (data, not code), the
  same `payload` the Dagster metadata `summary` is made from.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import REPORTS_DIR
from spark_jobs.timeline import (
    HISTOGRAM,
    NO_DATA,
    TIMELINE_SERIES,
    UNITS,
    WHAT_IF,
    TimelineData,
    Value,
)


# ---- formatting --------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s == 0:
        return "0 s"
    for limit, div, unit in ((1, 0.001, "ms"), (60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if s < limit:
            return f"{sign}{s / div:.3g} {unit}"
    return f"{sign}{s / 86400:.3g} d"


def fmt_count(v: float) -> str:
    for limit, div, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(v) >= limit:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}" if v != int(v) and abs(v) < 1000 else f"{v:,.0f}"


def iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def shown(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def plot_time(t: datetime) -> str:
    """A UTC time as plotly.js reads dates: no offset (plotly.js has no time zones), so the axis
    shows UTC whatever the viewer's browser zone is."""
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def bin_labels(edges: tuple[timedelta, ...]) -> list[str]:
    secs = [fmt_duration(e.total_seconds()) for e in edges]
    return [f"< {secs[0]}"] + [f"{a} – {b}" for a, b in zip(secs, secs[1:], strict=False)] + [f"≥ {secs[-1]}"]


# ---- panels --------------------------------------------------------------------------------------
COLORS = {"lateness_p50": "#1f77b4", "lateness_p99": "#ff7f0e", "lateness_max": "#d62728",
          "watermark": "#2ca02c", "consumer_lag": "#9467bd", "batch_duration": "#8c564b",
          "aggregate_freshness": "#e377c2",
          HISTOGRAM: "#9ecae1", WHAT_IF: "#d62728"}


@dataclass(frozen=True)
class _Panel:
    title: str
    unit: str  # "s", "records" or "time"
    y_label: str
    lines: tuple[tuple[str, str], ...]  # (series name, legend label)
    note: str


PANELS = (
    _Panel("Event time vs broker append time", "s", "lateness (s)",
           (("lateness_p50", "p50"), ("lateness_p99", "p99 (approx.)"), ("lateness_max", "max")),
           "Lateness = kafka_timestamp − event_time of each bronze record, per arrival-time bucket. "
           "Negative values: the event is stamped after the broker appended it (clock skew)."),
    _Panel("Watermark progress", "time", "watermark (UTC)",
           (("watermark", "watermark"),),
           "The stream's watermark (max event time seen − WATERMARK_DELAY), latest per bucket, "
           "against batch time. Windows ending before it are final; older events go to the late lane."),
    _Panel("Consumer lag", "records", "records behind", (("consumer_lag", "kafka lag"),),
           "Topic end offsets minus the offsets the ingest query has processed, summed over "
           "partitions; max per bucket."),
    _Panel("Batch duration", "s", "trigger time (s)",
           (("batch_duration", "ingest"),),
           "Wall time of each micro-batch (durationMs.triggerExecution), max per bucket."),
    _Panel("Aggregate freshness", "s", "batch − watermark (s)", (("aggregate_freshness", "freshness"),),
           "How stale the newest closed window is when a batch of the ingest query runs: "
           "batch_timestamp − watermark, max per bucket. Never below WATERMARK_DELAY (dashed) while "
           "event times are not in the future."),
)
HISTOGRAM_TITLE = "Lateness histogram and what-if WATERMARK_DELAY"
PANEL_HEIGHT = 230


def _x_label(data: TimelineData) -> str:
    if data.start is None or data.end is None:
        return "arrival / batch time (UTC)"
    days = sorted({data.start.date().isoformat(), (data.end - timedelta(microseconds=1)).date().isoformat()})
    bucket = f", {fmt_duration(data.bucket.total_seconds())} buckets" if data.bucket else ""
    return f"arrival / batch time (UTC, {' – '.join(days)}{bucket})"


def _no_data(fig: go.Figure, row: int) -> None:
    fig.add_annotation(text=NO_DATA, showarrow=False, font={"size": 16, "color": "#999"},
                       xref="x domain" if row == 1 else f"x{row} domain", x=0.5,
                       yref="y domain" if row == 1 else f"y{row} domain", y=0.5)


def _timeline_traces(fig: go.Figure, panel: _Panel, row: int, legend: str, data: TimelineData) -> bool:
    """One line per series of the panel (empty when the series has no point); True if any has
    a point."""
    any_points = False
    for name, label in panel.lines:
        points = data.get(name).points if data.start is not None else ()
        any_points |= bool(points)
        x = [plot_time(t) for t, _ in points]
        if panel.unit == "time":
            y: list[Any] = [plot_time(v) for _, v in points]  # type: ignore[arg-type]
            hover = "%{y|%Y-%m-%d %H:%M:%S} UTC"
            custom = None
        else:
            y = [v for _, v in points]
            custom = [fmt_duration(v) if panel.unit == "s" else fmt_count(v) for v in y]
            hover = "%{customdata}" + ("" if panel.unit == "s" else " records")
        fig.add_trace(go.Scatter(
            x=x, y=y, customdata=custom, name=label, meta=name, legend=legend,
            mode="lines+markers", line={"color": COLORS[name], "width": 1.6}, marker={"size": 4},
            hovertemplate=f"{label}: {hover}<br>%{{x|%Y-%m-%d %H:%M:%S}} UTC<extra></extra>",
        ), row=row, col=1)
    return any_points


def _histogram_traces(fig: go.Figure, row: int, legend: str, data: TimelineData) -> bool:
    """Bars per lag bin at x = 0..n-1 and the what-if line on the bin edges (x = k + 0.5 is the
    boundary between the bins below and at/above edge k), on a log count axis."""
    hist = data.histogram
    has_data = hist is not None and sum(hist.counts) > 0
    counts = list(hist.counts) if has_data else []
    labels = bin_labels(hist.edges) if has_data else []
    edges = list(hist.edges) if has_data else []
    fig.add_trace(go.Bar(
        x=list(range(len(counts))), y=counts, customdata=labels, name="records per bin",
        meta=HISTOGRAM, legend=legend, marker={"color": COLORS[HISTOGRAM]},
        text=[fmt_count(c) for c in counts], textposition="outside",
        hovertemplate="lag %{customdata}: %{y} records<extra></extra>",
    ), row=row, col=1)
    what_if = [(edges.index(d) + 0.5, c, fmt_duration(d.total_seconds()))
               for d, c in data.what_if if d in edges]
    fig.add_trace(go.Scatter(
        x=[x for x, _, _ in what_if], y=[c for _, c, _ in what_if],
        customdata=[label for _, _, label in what_if], name="late under delay = edge",
        meta=WHAT_IF, legend=legend, mode="lines+markers+text",
        text=[fmt_count(c) for _, c, _ in what_if], textposition="top right",
        line={"color": COLORS[WHAT_IF], "width": 1.8}, marker={"size": 6},
        hovertemplate="WATERMARK_DELAY %{customdata}: %{y} late records<extra></extra>",
    ), row=row, col=1)
    xaxis = "xaxis" if row == 1 else f"xaxis{row}"
    fig.layout[xaxis].update(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
                             title_text="lag behind the running max event time")
    if has_data and data.watermark_delay in edges:
        fig.add_vline(x=edges.index(data.watermark_delay) + 0.5, row=row, col=1,
                      line={"color": "#555", "dash": "dash", "width": 1},
                      annotation_text="configured WATERMARK_DELAY "
                      f"{fmt_duration(data.watermark_delay.total_seconds())}",
                      annotation_position="top right")
    return has_data


def _dates(data: TimelineData, panel: _Panel) -> set[str]:
    """UTC dates of a time-valued panel's values."""
    return {v.astimezone(UTC).date().isoformat() for n, _ in panel.lines
            for _, v in data.get(n).points if isinstance(v, datetime)}


def figure(data: TimelineData) -> go.Figure:
    """The six panels in one figure: the five timeline panels share (and zoom) one time axis."""
    titles = [p.title for p in PANELS] + [HISTOGRAM_TITLE]
    rows = len(titles)
    fig = make_subplots(rows=rows, cols=1, subplot_titles=titles, vertical_spacing=0.45 / rows)
    x_range = [plot_time(data.start), plot_time(data.end)] if data.start and data.end else None
    for row, panel in enumerate(PANELS, start=1):
        legend = "legend" if row == 1 else f"legend{row}"
        if not _timeline_traces(fig, panel, row, legend, data):
            _no_data(fig, row)
            fig.update_yaxes(showticklabels=False, row=row, col=1)
        elif panel.unit == "time" and len(_dates(data, panel)) == 1:
            fig.update_yaxes(tickformat="%H:%M:%S", row=row, col=1)  # the date is on the x axis
        # One shared time axis: the title under the last timeline panel only.
        fig.update_xaxes(type="date", range=x_range, row=row, col=1,
                         title_text=_x_label(data) if row == len(PANELS) else None,
                         **({} if row == 1 else {"matches": "x"}))
        fig.update_yaxes(title_text=panel.y_label, type="date" if panel.unit == "time" else "linear",
                         rangemode="normal" if panel.unit == "time" else "tozero", row=row, col=1)
        if "aggregate_freshness" in (n for n, _ in panel.lines):
            fig.add_hline(y=data.watermark_delay.total_seconds(), row=row, col=1,
                          line={"color": "#555", "dash": "dash", "width": 1},
                          annotation_text=f"WATERMARK_DELAY {fmt_duration(data.watermark_delay.total_seconds())}",
                          annotation_position="bottom right")
    legend = f"legend{rows}"
    if not _histogram_traces(fig, rows, legend, data):
        _no_data(fig, rows)
        fig.update_yaxes(showticklabels=False, row=rows, col=1)
    if x_range is None:  # no time axis yet: no made-up dates under the empty panels
        fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(title_text="records (log scale)", type="log", row=rows, col=1)
    for row in range(1, rows + 1):  # one legend per panel, at its top right
        top = fig.layout["yaxis" if row == 1 else f"yaxis{row}"].domain[1]
        fig.layout["legend" if row == 1 else f"legend{row}"] = {
            "x": 1.01, "y": top, "xanchor": "left", "yanchor": "top", "font": {"size": 11}}
    fig.update_layout(template="plotly_white", height=PANEL_HEIGHT * rows, width=1050,
                      margin={"l": 80, "r": 170, "t": 40, "b": 50}, hovermode="closest",
                      bargap=0.15)
    return fig


# ---- document ------------------------------------------------------------------------------------
def payload(data: TimelineData) -> dict[str, Any]:
    """The raw numbers embedded in the report (and parsed back by tests)."""
    def enc(v: Value) -> Any:
        return iso(v) if isinstance(v, datetime) else v

    series: dict[str, Any] = {
        name: {"unit": UNITS[name], "points": [[iso(t), enc(v)] for t, v in data.get(name).points]}
        for name in TIMELINE_SERIES
    }
    hist = data.histogram
    edges = [e.total_seconds() for e in hist.edges] if hist else []
    series[HISTOGRAM] = {"unit": "records", "edges_seconds": edges,
                         "points": [[lo, c] for lo, c in zip([None, *edges], hist.counts, strict=True)]
                         if hist else []}
    series[WHAT_IF] = {"unit": "records", "points": [[d.total_seconds(), c] for d, c in data.what_if]}
    return {
        "pipeline": data.pipeline, "topic": data.topic, "generated_at": iso(data.generated_at),
        "start": iso(data.start),
        "end": iso(data.end), "bucket_seconds": data.bucket.total_seconds() if data.bucket else None,
        "watermark_delay_seconds": data.watermark_delay.total_seconds(),
        "late_events_rows": data.late_events_rows, "bronze_rows": data.bronze_rows,
        "newest_event_time": iso(data.newest_event_time), "lateness_seconds": dict(data.lateness_overall),
        "series": series,
    }


def summary(data: TimelineData) -> dict[str, Any]:
    """A compact dict for Dagster metadata: point counts, lateness percentiles, what-if counts."""
    body = payload(data)
    return {
        "pipeline": data.pipeline,
        "topic": data.topic,
        "generated_at": body["generated_at"],
        "bucket_seconds": body["bucket_seconds"],
        "series_points": {name: len(s["points"]) for name, s in body["series"].items()},
        "lateness_seconds": body["lateness_seconds"],
        "what_if_late_records": {fmt_duration(d.total_seconds()): c for d, c in data.what_if},
        "watermark_delay": fmt_duration(data.watermark_delay.total_seconds()),
        "estimated_late_at_watermark_delay": dict(data.what_if).get(data.watermark_delay),
        "late_events_rows": data.late_events_rows,
        "bronze_rows": data.bronze_rows,
    }


CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:16px auto;width:1050px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:14px;margin:10px 0 2px}
.meta{color:#555;margin:0 0 6px}.notes p{color:#555;font-size:12px;margin:0 0 4px}
"""
PLOT_CONFIG = {"displaylogo": False, "responsive": False}


def _header(data: TimelineData) -> str:
    facts = [f"generated {shown(data.generated_at)}", f"bronze rows {data.bronze_rows}",
             f"late_events rows {data.late_events_rows}"]
    if data.newest_event_time is not None:
        age = (data.generated_at - data.newest_event_time).total_seconds()
        facts.append(f"newest event time {shown(data.newest_event_time)} ({fmt_duration(age)} before generation)")
    if data.lateness_overall:
        facts.append("lateness " + ", ".join(f"{k} {fmt_duration(v)}" for k, v in data.lateness_overall.items()))
    return (f"<h1>Event-time timeline — pipeline {html.escape(data.pipeline)}, topic "
            f"{html.escape(data.topic)}</h1>"
            f'<p class="meta">{html.escape(" · ".join(facts))}</p>')


def _histogram_note(data: TimelineData) -> str:
    configured = dict(data.what_if).get(data.watermark_delay)
    estimate = f"estimated {configured} late records, " if configured is not None else ""
    return ("Bars: bronze records by how far their event time lies behind the max event time of all "
            "records that arrived before them (kafka_timestamp, partition, offset). Red line: records a "
            "WATERMARK_DELAY equal to that bin edge would send to the late lane. A per-record estimate and "
            "an upper bound: a batch's watermark lags the running max. Configured WATERMARK_DELAY "
            f"{fmt_duration(data.watermark_delay.total_seconds())}: {estimate}"
            f"late_events table has {data.late_events_rows} rows.")


def _notes(data: TimelineData) -> str:
    notes = [(p.title, p.note) for p in PANELS] + [(HISTOGRAM_TITLE, _histogram_note(data))]
    return '<section class="notes">' + "".join(
        f"<h2>{html.escape(title)}</h2><p>{html.escape(note)}</p>" for title, note in notes) + "</section>"


def _json_block(element_id: str, text: str) -> str:
    # "</" cannot end the block early once escaped (JSON allows "\/").
    escaped = text.replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{escaped}</script>'


def render(data: TimelineData) -> str:
    """The whole report: header, the six-panel figure, the panel notes, the raw numbers."""
    blob = json.dumps(payload(data), separators=(",", ":"))
    plot = ("(function(){var f=JSON.parse(document.getElementById('timeline-figure').textContent);"
            f"Plotly.newPlot('timeline',f.data,f.layout,{json.dumps(PLOT_CONFIG)});}})();")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>Timeline — {html.escape(data.pipeline)} — {html.escape(data.topic)} — "
            f"{shown(data.generated_at)}</title>"
            f"<style>{CSS}</style>"
            # plotly.js inline, once per page (the bundle `include_plotlyjs=True` embeds).
            f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
            f'<body>{_header(data)}<div id="timeline"></div>{_notes(data)}'
            f"{_json_block('timeline-figure', figure(data).to_json())}"
            f"{_json_block('timeline-data', blob)}"
            f"<script>{plot}</script></body></html>\n")


@dataclass(frozen=True)
class ReportResult:
    path: str  # a local path or an object-store URI
    summary: dict[str, Any]


def write_timeline(data: TimelineData, settings: Settings,
                   path: str | None = None) -> ReportResult:
    """Render and write the report of `data` (`spark_jobs.timeline.collect_timeline`'s plain
    rows; default `$LAKEHOUSE_ROOT/reports/timeline.html`); the summary is small enough for
    Dagster metadata."""
    target = storage.write_text(path or settings.path(REPORTS_DIR, "timeline.html"), render(data))
    return ReportResult(target, {"path": target, **summary(data)})
