"""`make test` builds a module's fixture once: pytest-xdist's `--dist loadgroup` keeps the tests
of one group (tests/conftest.py gives a module-scoped fixture's tests one) on one worker. With
pytest 9.2 it silently stopped (pytest-dev/pytest-xdist#1386) and every such fixture, minutes of
Spark and Kafka each, was built on both workers."""

from __future__ import annotations

import os
import subprocess
import sys

MODULE = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with open(os.environ["BUILT"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("n", range(6))
def test_uses_it(shared, n):
    pass


@pytest.mark.parametrize("n", range(6))
def test_alone(n):
    pass
"""


def test_a_group_runs_on_one_worker_and_builds_its_module_fixture_once(tmp_path):
    (tmp_path / "test_grouped.py").write_text(MODULE)
    built = tmp_path / "built.txt"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        # xdist alone (the other installed plugins' imports cost its three processes seconds)
        env={**os.environ, "BUILT": str(built), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 passed" in out.stdout
    assert len(built.read_text().split()) == 1, f"the fixture was built on {built.read_text().split()}"


def test_no_two_test_modules_share_a_name():
    """The suite's modules are imported by their file name (rootdir-relative `conftest`
    imports, no packages): two `test_x.py` in different folders make the second fail to collect
    ("import file mismatch") wherever the first was imported before it, by order."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], sorted(
        str(p.relative_to(tests)) for p in tests.rglob("test_*.py") if names[p.name] > 1)
