"""The readiness scorecard of a running pipeline: seven rows (timestamp, lateness, replay,
scaling, cost, governance, observability), each with its owner, metric, threshold, dashboard
panel, rollback action and the evidence for its verdict, read from the deployment itself (the
topic, the tables, the runs, the alert rules, the bench and drill result files). Written as
`reports/scorecard.html` and `scorecard.json` under the pipeline's root; each row is an asset
check, so a row whose evidence is missing fails and says what to do (`make scorecard`)."""


import html
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import dagster as dg
import yaml
from confluent_kafka import KafkaException

from assets.pipelines import Pipeline
from assets.resources import KafkaResource, LakehouseResource
from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.kafka.feed import published_version
from lakehouse.kafka.topic_checks import TopicMisconfigured, require_log_append_time
from lakehouse.tables import delta_log
from lakehouse.tables.reads import bronze_dates, compare_tables

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "infra" / "prometheus" / "rules" / "alerts.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RESULTS = REPO / "bench" / "results"
ROWS = ("timestamp", "lateness", "replay", "scaling", "cost", "governance", "observability")


@dataclass
class Row:
    name: str
    passed: bool
    metric: str
    threshold: str
    panel: str  # the Grafana dashboard's panel (infra/grafana/dashboard.py)
    rollback: str
    evidence: dict = field(default_factory=dict)
    todo: str = ""  # what to do when it fails


def _newest(pattern: str) -> Path | None:
    files = sorted(RESULTS.glob(pattern))
    return files[-1] if files else None


def _runbook_anchors() -> set[str]:
    if not RUNBOOK.exists():
        return set()
    import re

    return {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in RUNBOOK.read_text().splitlines() if line.startswith("#")}


def _last_materialization(instance, key: dg.AssetKey) -> dict | None:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    return {k: v.value for k, v in event.asset_materialization.metadata.items()
            if isinstance(v.value, (int, float, str, bool)) or k == "cost"} | {
        "at": datetime.fromtimestamp(event.timestamp, UTC).isoformat()}


def evaluate(p: Pipeline, settings: Settings, kafka: KafkaResource, instance) -> list[Row]:
    """The seven rows for pipeline `p` as the deployment stands."""
    status = kafka.status(p.name)
    try:
        require_log_append_time(settings)
        timestamps = None
    except TopicMisconfigured as exc:
        timestamps = str(exc)
    except KafkaException as exc:  # no such topic yet, a broker down: said, not raised
        timestamps = f"the topic {settings.events_topic!r} could not be described ({exc})"
    dates = sorted(bronze_dates(settings)) if delta_log.exists(settings, "bronze_events") else []
    gold = delta_log.exists(settings, "reconciled_aggregates")
    anchors = _runbook_anchors()
    rules = yaml.safe_load(RULES.read_text()) if RULES.exists() else {"groups": []}
    alerts = [r for g in rules.get("groups", []) for r in g.get("rules", []) if "alert" in r]
    unanchored = [a["alert"] for a in alerts
                  if a.get("annotations", {}).get("runbook_url", "#").split("#", 1)[1] not in anchors]
    # The dates still within the correction horizon: older ones are final and were proven then.
    recent = set(settings.recent_dates(datetime.now(UTC).date()))
    differing = ({d.isoformat(): compare_tables(settings, d) for d in dates if d in recent}
                 if gold else {})
    replay = _last_materialization(instance, p.key("replay_aggregates"))
    capacity, drill = _newest("service-*.json"), _newest("drills-*.json")
    sent = published_version(settings) if gold else -1
    gold_v = delta_log.version(settings, "reconciled_aggregates") if gold else -1
    rows = [
        Row("timestamp", timestamps is None,
            "lakehouse_stream_watermark_timestamp_seconds", f"future skew {settings.future_skew}",
            "Aggregate freshness", "docs/runbook.md#lakehousestreamstalled",
            {"policy": settings.timestamp_policy, "future_skew_s": settings.future_skew.total_seconds(),
             "topic": status.topic, "broker_timestamps": timestamps or "LogAppendTime",
             "event_dates": [d.isoformat() for d in dates]}, timestamps or ""),
        Row("lateness", status.retention_ms is not None and status.retention_warning is None,
            "lakehouse_daily_late_events_waiting", f"watermark {settings.watermark_delay}, "
            f"horizon {settings.correction_horizon} within the topic's retention",
            "Dates proven (1) / unproven (0)", "docs/runbook.md#lakehousedateunproven",
            {"watermark_delay_s": settings.watermark_delay.total_seconds(),
             "correction_horizon_s": settings.correction_horizon.total_seconds(),
             "retention_ms": status.retention_ms, "retention_warning": status.retention_warning},
            status.retention_warning or ("" if status.retention_ms is not None else
                                         f"no retention read for {settings.events_topic!r}: "
                                         "does the topic exist?")),
        Row("replay", bool(differing) and not any(differing.values()),
            "lakehouse_daily_proven", "every date: reconciled == replay",
            "Dates proven (1) / unproven (0)", "make materialize SELECT=replay_aggregates,reconciled_aggregates "
            "PARTITION=<date> (reprocess_dates)",
            {"differing_windows_by_date": differing, "last_replay": replay},
            "" if differing else "no date reconciled yet: run reconcile_dates"),
        Row("scaling", capacity is not None,
            "lakehouse_kafka_consumer_lag_records", "lag flat at the bench's capacity",
            "Consumer lag (records)", "docs/runbook.md#lakehouselagoverbudget",
            {"capacity_result": capacity and capacity.name, "drill_result": drill and drill.name,
             "lag_now": status.lag},
            "" if capacity else "no capacity result: run make bench-service"),
        Row("cost", replay is not None and bool(replay.get("cost")),
            "the replay's cost drivers (its metadata's `cost`)", "docs/cost.md's formula",
            "Throughput (records/s)", "docs/cost.md",
            {"last_replay_records_read": replay and replay.get("records_read"),
             "last_replay_cost": replay and replay.get("cost")},
            "" if replay and replay.get("cost") else
            "no replay run recorded its cost: run reconcile_dates"),
        Row("governance", bool(settings.pipeline_owner),
            "-", "an owner named", "-", "docs/security.md",
            {"owner": settings.pipeline_owner, "asset_owners": settings.asset_owners,
             "tables": storage.join(settings.root),
             "topic": settings.events_topic, "feed_topic": settings.feed_topic,
             "retention_ms": status.retention_ms},
            "" if settings.pipeline_owner else "no owner: give the spec `owners` (e-mail "
            "addresses or team:<name>: its assets' Dagster owners) or set PIPELINE_OWNER in the "
            "deployment's environment"),
        Row("observability", bool(alerts) and not unanchored and (not gold or sent == gold_v),
            "ALERTS", f"{len(alerts)} alert rules, each with a runbook section; the feed at "
            "gold's version", "Service up", "docs/runbook.md",
            {"alert_rules": len(alerts), "without_runbook_section": unanchored,
             "feed_published_version": sent, "gold_version": gold_v},
            "" if alerts and not unanchored and sent == gold_v else
            "alert rules missing or without a runbook section, or the feed behind gold: "
            "run reconcile_dates"),
    ]
    for r in rows:
        if not r.passed and not r.todo:
            r.todo = "see the evidence"
    return rows


