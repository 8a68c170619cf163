"""The Prometheus rules (infra/prometheus/rules): `promtool check rules` and `promtool test rules`
(infra/prometheus/tests: every alert firing and staying quiet on synthetic series); every metric
they read is one the service or the daily exporter exports; every alert links its section of
docs/runbook.md. promtool is the Debian `prometheus` package's (`make system-deps`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "infra/prometheus/rules"
UNIT_TESTS = REPO / "infra/prometheus/tests"
RUNBOOK = REPO / "docs/runbook.md"


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: run `make setup` (the Debian package prometheus)")
    return found


def rules() -> list[dict]:
    return [r for f in sorted(RULES.glob("*.yml")) for g in yaml.safe_load(f.read_text())["groups"]
            for r in g["rules"]]


def alerts() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def test_promtool_checks_the_rules():
    done = subprocess.run([promtool(), "check", "rules", *map(str, sorted(RULES.glob("*.yml")))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass():
    files = sorted(UNIT_TESTS.glob("*_test.yml"))
    done = subprocess.run([promtool(), "test", "rules", *map(str, files)], cwd=UNIT_TESTS,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet():
    fired, quiet = set(), set()
    for f in UNIT_TESTS.glob("*_test.yml"):
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a["alert"] for a in alerts()}
    assert len(names) >= 7
    assert names <= fired, f"never tested firing: {names - fired}"
    assert names <= quiet, f"never tested quiet: {names - quiet}"


def exported_names() -> set[str]:
    """Metric names the service and the daily exporter can export (read from their sources)."""
    names = set()
    for path in ("orchestration/service/metrics.py", "orchestration/daily_metrics.py"):
        text = (REPO / path).read_text()
        for m in re.finditer(r'(Counter|Histogram)?\(?\s*"(lakehouse_[a-z_]+)"', text):
            kind, name = m.group(1), m.group(2)
            if kind == "Counter":
                names.add(name + "_total")
            elif kind == "Histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
            else:
                names.add(name)
    return names


def test_the_rules_read_exported_metrics():
    recorded = {r["record"] for r in rules() if "record" in r}
    exported = exported_names() | recorded | {"up"}
    for r in rules():
        expr = re.sub(r'"[^"]*"', '""', r["expr"])  # no label values
        used = set(re.findall(r"\b([a-z_:][a-z0-9_:]*)\s*(?:\{|\[|\)|$|\s)", expr))
        metrics = {u for u in used if u.startswith(("lakehouse", "pipeline", "instance:", "up"))
                   and u not in {"pipeline"}}
        assert metrics <= exported, f"{r.get('alert') or r.get('record')}: {metrics - exported}"


def test_every_alert_has_a_runbook_section():
    text = RUNBOOK.read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (\w+)\s*$", text, re.MULTILINE)}
    for a in alerts():
        url = a["annotations"]["runbook_url"]
        assert url == f"docs/runbook.md#{a['alert'].lower()}", a["alert"]
        assert a["alert"].lower() in anchors, f"docs/runbook.md has no section ## {a['alert']}"
        section = text.split(f"## {a['alert']}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("Meaning", "PromQL", "First checks", "Fix", "Rollback"):
            assert f"**{part}" in section, f"{a['alert']}: no **{part}** in its runbook section"
