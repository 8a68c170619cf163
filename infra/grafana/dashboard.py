"""The Grafana dashboard of the pipeline's SLIs, as code (grafana-foundation-sdk): `make
dashboards` prints it into infra/grafana/lakehouse.json, the committed file Grafana imports
(tests/unit/test_dashboard.py checks the two agree; tests/e2e/test_dashboard_queries.py runs
every panel's query in Prometheus).

The panels read the recording rules of infra/prometheus/rules/sli.yml and the daily exporter's
metrics, filtered by the `pipeline` variable; the data source is picked by `datasource`."""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
P = 'pipeline=~"$pipeline"'

# (title, unit, [(PromQL, legend)]) per row; every query is run against Prometheus by the test.
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Stream", [
        ("Consumer lag (records)", "short",
         [(f"pipeline:lakehouse_consumer_lag_records:sum{{{P}}}", "{{pipeline}}")]),
        ("Consumer lag (time behind the topic)", "s",
         [(f"pipeline:lakehouse_consumer_lag_seconds:max{{{P}}}", "{{pipeline}}"),
          (f'lakehouse_slo_budget_seconds{{{P},slo="lag"}}', "{{pipeline}} budget")]),
        ("End-to-end latency p95 (broker append to window visible)", "s",
         [(f"pipeline:lakehouse_end_to_end_latency_seconds:p95_5m{{{P}}}", "{{pipeline}}"),
          (f'lakehouse_slo_budget_seconds{{{P},slo="latency"}}', "{{pipeline}} budget")]),
        ("Throughput (records/s)", "short",
         [(f"pipeline:lakehouse_input_records:rate5m{{{P}}}", "{{pipeline}}")]),
        ("Quarantined records/s by reason", "short",
         [(f"pipeline_reason:lakehouse_quarantined_records:rate5m{{{P}}} > 0",
           "{{pipeline}} {{reason}}")]),
        ("Commit success ratio", "percentunit",
         [(f"pipeline:lakehouse_commit_success:ratio_rate15m{{{P}}}", "{{pipeline}}")]),
        ("Batch failures (15 min)", "short",
         [(f"pipeline:lakehouse_batch_failures:increase15m{{{P}}}", "{{pipeline}}")]),
        ("Last batch age", "s",
         [(f"pipeline:lakehouse_last_batch_age_seconds{{{P}}}", "{{pipeline}}"),
          (f'lakehouse_slo_budget_seconds{{{P},slo="stall"}}', "{{pipeline}} stall budget")]),
        ("Aggregate freshness", "s",
         [(f"lakehouse_aggregate_freshness_seconds{{{P}}}", "{{pipeline}}"),
          (f'lakehouse_slo_budget_seconds{{{P},slo="freshness"}}', "{{pipeline}} budget")]),
        ("Service up", "short",
         [("instance:lakehouse_service_up", "{{instance}}"),
          (f"lakehouse_writer_lock_held{{{P}}}", "{{pipeline}} writer lock")]),
    ]),
    ("Daily", [
        ("Dates proven (1) / unproven (0)", "short",
         [(f"lakehouse_daily_proven{{{P}}}", "{{pipeline}} {{event_date}}")]),
        ("Gold age", "s",
         [(f"time() - lakehouse_daily_gold_updated_timestamp_seconds{{{P}}}",
           "{{pipeline}} {{event_date}}")]),
        ("Time to deadline", "s",
         [(f"lakehouse_daily_deadline_timestamp_seconds{{{P}}} - time()",
           "{{pipeline}} {{event_date}}")]),
        ("Corrections applied", "short",
         [(f"lakehouse_daily_corrections{{{P}}}", "{{pipeline}} {{event_date}}")]),
        ("Late events waiting (beyond the horizon)", "short",
         [(f"lakehouse_daily_late_events_waiting{{{P}}}", "{{pipeline}} {{event_date}} waiting"),
          (f"lakehouse_daily_late_events_beyond_horizon{{{P}}}",
           "{{pipeline}} {{event_date}} beyond")]),
        ("Last successful run per job (age)", "s",
         [(f"time() - lakehouse_daily_last_success_timestamp_seconds{{{P}}}",
           "{{pipeline}} {{job}}")]),
    ]),
]
STATS = ("Service up", "Dates proven (1) / unproven (0)")
TABLES = ("Last successful run per job (age)",)


def queries() -> list[str]:
    """Every panel's PromQL, as written (with the dashboard's variables)."""
    return [q for _, panels in ROWS for _, _, targets in panels for q, _ in targets]


def _panel(title: str, unit: str, targets: list[tuple[str, str]]):
    kind = stat if title in STATS else table if title in TABLES else timeseries
    panel = kind.Panel().title(title).unit(unit).datasource(DS).height(8).span(8)
    for i, (expr, legend) in enumerate(targets):
        q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
        panel = panel.with_target(q.instant() if kind is table else q)
    return panel


def build() -> dict:
    board = (dash.Dashboard("Event-time lakehouse: SLIs")
             .uid("lakehouse-slis").tags(["lakehouse"]).timezone("utc")
             .time("now-6h", "now").refresh("30s")
             .with_variable(dash.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus"))
             .with_variable(dash.QueryVariable("pipeline").label("Pipeline").datasource(DS)
                            .query("label_values(lakehouse_slo_budget_seconds, pipeline)")
                            .multi(True).include_all(True).all_value(".*")))
    for row, panels in ROWS:
        board = board.with_row(dash.Row(row))
        for title, unit, targets in panels:
            board = board.with_panel(_panel(title, unit, targets))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
