"""Every third-party package the repo imports is declared in pyproject.toml (the dependencies or
an extra), so `make setup` installs it: none arrives only as another package's dependency."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"],
             *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return {canonical(re.match(r"[A-Za-z0-9._-]+", s).group()) for s in specs}


def python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [REPO / line for line in out.splitlines()]


def imported(path: Path) -> set[str]:
    """Top-level names `path` imports, including `importlib.import_module("x")` and
    `pytest.importorskip("x")` with a literal name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in {"import_module", "importorskip"} and node.args
              and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def test_every_third_party_import_is_declared():
    files = python_files()
    local = {p.stem for p in files} | {d.name for p in files for d in p.relative_to(REPO).parents}
    distributions = packages_distributions()
    wanted = declared()
    undeclared = {}
    for path in files:
        for name in imported(path) - local - set(sys.stdlib_module_names):
            dists = distributions.get(name)
            if not dists or not {canonical(d) for d in dists} & wanted:
                undeclared.setdefault(f"{name} ({', '.join(dists or ['not installed'])})",
                                      []).append(str(path.relative_to(REPO)))
    assert len(files) > 100
    assert not undeclared, f"imported, not declared in pyproject.toml: {undeclared}"
