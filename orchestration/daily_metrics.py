"""The daily side as Prometheus metrics (`make daily-metrics`; `make observe-up` runs it as a
daemon) on `127.0.0.1:$DAILY_METRICS_PORT/metrics` (default 9109), computed at scrape time from
what the pipeline already records, never a copy of it:

- the lakehouse's own tables, through the readers of `lakehouse/` (delta-rs, no Spark): gold's
  log position and last update per date (`corrections_state`), the replay's (`replay_state`),
  the corrections applied (`late_corrections`, file statistics of the date's partition) and
  the late events recorded since the date's last corrections run (`late_events`);
- Dagster's instance (DAGSTER_HOME), which records the runs and the proof: the newest
  evaluation of the blocking check `reconciled_equals_replay` covering each date (its verdict
  and the log positions in its metadata), and the last successful run of each job.

Dates: those with bronze data whose correction horizon has not ended, and any date with late
events waiting. Every sample carries `pipeline` (the default pipeline and those of PIPELINES).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

from dagster import AssetCheckKey, DagsterInstance, DagsterRunStatus, RunsFilter
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from assets.observe.freshness import deadline
from assets.pipelines import DEFAULT, Pipeline, spec_pipelines
from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.generations import current
from lakehouse.tables.reads import bronze_dates, read
from lakehouse.tables.state_rows import latest_row
from lakehouse.tables.stats import add_actions

ADDRESS = "127.0.0.1"
CHECK = "reconciled_equals_replay"
JOBS = ("stream_catch_up", "correct_dates", "verify_dates", "reconcile_dates", "reprocess_dates",
        "table_maintenance", "report_timeline", "check_freshness")
HISTORY = 200  # check evaluations read per scrape, newest first


def watched_dates(settings: Settings, now: datetime) -> list[date]:
    """Bronze dates still within the correction horizon (and the day after it), and every date
    with late events."""
    recent = {d for d in bronze_dates(settings)
              if settings.applicable_cutoff(d) + timedelta(days=1) >= now}
    late = add_actions(settings, "late_events")
    if late is not None and "partition.event_date" in late.column_names:
        recent |= {date.fromisoformat(str(v)) for v in late["partition.event_date"].to_pylist() if v}
    return sorted(recent)


def partition_records(settings: Settings, name: str) -> dict[date, int]:
    """Rows per event date of a table, from its Delta log's file statistics (no data file)."""
    actions = add_actions(settings, name)
    if actions is None or "partition.event_date" not in actions.column_names:
        return {}
    out: dict[date, int] = {}
    for d, n in zip(actions["partition.event_date"].to_pylist(),
                    actions["num_records"].to_pylist(), strict=True):
        if d:
            key = date.fromisoformat(str(d))
            out[key] = out.get(key, 0) + int(n or 0)
    return out


def late_waiting(settings: Settings, d: date, since: datetime | None) -> int:
    """Late events of `d` recorded after gold's last corrections run (all of them when there was
    none): what the next corrections run has still to apply."""
    rows = read(settings, "late_events", d)
    if since is None:
        return rows.num_rows
    recorded = rows["recorded_at"].to_pylist()
    return sum(1 for t in recorded if t is not None and _utc(t) > since)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def proof_verdicts(instance: DagsterInstance, p: Pipeline) -> dict[str, dict]:
    """Per date (ISO): the newest evaluation of the proof covering it, as {passed, position,
    at}: passed for that date (the run's verdict, or, when the run failed, whether this date was
    among the failing ones), and the bronze version the replay it checked was capped at."""
    key = AssetCheckKey(p.key("reconciled_aggregates"), CHECK)
    out: dict[str, dict] = {}
    try:
        history = instance.event_log_storage.get_asset_check_execution_history(key, HISTORY)
    except Exception:  # noqa: BLE001 - an instance without the check yet
        history = []
    for record in history:
        entry = record.event
        data = getattr(getattr(entry, "dagster_event", None), "event_specific_data", None)
        if data is None or not hasattr(data, "passed"):
            continue
        meta = {k: getattr(v, "value", v) for k, v in (data.metadata or {}).items()}
        positions = meta.get("log_positions") or {}
        dates = meta.get("dates") or list(positions)
        bad = set(meta.get("no_data_dates") or []) | set(meta.get("incomplete") or {}) \
            | set(meta.get("differing_windows") or {}) | set(meta.get("failed_expectations") or {})
        for d in dates:
            if d in out:
                continue
            pos = positions.get(d) or {}
            same = (pos.get("reconciled_from_bronze_version") is not None
                    and pos.get("reconciled_from_bronze_version")
                    == pos.get("replay_up_to_bronze_version"))
            out[d] = {"passed": bool(data.passed) or (d not in bad and same),
                      "position": pos.get("replay_up_to_bronze_version"),
                      "at": entry.timestamp}
    return out


def last_successes(instance: DagsterInstance, p: Pipeline) -> dict[str, float]:
    out = {}
    for job in JOBS:
        records = instance.get_run_records(
            RunsFilter(job_name=p.named(job), statuses=[DagsterRunStatus.SUCCESS]), limit=1)
        if records and records[0].end_time:
            out[job] = float(records[0].end_time)
    return out


