"""Prometheus metrics of the streaming service (`make stream`) on
`127.0.0.1:$METRICS_PORT/metrics` (default 9108), in a registry of their own (never the
process-global one, so two instances can live in one process, e.g. in tests).

Nothing here runs a Spark job. The sources are:

- the `StreamingQueryProgress` reports the service already polls for `stream_progress`
  (`observe_progress`): batch durations, input rates and counts, the ingest query's end
  offsets, the time of the last successful batch;
- the Kafka end offsets (`lakehouse.kafka.admin.topic_offsets`, one batched request), polled by a
  background thread every `poll_seconds` (5 s): consumer lag per partition = end offset - the
  ingest query's processed end offset (Spark commits no consumer-group offsets, docs/design.md §12);
- the Delta logs of `quarantined_events` and `late_events`, followed commit by commit by the same
  thread: the records each blind append added, from the `add` actions' `numRecords` statistic.
  The quarantine reason is a per-file min/max statistic too; a file holding several reasons
  (one batch wrote them together) has its `reason` column read, which is a few rows:
  quarantined records are rare. Counting from the log instead of in the batch keeps the
  foreachBatch hot path as it was, and counts exactly what was committed (a re-run batch finds
  its own append and adds nothing); each late record is also a row dropped by the watermark;
- bronze's Delta log: the watermark stamped on its newest stream commit, and each new stream
  commit's broker append times of the records it added (the `add` actions' min/max
  `kafka_timestamp` statistics): the time the stream is behind the topic (lag in seconds);
- `streaming_aggregates`' Delta log: the commit of each batch's windows (the batch's tag), the
  moment its records become visible to readers: minus the batch's oldest broker append time, the
  end-to-end latency, what a probe from outside measures (produce -> window readable);
- the service's own state: failed queries, the writer lock (held, lost), and the SLO budgets of
  its settings (`lakehouse_slo_budget_seconds`), which the alert rules compare against;
- the streaming checkpoints, once at start (`seed_from_checkpoints`): the last committed
  positions, watermark and commit times, so lag and freshness are known before the first batch
  of a restarted service finishes.

Counters count what happened since the service started (Prometheus handles the reset of a
restart in `rate()`/`increase()`); gauges read "now" at scrape time.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import PartitionOffsets, consumer_lag, topic_offsets
from lakehouse.tables import checkpoints as ckpt
from lakehouse.tables.catalog import INGEST_QUERY, STREAMING
from lakehouse.tables.commit_tags import batch_of, stream_watermark
from lakehouse.tables.delta_log import LogFollower, commit_versions, data_file_uri
from lakehouse.tables.progress_reports import BatchReport
from spark_jobs.transforms.parse import reasons

QUERIES = (INGEST_QUERY,)
ADDRESS = "127.0.0.1"
POLL_SECONDS = 5.0
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, math.inf)
LATENCY_BUCKETS = (1, 2.5, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600, 1800, 3600, math.inf)
VISIBLE_KEPT = 16  # aggregates commits waiting for their bronze commit (one or two, normally)
# Before its first event a query reports watermark 0 (1970-01-01): that is "no watermark yet".
NO_WATERMARK_BEFORE_S = 86_400


class PipelineRegistry(CollectorRegistry):
    """A registry whose every sample carries `pipeline="<name>"`: a service runs one pipeline,
    and one Prometheus scrapes them all."""

    def __init__(self, pipeline: str):
        super().__init__()
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():  # fresh objects per collection: safe to relabel
            metric.samples = [s._replace(labels={"pipeline": self.pipeline, **s.labels})
                              for s in metric.samples]
            yield metric


# ---- Delta logs ----------------------------------------------------------------------------------
def appended(follower: LogFollower) -> list[dict]:
    """The data files the followed table's new commits appended."""
    return [add for commit in follower.new_commits() for add in commit.appended()]


def _records(add: dict) -> int:
    return int(json.loads(add.get("stats") or "{}").get("numRecords", 0))


