"""The product uses Dagster's public API: a private module (`dagster._...`) changes without
notice at an upgrade. The one exception is named here with its reason; a new one fails."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestration", "assets", "expectations", "spark_jobs", "lakehouse")
# The freshness deadline is the next tick of a user's cron after a date ends: Dagster's own
# freshness checks compute it with this iterator, and no public module offers one.
ALLOWED = {("assets/observe/freshness.py", "dagster._utils.schedules")}


def private_imports() -> set[tuple[str, str]]:
    found = set()
    for room in PRODUCT:
        for path in (REPO / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                         else [])
                found |= {(str(path.relative_to(REPO)), n) for n in names
                          if n.startswith(("dagster._", "dagster_shared._"))}
    return found


def test_the_product_imports_no_private_dagster_module_but_the_one_named():
    assert private_imports() == ALLOWED
