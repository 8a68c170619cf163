"""`make setup`'s prerequisites (infra/prerequisites.sh, run before the venv is created): a wrong
Python, a Python without venv, too little memory or disk is one line saying what to do, and a
non-zero exit; the project's Python 3.11 passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

SCRIPT = str(REPO / "infra/prerequisites.sh")
INSTALL = ("install Python 3.11 (Ubuntu: deadsnakes ppa python3.11 python3.11-venv) or run make "
           "PYTHON=/path/to/python3.11")


def fake_python(tmp_path: Path, version: str, venv: bool) -> Path:
    """A stand-in interpreter: answers the version query, fails `-m venv` / `import ensurepip`
    unless `venv`."""
    path = tmp_path / "python3.11"
    path.write_text(f"""#!/bin/sh
case "$*" in
  *version_info*) echo {version} ;;
  *venv*|*ensurepip*) {'exit 0' if venv else 'echo "No module named venv" >&2; exit 1'} ;;
  *) exit 1 ;;
esac
""")
    path.chmod(0o755)
    return path


def check(python: str | Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, str(python)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_python_3_12_is_refused_saying_what_to_install(tmp_path):
    python = fake_python(tmp_path, "3.12", venv=True)
    line = one_error_line(check(python))
    assert line == f"error: {python} is Python 3.12, the project needs 3.11: {INSTALL}"


def test_a_python_without_its_venv_module_is_refused(tmp_path):
    python = fake_python(tmp_path, "3.11", venv=False)
    line = one_error_line(check(python))
    assert line == (f"error: {python} has no venv module or no ensurepip: install python3.11-venv "
                    "(apt-get install python3.11-venv) or run make PYTHON=/path/to/python3.11")


def test_a_missing_python_is_refused(tmp_path):
    line = one_error_line(check(tmp_path / "no-such-python"))
    assert line == f"error: {tmp_path / 'no-such-python'} not found: {INSTALL}"


@pytest.mark.parametrize("variable,needle", [
    ("PREREQ_MIN_MEMORY_GB", "GB of memory available, the project needs 100000 GB (two 4 GB "
                             "Spark drivers in make test and a Kafka broker): free memory, or "
                             "set PREREQ_MIN_MEMORY_GB=0"),
    ("PREREQ_MIN_DISK_GB", "GB of disk free under"),
])
def test_too_little_memory_or_disk_is_refused_with_its_override(variable, needle):
    line = one_error_line(check(sys.executable, **{variable: "100000"}))
    assert needle in line and f"set {variable}=0 to go on anyway" in line


def test_the_projects_python_3_11_passes():
    # The venv's interpreter is the project's Python 3.11; the memory and disk floors are low
    # so that a busy machine (make test's own drivers) does not decide the outcome.
    done = check(sys.executable, PREREQ_MIN_MEMORY_GB="1", PREREQ_MIN_DISK_GB="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"prerequisites: {sys.executable} is Python 3.11 with venv")


def test_make_setup_checks_them_first_and_only_before_the_venv_exists(tmp_path):
    python = fake_python(tmp_path, "3.12", venv=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    fresh = subprocess.run(["make", "--no-print-directory", "prerequisites", f"PYTHON={python}",
                            f"VENV={tmp_path / 'venv'}"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert fresh.returncode != 0
    assert f"error: {python} is Python 3.12, the project needs 3.11" in fresh.stderr
    plan = subprocess.run(["make", "-n", "setup", f"PYTHON={python}",
                           f"VENV={tmp_path / 'venv'}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert plan.stdout.splitlines()[0] == (
        f"test -x {tmp_path / 'venv'}/bin/python || infra/prerequisites.sh {python}")
    # Where the venv exists (this checkout's), nothing is checked again.
    done = subprocess.run(["make", "--no-print-directory", "prerequisites", f"PYTHON={python}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