def _stat_seconds(value) -> float | None:
    """A timestamp statistic (`2026-11-25T10:00:00.123Z`) as unix seconds."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def broker_times(adds: Iterable[dict]) -> tuple[float, float] | None:
    """(oldest, newest) broker append time (unix seconds) of the records in these added files,
    from their min/max `kafka_timestamp` statistics; None when none has them."""
    lows, highs = [], []
    for add in adds:
        stats = json.loads(add.get("stats") or "{}")
        lo = _stat_seconds((stats.get("minValues") or {}).get("kafka_timestamp"))
        hi = _stat_seconds((stats.get("maxValues") or {}).get("kafka_timestamp"))
        if lo is not None and hi is not None:
            lows.append(lo)
            highs.append(hi)
    return (min(lows), max(highs)) if lows else None


def reasons_of(table_uri: str, adds: Iterable[dict]) -> Tally:
    """Quarantined records per reason in these added files: from the file's min/max statistics
    when they agree, else from its `reason` column."""
    import pyarrow.parquet as pq

    tally: Tally = Tally()
    for add in adds:
        stats = json.loads(add.get("stats") or "{}")
        lo = (stats.get("minValues") or {}).get("reason")
        hi = (stats.get("maxValues") or {}).get("reason")
        if lo is not None and lo == hi and "numRecords" in stats:
            tally[lo] += int(stats["numRecords"])
            continue
        filesystem, path = storage.arrow_fs(data_file_uri(table_uri, add))
        tally.update(pq.read_table(path, columns=["reason"], filesystem=filesystem)
                     .column("reason").to_pylist())
    return tally


# ---- metrics -------------------------------------------------------------------------------------
class StreamMetrics:
    """The service's metrics. `observe_progress` is called with each query's progress reports,
    `poll` (a background thread after `start`) reads Kafka offsets and the Delta logs, and the
    HTTP server renders everything at scrape time."""

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None,
                 offsets: Callable[[Settings], list[PartitionOffsets]] = topic_offsets,
                 clock: Callable[[], float] = time.time, poll_seconds: float = POLL_SECONDS):
        self.settings = settings
        self.registry = registry if registry is not None else PipelineRegistry(settings.pipeline)
        self._offsets = offsets
        self._clock = clock
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._topic_offsets: list[PartitionOffsets] = []  # the topic's, from the last poll
        self._processed: dict[int, int] | None = None  # the ingest query's end offset per partition
        self._watermark_s: float | None = None
        self._last_success: dict[str, float] = {}
        self._last_trigger: dict[str, str] = {}  # newest progress `timestamp` seen per query
        self._followers: dict[str, LogFollower] = {}
        self._errors: dict[str, str] = {}
        # Whether the pipeline's ingest query runs (a service of several pipelines stops one
        # whose query failed and goes on with the others; its metrics stay, with this at 0).
        self.query_active = True
        self._server = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        r = self.registry
        self.batch_duration = Histogram(
            "lakehouse_stream_batch_duration_seconds",
            "Wall time of each micro-batch (durationMs.triggerExecution), per query.",
            ["query"], registry=r, buckets=DURATION_BUCKETS)
        self.input_records = Counter(
            "lakehouse_stream_input_records",
            "Records read by the query's micro-batches (numInputRows).", ["query"], registry=r)
        self.dropped = Counter(
            "lakehouse_stream_rows_dropped_by_watermark",
            "Valid events the query left out of the aggregates as at or below the watermark "
            "(each one is in late_events).", ["query"], registry=r)
        self.late_events = Counter(
            "lakehouse_late_events",
            "Rows appended to late_events: events at or below their batch's watermark, kept "
            "for the corrections job.", registry=r)
        self.quarantined = Counter(
            "lakehouse_quarantined_records",
            "Records appended to quarantined_events, by reason code.", ["reason"], registry=r)
        self.batches = Counter(
            "lakehouse_stream_batches",
            "Micro-batches the query completed (committed), from its progress reports.",
            ["query"], registry=r)
        self.batch_failures = Counter(
            "lakehouse_stream_batch_failures",
            "Times the query failed (the service restarts it from its checkpoint unless a "
            "restart cannot help: lakehouse_stream_restarts).", ["query"], registry=r)
        self.restarts = Counter(
            "lakehouse_stream_restarts",
            "Restarts of the ingest query the service scheduled after a failure, by reason "
            "(kafka, registry, delta_conflict, storage, timeout, schemas_changed, unknown, ...).",
            ["reason"], registry=r)
        self.latency = Histogram(
            "lakehouse_end_to_end_latency_seconds",
            "Per micro-batch: the commit that makes its windows visible in streaming_aggregates "
            "(its bronze commit when it changed no window) minus the oldest broker append time "
            "of its records (the longest any record of the batch waited to be readable).",
            registry=r, buckets=LATENCY_BUCKETS)
        self.lock_losses = Counter(
            "lakehouse_writer_lock_losses",
            "Times the service lost its writer lock (it stops the query and exits 3).",
            registry=r)
        self.poll_errors = Counter(
            "lakehouse_metrics_poll_errors",
            "Failed polls of a metrics source (kafka, quarantined_events, late_events, "
            "bronze_events, streaming_aggregates).",
            ["source"], registry=r)
        for q in QUERIES:
            self.batch_duration.labels(q)
            self.input_records.labels(q)
            self.batches.labels(q)
            self.batch_failures.labels(q)
        self.dropped.labels(INGEST_QUERY)
        for reason in reasons(settings.shape):
            self.quarantined.labels(reason)
        for source in ("kafka", "quarantined_events", "late_events", "bronze_events",
                       STREAMING.name):
            self.poll_errors.labels(source)
        self._rates: dict[tuple[str, str], float] = {}
        self._lock_held: bool | None = None  # unknown until the runner says
        self._retrying_s = 0.0
        self._processed_broker_s: float | None = None  # newest broker time committed to bronze
        self._seen_bronze = False  # the first bronze round only positions (no latency sample)
        # Batches in bronze whose aggregates commit is not seen yet: (oldest broker time, bronze
        # commit time) by batch tag, in commit order.
        self._unseen: dict[tuple[str, int] | None, tuple[float, float]] = {}
        # Aggregates commits read before their batch's bronze commit: commit time by batch tag.
        self._visible: dict[tuple[str, int], float] = {}
        r.register(_Gauges(self))

    # ---- progress --------------------------------------------------------------------------
    def observe_progress(self, query: str, progresses: Iterable[dict]) -> int:
        """Take in a query's progress reports (all of `recentProgress` is fine: reports already
        seen, by their trigger timestamp, are skipped). Returns how many were new."""
        new = 0
        for r in sorted(map(BatchReport.of, progresses), key=lambda r: r.stamp):
            if r.stamp <= self._last_trigger.get(query, ""):
                continue
            self._last_trigger[query] = r.stamp
            new += 1
            self._observe(query, r)
        return new

    def _observe(self, query: str, r: BatchReport) -> None:
        started = r.timestamp.timestamp() if r.timestamp is not None else None
        seconds = r.trigger_ms / 1000
        if r.executed:  # else an idle report: no batch ran
            self.batches.labels(query).inc()
            self.batch_duration.labels(query).observe(seconds)
            self.input_records.labels(query).inc(r.input_rows)
        with self._lock:
            self._rates[(query, "input")] = r.input_rate
            self._rates[(query, "processed")] = r.processed_rate
            if r.executed and started is not None:
                self._last_success[query] = max(self._last_success.get(query, 0.0), started + seconds)
            if query == INGEST_QUERY and r.processed:
                self._processed = r.processed

    def seed_from_checkpoints(self, spark) -> None:
        """What the checkpoint says before the first batch reports: the query's processed
        offsets and its last commit time; and the watermark (from bronze's Delta log).
        Reads a few checkpoint files through Hadoop's FileSystem (no Spark job)."""
        try:
            path = self.settings.checkpoint_path(INGEST_QUERY)
            last = ckpt.last_committed_batch(path)
            offsets = ckpt.batch_offsets(path, last) if last is not None else None
            end = ((offsets.sources[0] or {}).get(self.settings.events_topic)
                   if offsets and offsets.sources else None)
            watermark = stream_watermark(self.settings)
            times = {q: ckpt.last_commit_time(self.settings.checkpoint_path(q)) for q in QUERIES}
        except Exception as exc:  # noqa: BLE001 - metrics must never stop the service
            print(f"metrics: could not read the checkpoints: {exc}", file=sys.stderr, flush=True)
            return
        with self._lock:
            if end and self._processed is None:
                self._processed = {int(k): int(v) for k, v in end.items()}
            if watermark is not None and self._watermark_s is None:
                self._watermark_s = watermark.timestamp()
            for q, t in times.items():
                if t is not None:
                    self._last_success.setdefault(q, t)

    # ---- the runner's events ---------------------------------------------------------------
    def lock_held(self, held: bool) -> None:
        """The writer lock was taken (True) or lost (False)."""
        with self._lock:
            if self._lock_held and not held:
                self.lock_losses.inc()
            self._lock_held = held

    def query_failed(self, query: str) -> None:
        self.batch_failures.labels(query).inc()

    def restart_scheduled(self, reason: str, restarting: bool) -> None:
        """The runner's answer to a failure: a restart (counted by reason), or none."""
        if restarting:
            self.restarts.labels(reason).inc()

    def retrying(self, seconds: float) -> None:
        """How long the current series of failures has lasted (0: none)."""
        with self._lock:
            self._retrying_s = seconds

    # ---- polling ---------------------------------------------------------------------------
    def _follow(self, name: str) -> LogFollower:
        if name not in self._followers:
            self._followers[name] = LogFollower(self.settings.table_path(name))
        return self._followers[name]

    def _guard(self, source: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - count it, say it once, keep polling
            self.poll_errors.labels(source).inc()
            if self._errors.get(source) != str(exc):
                print(f"metrics: polling {source} failed: {exc}", file=sys.stderr, flush=True)
            self._errors[source] = str(exc)
        else:
            self._errors.pop(source, None)

    def start_following_tables(self) -> None:
        """Start the Delta-log followers at the tables' current versions: records committed
        from now on are counted (call before the queries start)."""
        for name in ("quarantined_events", "late_events", STREAMING.name):
            self._guard(name, lambda name=name: self._follow(name))

        def bronze() -> None:  # from its newest commit: the broker time it has reached
            uri = self.settings.table_path("bronze_events")
            self._followers["bronze_events"] = LogFollower(
                uri, start=max(-1, max(commit_versions(uri), default=-1) - 1))
        self._guard("bronze_events", bronze)

    def poll(self) -> None:
        """One round: Kafka end offsets, then the new commits of the Delta tables."""
        def kafka() -> None:
            offsets = self._offsets(self.settings)
            with self._lock:
                self._topic_offsets = list(offsets)

        def quarantine() -> None:
            follower = self._follow("quarantined_events")
            for reason, n in reasons_of(follower.table_uri, appended(follower)).items():
                self.quarantined.labels(reason).inc(n)

        def late() -> None:
            n = sum(_records(a) for a in appended(self._follow("late_events")))
            if n:
                self.late_events.inc(n)
                self.dropped.labels(INGEST_QUERY).inc(n)

        def watermark() -> None:
            # Stamped on bronze's newest stream commit by the batch that moved it.
            wm = stream_watermark(self.settings)
            if wm is not None and wm.timestamp() >= NO_WATERMARK_BEFORE_S:
                with self._lock:
                    self._watermark_s = max(self._watermark_s or 0.0, wm.timestamp())

        def bronze() -> None:
            for commit in self._follow("bronze_events").new_commits():
                times = broker_times(commit.appended())
                if times is None or commit.timestamp < 0:
                    continue
                oldest, newest = times
                batch = batch_of(commit.user_metadata)
                if batch in self._visible:  # its windows were committed before this round read it
                    self.latency.observe(max(0.0, self._visible.pop(batch) - oldest))
                elif self._seen_bronze:
                    self._unseen[batch] = (oldest, commit.timestamp / 1000)
                with self._lock:
                    self._processed_broker_s = max(self._processed_broker_s or 0.0, newest)
            self._seen_bronze = True

        def visible() -> None:
            # A batch's windows become visible with its aggregates commit (same batch tag),
            # written right after its bronze commit: by the time a later batch is in bronze,
            # an earlier batch without one (all its events late or duplicates) never gets one,
            # and its records were visible with bronze.
            for commit in self._follow(STREAMING.name).new_commits():
                batch = batch_of(commit.user_metadata)
                if batch is None or commit.timestamp < 0:
                    continue
                if batch in self._unseen:
                    self.latency.observe(max(0.0, commit.timestamp / 1000
                                             - self._unseen.pop(batch)[0]))
                elif self._seen_bronze:  # its bronze commit came after this round read bronze
                    self._visible[batch] = commit.timestamp / 1000
            for batch in list(self._visible)[:-VISIBLE_KEPT]:  # made before the service started
                del self._visible[batch]
            for batch in list(self._unseen)[:-1]:
                oldest, committed = self._unseen.pop(batch)
                self.latency.observe(max(0.0, committed - oldest))

        self._guard("kafka", kafka)
        self._guard("quarantined_events", quarantine)
        self._guard("late_events", late)
        self._guard("bronze_events", watermark)
        self._guard("bronze_events", bronze)
        self._guard(STREAMING.name, visible)

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.poll_seconds):
                return

    # ---- scrape-time gauges ----------------------------------------------------------------
    def position(self) -> dict[int, int]:
        """The ingest query's processed end offset per partition ({} before it is known)."""
        with self._lock:
            return dict(self._processed or {})

    def lag(self) -> dict[int, int]:
        """Records behind per partition; {} until both the topic's end offsets and the stream's
        position are known."""
        with self._lock:
            if self._processed is None:
                return {}
            return consumer_lag(self._topic_offsets, self._processed)

    def budgets(self) -> dict[str, float]:
        s = self.settings
        return {"stall": s.stall_after.total_seconds(), "lag": s.lag_budget.total_seconds(),
                "latency": s.latency_budget.total_seconds(),
                "freshness": s.stream_freshness.total_seconds(),
                "watermark_delay": s.watermark_delay.total_seconds()}

    def gauges(self) -> Iterator[Metric]:
        now = self._clock()
        with self._lock:
            watermark = self._watermark_s
            last_success = dict(self._last_success)
            rates = dict(self._rates)
        with self._lock:
            held, reached = self._lock_held, self._processed_broker_s
            retrying = self._retrying_s
        lag = GaugeMetricFamily(
            "lakehouse_kafka_consumer_lag_records",
            "Kafka end offset minus the ingest query's processed end offset, per partition.",
            labels=["topic", "partition"])
        behind = self.lag()
        for p, n in behind.items():
            lag.add_metric([self.settings.events_topic, str(p)], n)
        yield lag
        lag_s = GaugeMetricFamily(
            "lakehouse_kafka_consumer_lag_seconds",
            "How far in time the stream is behind the topic: 0 without lag, else now minus the "
            "newest broker append time committed to bronze (an upper bound of the oldest "
            "unprocessed record's wait).")
        if behind and not any(behind.values()):
            lag_s.add_metric([], 0.0)
        elif behind and reached is not None:
            lag_s.add_metric([], max(0.0, now - reached))
        yield lag_s
        budgets = GaugeMetricFamily(
            "lakehouse_slo_budget_seconds",
            "The service's SLO budgets from its settings (the alert thresholds): stall "
            "(STALL_AFTER), lag (LAG_BUDGET), latency (LATENCY_BUDGET), freshness "
            "(STREAM_FRESHNESS), watermark_delay (WATERMARK_DELAY).", labels=["slo"])
        for slo, value in self.budgets().items():
            budgets.add_metric([slo], value)
        yield budgets
        if held is not None:
            yield GaugeMetricFamily(
                "lakehouse_writer_lock_held",
                "1 while the service holds the stream's writer lock, 0 once it lost it.",
                value=1.0 if held else 0.0)
        for kind, doc in (("input", "Records per second arriving at the query in its last "
                                    "trigger (inputRowsPerSecond)."),
                          ("processed", "Records per second the query processed in its last "
                                        "trigger (processedRowsPerSecond).")):
            rate = GaugeMetricFamily(f"lakehouse_stream_{kind}_records_per_second", doc,
                                     labels=["query"])
            for (q, k), v in sorted(rates.items()):
                if k == kind:
                    rate.add_metric([q], v)
            yield rate
        yield GaugeMetricFamily(
            "lakehouse_stream_retrying_seconds",
            "How long the ingest query has been failing and restarted with backoff (seconds "
            "since the first failure of the series; 0 once a restarted query ran a batch or "
            "30 s without failing).", value=retrying)
        yield GaugeMetricFamily(
            "lakehouse_stream_query_active",
            "1 while the pipeline's ingest query runs in the service, 0 once it stopped on an "
            "error (the service goes on with its other pipelines).",
            value=1 if self.query_active else 0)
        success = GaugeMetricFamily(
            "lakehouse_stream_last_success_timestamp_seconds",
            "When the query's last micro-batch completed (unix seconds).", labels=["query"])
        for q, t in sorted(last_success.items()):
            success.add_metric([q], t)
        yield success
        if watermark is None:
            return
        yield GaugeMetricFamily(
            "lakehouse_stream_watermark_timestamp_seconds",
            "The stream's event-time watermark (unix seconds): max event time seen "
            "minus WATERMARK_DELAY.", value=watermark)
        yield GaugeMetricFamily(
            "lakehouse_stream_watermark_delay_seconds",
            "How far the watermark is behind now (seconds): WATERMARK_DELAY plus how old the "
            "newest event is.", value=now - watermark)
        window = self.settings.window_size.total_seconds()
        closed_end = math.floor(watermark / window) * window
        yield GaugeMetricFamily(
            "lakehouse_aggregate_freshness_seconds",
            "Age of the newest closed (final) window of streaming_aggregates: now minus the end "
            "of the newest window at or below the watermark (seconds).", value=now - closed_end)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, port: int | None = None, address: str = ADDRESS, serve: bool = True) -> bool:
        """Start polling and (`serve`) serve /metrics. A port in use is reported, not fatal: the
        stream matters more than its metrics (and Prometheus shows the target down). Returns
        whether the server is up. A service of several pipelines serves them all on one port
        (`exposing`), each pipeline's metrics started with `serve=False`."""
        if serve:
            port = self.settings.metrics_port if port is None else port
            self._server = http_server([self.registry], port, address)
            if self._server is None:
                return False
        self.start_following_tables()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="metrics-poll", daemon=True)
        self._thread.start()
        if serve:
            print(f"metrics on http://{address}:{port}/metrics", flush=True)
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Gauges:
    """Registry adapter: the gauges computed at scrape time."""

    def __init__(self, metrics: StreamMetrics):
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return self._metrics.gauges()


