"""The observability timeline as ONE self-contained HTML file: inline CSS, inline SVG, and the raw
numbers in a `<script type="application/json" id="timeline-data">` block (data, not code).

No Spark here: `spark_jobs.timeline` collects a `TimelineData`; this module only draws it, so the
rendering is testable with hand-made data. Every drawn series sits in a
`<g class="series" data-series="NAME" data-points="N">` element.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

Value = float | datetime

# Steps (seconds) for time axes, duration axes and bucket sizes: round numbers of s/min/h/days.
NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400, 172800, 604800, 2592000)

TIMELINE_SERIES = ("lateness_p50", "lateness_p99", "lateness_max", "watermark", "consumer_lag",
                   "batch_duration_bronze", "batch_duration_aggregates", "aggregate_freshness")
HISTOGRAM, WHAT_IF = "lateness_histogram", "what_if_late_records"
UNITS = {"lateness_p50": "s", "lateness_p99": "s", "lateness_max": "s", "watermark": "time",
         "consumer_lag": "records", "batch_duration_bronze": "s", "batch_duration_aggregates": "s",
         "aggregate_freshness": "s", HISTOGRAM: "records", WHAT_IF: "records"}


# ---- data ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Series:
    """One timeline series: (bucket start in UTC, value) points sorted by time. The value is
    seconds, a record count, or a datetime (the watermark)."""

    name: str
    points: tuple[tuple[datetime, Value], ...] = ()


@dataclass(frozen=True)
class Histogram:
    """Records by lag behind the running max event time. `counts` has len(edges) + 1 bins:
    counts[0] is below edges[0] (including records that advanced the max and the very first
    record), counts[i] is [edges[i-1], edges[i]), counts[-1] is edges[-1] and above."""

    edges: tuple[timedelta, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class TimelineData:
    """Everything the report shows; all times are UTC. `start`/`end`/`bucket` are None when
    neither bronze nor the progress table has a row yet."""

    topic: str
    generated_at: datetime
    watermark_delay: timedelta
    start: datetime | None = None
    end: datetime | None = None
    bucket: timedelta | None = None
    series: tuple[Series, ...] = ()
    histogram: Histogram | None = None
    what_if: tuple[tuple[timedelta, int], ...] = ()  # (candidate delay, records late under it)
    late_events_rows: int = 0
    bronze_rows: int = 0
    newest_event_time: datetime | None = None
    lateness_overall: Mapping[str, float] = field(default_factory=dict)  # p50/p99/max seconds

    def get(self, name: str) -> Series:
        return next((s for s in self.series if s.name == name), Series(name))


def choose_bucket(span: timedelta, target: int = 120) -> timedelta:
    """The smallest round bucket that cuts `span` into at most `target` buckets (so 48-120 of
    them for spans above two minutes)."""
    seconds = span.total_seconds() / target
    return timedelta(seconds=next((s for s in NICE_STEPS_S if s >= seconds), NICE_STEPS_S[-1]))


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


def _epoch(t: datetime) -> float:
    return t.timestamp()


def _time_label(epoch: float, step: float, multi_day: bool) -> str:
    t = datetime.fromtimestamp(epoch, UTC)
    if multi_day:
        return t.strftime("%m-%d %H:%M")
    return t.strftime("%H:%M:%S" if step < 60 else "%H:%M")


# ---- scales --------------------------------------------------------------------------------------
def _decade_step(raw: float) -> float:
    exp = 10 ** math.floor(math.log10(raw))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)


def _step(raw: float, unit: str) -> float:
    if unit in ("s", "time") and raw >= 1:
        return next((s for s in NICE_STEPS_S if s >= raw), _decade_step(raw))
    return _decade_step(max(raw, 1e-9))


def _ticks(lo: float, hi: float, unit: str, n: int = 4) -> list[float]:
    step = _step((hi - lo) / n, unit)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


@dataclass(frozen=True)
class _Scale:
    lo: float
    hi: float
    a: float  # pixel of lo
    b: float  # pixel of hi

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _y_domain(values: list[float], unit: str) -> tuple[float, float]:
    """Counts and durations start at zero (unless negative); timestamps span their values."""
    lo, hi = min(values), max(values)
    if unit != "time":
        lo = min(lo, 0.0)
    if hi - lo < 1e-9:
        lo, hi = (lo - 30, hi + 30) if unit == "time" else (lo, lo + 1)
    step = _step((hi - lo) / 4, unit)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


# ---- panels --------------------------------------------------------------------------------------
W, PANEL_H = 900, 165
LEFT, RIGHT, TOP, BOTTOM = 78, 18, 14, 40
COLORS = {"lateness_p50": "#1f77b4", "lateness_p99": "#ff7f0e", "lateness_max": "#d62728",
          "watermark": "#2ca02c", "consumer_lag": "#9467bd", "batch_duration_bronze": "#8c564b",
          "batch_duration_aggregates": "#17becf", "aggregate_freshness": "#e377c2",
          HISTOGRAM: "#9ecae1", WHAT_IF: "#d62728"}


@dataclass(frozen=True)
class _Panel:
    title: str
    unit: str
    y_label: str
    lines: tuple[tuple[str, str], ...]  # (series name, legend label)
    note: str


PANELS = (
    _Panel("Event time vs broker append time", "s", "lateness",
           (("lateness_p50", "p50"), ("lateness_p99", "p99 (approx.)"), ("lateness_max", "max")),
           "Lateness = kafka_timestamp − event_time of each bronze record, per arrival-time bucket. "
           "Negative values: the event is stamped after the broker appended it (clock skew)."),
    _Panel("Watermark progress (aggregates query)", "time", "watermark (UTC)",
           (("watermark", "watermark"),),
           "The aggregation's watermark (max event time seen − WATERMARK_DELAY), latest per bucket, "
           "against batch time. Windows ending before it are final; older events go to the late lane."),
    _Panel("Consumer lag (bronze query)", "records", "records behind", (("consumer_lag", "kafka lag"),),
           "Topic end offsets minus the offsets the bronze query has processed, summed over "
           "partitions; max per bucket."),
    _Panel("Batch duration", "s", "trigger time",
           (("batch_duration_bronze", "bronze"), ("batch_duration_aggregates", "aggregates")),
           "Wall time of each micro-batch (durationMs.triggerExecution), max per bucket and query."),
    _Panel("Aggregate freshness", "s", "batch − watermark", (("aggregate_freshness", "freshness"),),
           "How stale the newest closed window is when a batch of the aggregates query runs: "
           "batch_timestamp − watermark, max per bucket. Never below WATERMARK_DELAY (dashed) while "
           "event times are not in the future."),
)


def _frame(title: str, y_label: str, x_label: str) -> list[str]:
    pw, ph = W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    return [
        f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/>',
        f'<text class="ylabel" transform="translate(14,{TOP + ph / 2:.1f}) rotate(-90)">'
        f"{html.escape(y_label)}</text>",
        f'<text class="xlabel" x="{LEFT + pw / 2:.1f}" y="{PANEL_H - 4}">{html.escape(x_label)}</text>',
        f'<title>{html.escape(title)}</title>',
    ]


def _no_data(names: list[str]) -> list[str]:
    pw, ph = W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    out = [f'<text class="nodata" x="{LEFT + pw / 2:.1f}" y="{TOP + ph / 2:.1f}">no data yet</text>']
    return out + [f'<g class="series" data-series="{n}" data-points="0"></g>' for n in names]


def _x_axis(x: _Scale) -> list[str]:
    span = x.hi - x.lo
    step = _step(span / 7, "time")
    multi_day = datetime.fromtimestamp(x.lo, UTC).date() != datetime.fromtimestamp(x.hi - 1e-6, UTC).date()
    out = []
    for t in _ticks(x.lo, x.hi, "time", n=7):
        px = x(t)
        out.append(f'<line class="grid" x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{PANEL_H - BOTTOM}"/>')
        out.append(f'<text class="xtick" x="{px:.1f}" y="{PANEL_H - BOTTOM + 14}">'
                   f"{_time_label(t, step, multi_day)}</text>")
    return out


def _y_axis(y: _Scale, unit: str) -> list[str]:
    ticks = _ticks(y.lo, y.hi, unit)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    out = []
    for v in ticks:
        label = (fmt_duration(v) if unit == "s" else fmt_count(v) if unit == "records"
                 else _time_label(v, step, y.hi - y.lo > 86400))
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        out.append(f'<text class="ytick" x="{LEFT - 5}" y="{y(v) + 4:.1f}">{label}</text>')
    return out


def _numeric(v: Value) -> float:
    return _epoch(v) if isinstance(v, datetime) else float(v)


def _line(series: Series, x: _Scale, y: _Scale, label: str) -> str:
    color = COLORS.get(series.name, "#333")
    pts = [(x(_epoch(t)), y(_numeric(v))) for t, v in series.points]
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
    dots = "".join(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.2"/>' for px, py in pts)
    return (f'<g class="series" data-series="{series.name}" data-points="{len(pts)}" '
            f'stroke="{color}" fill="{color}"><title>{html.escape(label)}</title>'
            f'<polyline fill="none" stroke-width="1.6" points="{path}"/>{dots}</g>')


def _x_scale(data: TimelineData) -> _Scale | None:
    if data.start is None or data.end is None:
        return None
    lo, hi = _epoch(data.start), _epoch(data.end)
    return _Scale(lo, hi if hi > lo else lo + 1, LEFT, W - RIGHT)


def _x_label(data: TimelineData) -> str:
    if data.start is None or data.end is None:
        return "arrival / batch time (UTC)"
    days = sorted({data.start.date().isoformat(), (data.end - timedelta(microseconds=1)).date().isoformat()})
    bucket = f", {fmt_duration(data.bucket.total_seconds())} buckets" if data.bucket else ""
    return f"arrival / batch time (UTC, {' – '.join(days)}{bucket})"


def _timeline_panel(panel: _Panel, data: TimelineData) -> str:
    names = [n for n, _ in panel.lines]
    series = [data.get(n) for n in names]
    values = [_numeric(v) for s in series for _, v in s.points]
    body = _frame(panel.title, panel.y_label, _x_label(data))
    x = _x_scale(data)
    if x is None or not values:
        body += _no_data(names)
    else:
        if panel.unit == "s" and "aggregate_freshness" in names:
            values.append(data.watermark_delay.total_seconds())
        lo, hi = _y_domain(values, panel.unit)
        y = _Scale(lo, hi, PANEL_H - BOTTOM, TOP)
        body += _x_axis(x) + _y_axis(y, panel.unit)
        if "aggregate_freshness" in names:
            ref = y(data.watermark_delay.total_seconds())
            body.append(f'<line class="ref" x1="{LEFT}" x2="{W - RIGHT}" y1="{ref:.1f}" y2="{ref:.1f}"/>')
        body += [_line(s, x, y, label) for s, (_, label) in zip(series, panel.lines, strict=True)]
    return _section(panel.title, body, panel.lines, panel.note)


def _section(title: str, body: list[str], lines: tuple[tuple[str, str], ...], note: str) -> str:
    legend = "".join(f'<span class="key"><i style="background:{COLORS.get(n, "#333")}"></i>'
                     f"{html.escape(label)}</span>" for n, label in lines)
    return (f'<section><h2>{html.escape(title)}</h2>'
            f'<svg width="{W}" height="{PANEL_H}" viewBox="0 0 {W} {PANEL_H}" role="img">{"".join(body)}</svg>'
            f'<p class="legend">{legend} {html.escape(note)}</p></section>')


# ---- histogram / what-if -------------------------------------------------------------------------
def bin_labels(edges: tuple[timedelta, ...]) -> list[str]:
    secs = [fmt_duration(e.total_seconds()) for e in edges]
    return [f"< {secs[0]}"] + [f"{a} – {b}" for a, b in zip(secs, secs[1:], strict=False)] + [f"≥ {secs[-1]}"]


def _log_scale(top: float) -> tuple[_Scale, list[int]]:
    """log10(1 + count) so the long tail of late bins stays visible next to the on-time bin."""
    decades = max(1, math.ceil(math.log10(max(top, 1))))
    if 10 ** decades < top:
        decades += 1
    ticks = [0] + [10**i for i in range(decades + 1)]
    return _Scale(0.0, math.log10(1 + 10**decades), PANEL_H - BOTTOM, TOP), ticks


def _histogram_body(data: TimelineData) -> list[str]:
    hist = data.histogram
    assert hist is not None
    n = len(hist.counts)
    pw = W - LEFT - RIGHT
    bw = pw / n
    y, ticks = _log_scale(max(list(hist.counts) + [c for _, c in data.what_if]))
    out = []
    for v in ticks:
        py = y(math.log10(1 + v))
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}"/>')
        out.append(f'<text class="ytick" x="{LEFT - 5}" y="{py + 4:.1f}">{fmt_count(v)}</text>')
    bars = []
    for i, (count, label) in enumerate(zip(hist.counts, bin_labels(hist.edges), strict=True)):
        x0, py = LEFT + i * bw, y(math.log10(1 + count))
        bars.append(f'<rect x="{x0 + 3:.1f}" y="{py:.1f}" width="{bw - 6:.1f}" height="{PANEL_H - BOTTOM - py:.1f}">'
                    f"<title>{html.escape(label)}: {count}</title></rect>"
                    f'<text class="barval" x="{x0 + bw / 2:.1f}" y="{py - 3:.1f}">{fmt_count(count)}</text>')
        out.append(f'<text class="xtick" x="{x0 + bw / 2:.1f}" y="{PANEL_H - BOTTOM + 14}">{html.escape(label)}</text>')
    out.append(f'<g class="series" data-series="{HISTOGRAM}" data-points="{n}" fill="{COLORS[HISTOGRAM]}">'
               f'{"".join(bars)}</g>')
    out += _what_if_line(data, y, bw)
    return out


def _boundary_x(data: TimelineData, delay: timedelta, bw: float) -> float | None:
    """x of the boundary between the bins below and at/above `delay` (None if not an edge)."""
    edges = data.histogram.edges if data.histogram else ()
    return LEFT + (edges.index(delay) + 1) * bw if delay in edges else None


def _what_if_line(data: TimelineData, y: _Scale, bw: float) -> list[str]:
    pts = [(_boundary_x(data, d, bw), y(math.log10(1 + c)), c) for d, c in data.what_if]
    pts = [(px, py, c) for px, py, c in pts if px is not None]
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in pts)
    dots = "".join(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3"/><text class="whatif" x="{px + 5:.1f}" '
                   f'y="{py - 5:.1f}">{fmt_count(c)}</text>' for px, py, c in pts)
    out = [f'<g class="series" data-series="{WHAT_IF}" data-points="{len(pts)}" stroke="{COLORS[WHAT_IF]}" '
           f'fill="{COLORS[WHAT_IF]}"><polyline fill="none" stroke-width="1.8" points="{path}"/>{dots}</g>']
    mark = _boundary_x(data, data.watermark_delay, bw)
    if mark is not None:
        out.append(f'<line class="marker" x1="{mark:.1f}" x2="{mark:.1f}" y1="{TOP}" y2="{PANEL_H - BOTTOM}"/>'
                   f'<text class="markerlabel" x="{mark + 4:.1f}" y="{TOP + 12}">configured '
                   f"WATERMARK_DELAY {fmt_duration(data.watermark_delay.total_seconds())}</text>")
    return out


def _histogram_panel(data: TimelineData) -> str:
    title = "Lateness histogram and what-if WATERMARK_DELAY"
    body = _frame(title, "records (log scale)", "lag behind the running max event time")
    if data.histogram is None or not sum(data.histogram.counts):
        body += _no_data([HISTOGRAM, WHAT_IF])
    else:
        body += _histogram_body(data)
    configured = dict(data.what_if).get(data.watermark_delay)
    estimate = f"estimated {configured} late records, " if configured is not None else ""
    note = ("Bars: bronze records by how far their event time lies behind the max event time of all "
            "records that arrived before them (kafka_timestamp, partition, offset). Red line: records a "
            "WATERMARK_DELAY equal to that bin edge would send to the late lane. A per-record estimate and "
            "an upper bound: a batch's watermark lags the running max. Configured WATERMARK_DELAY "
            f"{fmt_duration(data.watermark_delay.total_seconds())}: {estimate}"
            f"late_events table has {data.late_events_rows} rows.")
    return _section(title, body, ((HISTOGRAM, "records per bin"), (WHAT_IF, "late under delay = edge")), note)


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
        "topic": data.topic, "generated_at": iso(data.generated_at), "start": iso(data.start),
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
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:16px auto;width:900px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:18px 0 2px}
.meta{color:#555;margin:0 0 6px}.legend{color:#555;font-size:12px;margin:2px 0 0}
.key{margin-right:10px;white-space:nowrap}.key i{display:inline-block;width:10px;height:10px;margin-right:4px}
svg text{font-size:11px;fill:#444}.frame{fill:#fcfcfc;stroke:#bbb}.grid{stroke:#e6e6e6}
.xtick,.xlabel,.barval,.nodata{text-anchor:middle}.ytick{text-anchor:end}.ylabel{text-anchor:middle}
.nodata{font-size:16px;fill:#999}svg text.whatif{fill:#d62728;stroke:none;font-weight:600}
.ref,.marker{stroke:#555;stroke-dasharray:5 4}.markerlabel{fill:#222}
"""