def write_report(settings: Settings, p: Pipeline, rows: list[Row]) -> str:
    """reports/scorecard.html and scorecard.json under the pipeline's root; the HTML's path."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    data = {"pipeline": p.name, "written_at": now, "rows": [asdict(r) for r in rows]}
    cells = "".join(
        f"<tr class={'pass' if r.passed else 'fail'}><td>{r.name}</td>"
        f"<td>{'pass' if r.passed else 'FAIL'}</td><td>{html.escape(r.metric)}</td>"
        f"<td>{html.escape(r.threshold)}</td><td>{html.escape(r.panel)}</td>"
        f"<td>{html.escape(r.rollback)}</td>"
        f"<td><pre>{html.escape(json.dumps(r.evidence, indent=1, default=str))}</pre></td>"
        f"<td>{html.escape(r.todo)}</td></tr>" for r in rows)
    page = (f"<!doctype html><meta charset=utf-8><title>Readiness: {p.name}</title>"
            "<style>body{font-family:sans-serif}td{vertical-align:top;padding:4px}"
            ".fail td:nth-child(2){color:#b00;font-weight:bold}</style>"
            f"<h1>Readiness scorecard: {html.escape(p.name)}</h1><p>{now}</p><table>"
            "<tr><th>row</th><th>verdict</th><th>metric</th><th>threshold</th><th>panel</th>"
            f"<th>rollback</th><th>evidence</th><th>to do</th></tr>{cells}</table>")
    path = settings.path("reports", "scorecard.html")
    storage.write_text(settings.path("reports", "scorecard.json"),
                       json.dumps(data, indent=1, default=str))
    storage.write_text(path, page)
    return path


@cache
def scorecard_asset(p: Pipeline) -> dg.AssetsDefinition:
    key = p.key("readiness_scorecard")

    @dg.asset(key=key, deps=[p.key("reconciled_feed")], group_name=p.group("observe"), owners=p.owners,
              kinds={"html"},
              check_specs=[dg.AssetCheckSpec(name=row, asset=key) for row in ROWS],
              description="The readiness scorecard of the running pipeline (timestamp, "
                          "lateness, replay, scaling, cost, governance, observability): each "
                          "row's owner, metric, threshold, panel, rollback and evidence; "
                          "reports/scorecard.html under $LAKEHOUSE_ROOT. `make scorecard`.")
    def readiness_scorecard(context: dg.AssetExecutionContext, lakehouse: LakehouseResource,
                            kafka: KafkaResource):
        settings = lakehouse.settings_for(p.name)
        rows = evaluate(p, settings, kafka, context.instance)
        path = write_report(settings, p, rows)
        yield dg.MaterializeResult(metadata={
            "path": dg.MetadataValue.path(path),
            "owner": settings.pipeline_owner or "",
            "verdicts": dg.MetadataValue.json({r.name: r.passed for r in rows}),
        })
        for r in rows:
            yield dg.AssetCheckResult(
                check_name=r.name, passed=r.passed,
                description=r.todo or f"{r.name}: ready",
                metadata={"evidence": dg.MetadataValue.json(
                    json.loads(json.dumps(r.evidence, default=str))),
                    "metric": r.metric, "threshold": r.threshold, "rollback": r.rollback})

    return readiness_scorecard


def main() -> int:
    """`make scorecard`'s last step: the rows of the report the run wrote, a line each."""
    settings = Settings.from_env()
    text = storage.read_text(settings.path("reports", "scorecard.json"))
    if text is None:
        print("scorecard: no report written", flush=True)
        return 1
    for r in json.loads(text)["rows"]:
        print(f"  {r['name']:14s} {'pass' if r['passed'] else 'FAIL'}"
              + (f"  {r['todo']}" if r["todo"] else ""))
    print(f"scorecard: {settings.path('reports', 'scorecard.html')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
