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


# A fresh machine, as `make setup` finds it: a PATH holding the tools the script needs (bash and
# coreutils) and whichever Pythons that machine has, looked up by name (PYTHON's default,
# python3.11), never this machine's own.
TOOLS = ("bash", "env", "awk", "df", "readlink", "dirname")


def fresh_path(tmp_path: Path, pythons: dict[str, Path]) -> str:
    """A bin folder with the script's tools and `pythons` (name -> fake), and nothing else."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for name, fake in pythons.items():
        (bin_dir / name).symlink_to(fake)
    return str(bin_dir)


def make_prerequisites(tmp_path: Path, path: str) -> subprocess.CompletedProcess:
    """`make setup`'s first step where no venv exists, PYTHON left at its default."""
    import shutil

    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON")}
    return subprocess.run([shutil.which("make"), "--no-print-directory", "prerequisites",
                           f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          env={**env, "PATH": path}, capture_output=True, text=True, timeout=60)


def script_line(done: subprocess.CompletedProcess) -> str:
    """The script's one line: make adds only its own `make: *** ... Error 1` after it."""
    assert done.returncode != 0 and done.stdout == "", done.stdout
    lines = [x for x in done.stderr.splitlines() if not x.startswith("make: *** ")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("how", ["by_name", "make"])
def test_a_machine_with_python_3_12_only_is_told_to_install_3_11(tmp_path, how):
    fake = fake_python(tmp_path, "3.12", venv=True)
    path = fresh_path(tmp_path, {"python3": fake, "python3.12": fake})
    done = (subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": path}) if how == "by_name"
            else make_prerequisites(tmp_path, path))
    line = script_line(done)
    assert line == f"error: python3.11 not found: {INSTALL}"


def test_a_python3_11_on_the_path_that_is_3_12_is_refused(tmp_path):
    path = fresh_path(tmp_path, {"python3.11": fake_python(tmp_path, "3.12", venv=True)})
    line = script_line(make_prerequisites(tmp_path, path))
    assert line == f"error: python3.11 is Python 3.12, the project needs 3.11: {INSTALL}"


def test_a_python3_11_on_the_path_without_venv_is_refused(tmp_path):
    path = fresh_path(tmp_path, {"python3.11": fake_python(tmp_path, "3.11", venv=False)})
    line = script_line(make_prerequisites(tmp_path, path))
    assert line == ("error: python3.11 has no venv module or no ensurepip: install "
                    "python3.11-venv (apt-get install python3.11-venv) or run make "
                    "PYTHON=/path/to/python3.11")


def test_a_python3_11_on_the_path_with_venv_passes(tmp_path):
    """The same PATH with a working 3.11 goes on: the refusals above are the Python's, not the
    bare PATH's."""
    path = fresh_path(tmp_path, {"python3.11": fake_python(tmp_path, "3.11", venv=True)})
    done = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path, "PREREQ_MIN_MEMORY_GB": "0",
                               "PREREQ_MIN_DISK_GB": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("prerequisites: python3.11 is Python 3.11 with venv")