def _header(data: TimelineData) -> str:
    facts = [f"generated {shown(data.generated_at)}", f"bronze rows {data.bronze_rows}",
             f"late_events rows {data.late_events_rows}"]
    if data.newest_event_time is not None:
        age = (data.generated_at - data.newest_event_time).total_seconds()
        facts.append(f"newest event time {shown(data.newest_event_time)} ({fmt_duration(age)} before generation)")
    if data.lateness_overall:
        facts.append("lateness " + ", ".join(f"{k} {fmt_duration(v)}" for k, v in data.lateness_overall.items()))
    return (f"<h1>Event-time timeline — topic {html.escape(data.topic)}</h1>"
            f'<p class="meta">{html.escape(" · ".join(facts))}</p>')


def render(data: TimelineData) -> str:
    """The whole report: header, five timeline panels on one time axis, the histogram panel."""
    blob = json.dumps(payload(data), separators=(",", ":")).replace("</", "<\\/")
    panels = "".join(_timeline_panel(p, data) for p in PANELS) + _histogram_panel(data)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>Timeline — {html.escape(data.topic)} — {shown(data.generated_at)}</title>"
            f"<style>{CSS}</style></head><body>{_header(data)}{panels}"
            f'<script type="application/json" id="timeline-data">{blob}</script></body></html>\n')