class DailyCollector:
    """Everything below is read at scrape time: a scrape is a few Delta-log reads and small
    table reads per date, and two queries of Dagster's storage per pipeline."""

    def __init__(self, pipelines: list[Pipeline], instance: DagsterInstance | None,
                 clock=time.time):
        self.pipelines = pipelines
        self.instance = instance
        self._clock = clock
        self.errors = 0

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["pipeline", "event_date"]
        fam = {
            "proven": GaugeMetricFamily(
                "lakehouse_daily_proven", "1 when the newest proof covering the date passed and "
                "gold is still at the log position it proved, else 0.", labels=labels),
            "proven_version": GaugeMetricFamily(
                "lakehouse_daily_proven_bronze_version", "The bronze version (log position) the "
                "newest proof of the date replayed up to.", labels=labels),
            "gold_version": GaugeMetricFamily(
                "lakehouse_daily_gold_bronze_version", "The bronze version (log position) gold "
                "was last computed from (corrections_state).", labels=labels),
            "gold_updated": GaugeMetricFamily(
                "lakehouse_daily_gold_updated_timestamp_seconds", "When gold's last corrections "
                "run for the date committed (unix seconds); its age is time() minus it.",
                labels=labels),
            "deadline": GaugeMetricFamily(
                "lakehouse_daily_deadline_timestamp_seconds", "When the date's gold is due "
                "(RECONCILED_DEADLINE_CRON after the date, unix seconds).", labels=labels),
            "corrections": GaugeMetricFamily(
                "lakehouse_daily_corrections", "Corrections applied to the date's published "
                "windows (late_corrections rows).", labels=labels),
            "waiting": GaugeMetricFamily(
                "lakehouse_daily_late_events_waiting", "Late events of the date recorded after "
                "its last corrections run.", labels=labels),
            "beyond": GaugeMetricFamily(
                "lakehouse_daily_late_events_beyond_horizon", "Late events waiting for a date "
                "whose CORRECTION_HORIZON has ended: no run will apply them.", labels=labels),
        }
        runs = GaugeMetricFamily(
            "lakehouse_daily_last_success_timestamp_seconds",
            "When the job's last successful Dagster run ended (unix seconds).",
            labels=["pipeline", "job"])
        feed = GaugeMetricFamily(
            "lakehouse_feed_unsent_versions", "Gold versions the downstream feed "
            "(RECONCILED_TOPIC) had not published at its last run (reconcile_dates publishes "
            "them).",
            labels=["pipeline"])
        errors = GaugeMetricFamily(
            "lakehouse_daily_scrape_errors", "Pipelines whose daily metrics could not be read in "
            "this scrape (see the exporter's log).", labels=["pipeline"])
        for p in self.pipelines:
            try:
                self._pipeline(p, fam, runs)
                self._feed(p, feed)
                errors.add_metric([p.name], 0)
            except Exception as exc:  # noqa: BLE001 - say it, keep serving the others
                print(f"daily metrics: {p.name}: {exc}", file=sys.stderr, flush=True)
                errors.add_metric([p.name], 1)
        yield from fam.values()
        yield runs
        yield feed
        yield errors

    def _feed(self, p: Pipeline, feed: GaugeMetricFamily) -> None:
        """Gold's version minus the one the feed's last run published (its materialization's
        metadata: a query of the run storage, where reading the progress topic would cost a
        consumer and a second per scrape)."""
        s = current(p.settings)
        if self.instance is None or not delta_log.exists(s, "reconciled_aggregates"):
            return
        event = self.instance.get_latest_materialization_event(p.key("reconciled_feed"))
        meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
        sent = meta["published_version"].value if "published_version" in meta else -1
        feed.add_metric([p.name], max(0, delta_log.version(s, "reconciled_aggregates") - sent))

    def _pipeline(self, p: Pipeline, fam: dict, runs: GaugeMetricFamily) -> None:
        s = current(p.settings)  # the current generation's folder
        now = datetime.fromtimestamp(self._clock(), tz=UTC)
        verdicts = proof_verdicts(self.instance, p) if self.instance is not None else {}
        if self.instance is not None:
            for job, t in last_successes(self.instance, p).items():
                runs.add_metric([p.name, job], t)
        if not delta_log.exists(s, "bronze_events"):
            return
        corrections = partition_records(s, "late_corrections")
        for d in watched_dates(s, now):
            key = d.isoformat()
            lv = [p.name, key]
            state = latest_row(s, "corrections_state", d, ("updated_at",))
            gold_v = state.bronze_version if state is not None else None
            since = _utc(state.updated_at) if state is not None else None
            verdict = verdicts.get(key)
            proven = bool(verdict and verdict["passed"] and gold_v is not None
                          and verdict["position"] == gold_v)
            fam["proven"].add_metric(lv, 1.0 if proven else 0.0)
            if verdict and verdict["position"] is not None:
                fam["proven_version"].add_metric(lv, verdict["position"])
            if gold_v is not None:
                fam["gold_version"].add_metric(lv, gold_v)
                fam["gold_updated"].add_metric(lv, since.timestamp())
            fam["deadline"].add_metric(lv, deadline(s, d).timestamp())
            fam["corrections"].add_metric(lv, corrections.get(d, 0))
            waiting = late_waiting(s, d, since) if delta_log.exists(s, "late_events") else 0
            fam["waiting"].add_metric(lv, waiting)
            fam["beyond"].add_metric(lv, waiting if now > s.applicable_cutoff(d) else 0)


def collector(instance: DagsterInstance | None = None) -> DailyCollector:
    """The collector of the default pipeline and those of PIPELINES, over Dagster's instance
    (DAGSTER_HOME) when one is given or configured."""
    if instance is None and os.environ.get("DAGSTER_HOME"):
        instance = DagsterInstance.get()
    return DailyCollector([DEFAULT, *spec_pipelines()], instance)


def serve(port: int, address: str = ADDRESS, instance: DagsterInstance | None = None):
    registry = CollectorRegistry()
    registry.register(collector(instance))
    server, thread = start_http_server(port, addr=address, registry=registry)
    return server, thread


def main() -> int:
    port = DEFAULT.settings.daily_metrics_port
    server, thread = serve(port)
    print(f"daily metrics on http://{ADDRESS}:{port}/metrics", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
