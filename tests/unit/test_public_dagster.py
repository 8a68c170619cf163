"""The product uses Dagster's public API: a private module (`dagster._...`) changes without
notice at an upgrade: none is imported (the freshness deadline's cron steps with
`lakehouse.config.cron`, checked against Dagster's own iterator in tests/unit/test_cron.py)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestration", "assets", "expectations", "spark_jobs", "lakehouse")


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


def test_the_product_imports_no_private_dagster_module():
    assert private_imports() == set()
