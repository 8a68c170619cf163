"""The Grafana dashboard as code (infra/grafana/dashboard.py): the committed JSON is the
generator's output (`make dashboards`); every panel's query in a real Prometheus:
tests/e2e/test_dashboard_queries.py."""

import json

from conftest import REPO

from testkit.infra import infra_module

dashboard = infra_module("grafana/dashboard.py")


def test_the_committed_dashboard_is_the_generators_output():
    committed = (REPO / "infra/grafana/lakehouse.json").read_text()
    assert committed == dashboard.render(), "run `make dashboards` and commit the JSON"
    board = json.loads(committed)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs == dashboard.queries() and len(exprs) >= 15