class _Merged:
    """Several pipelines' registries as one collector: samples of the same metric name from
    each pipeline go in one family (the exposition format allows a name once)."""

    def __init__(self, registries: list[CollectorRegistry]):
        self._registries = registries

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for registry in self._registries:
            for metric in registry.collect():
                if metric.name in families:
                    families[metric.name].samples.extend(metric.samples)
                else:
                    families[metric.name] = metric
        yield from families.values()


def http_server(registries: list[CollectorRegistry], port: int, address: str = ADDRESS):
    """/metrics of these registries on `address:port`, or None (said) when the port is taken."""
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged(registries))
    try:
        server, _ = start_http_server(port, addr=address, registry=merged)
    except OSError as exc:
        print(f"metrics: cannot serve on {address}:{port} ({exc}); running without metrics",
              file=sys.stderr, flush=True)
        return None
    return server


@contextmanager
def exposing(metrics: Iterable[StreamMetrics | None], port: int,
             address: str = ADDRESS) -> Iterator[bool]:
    """Every pipeline's metrics of a service on one port for the block (yields whether up)."""
    server = http_server([m.registry for m in metrics if m is not None], port, address)
    if server is not None:
        print(f"metrics on http://{address}:{port}/metrics", flush=True)
    try:
        yield server is not None
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


@contextmanager
def serving(settings: Settings, spark=None, serve: bool = True, **kw) -> Iterator[StreamMetrics]:
    """`StreamMetrics` polling (and, `serve`, serving) for the duration of the block (seeded
    from the checkpoints when `spark` is given)."""
    metrics = StreamMetrics(settings, **kw)
    if spark is not None:
        metrics.seed_from_checkpoints(spark)
    metrics.start(serve=serve)
    try:
        yield metrics
    finally:
        metrics.stop()
