"""`make system-deps` (infra/system_packages.sh): installs missing Debian packages as root, else
refuses with the exact command. `id` and `apt-get` are stand-ins on PATH: nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra/system_packages.sh"


def fake_bin(tmp_path: Path, uid: int, apt_creates: Path | None = None) -> Path:
    """A PATH folder whose `id -u` prints `uid` and whose `apt-get` logs its arguments (and, for
    an install, creates `apt_creates`, the program the package brings)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    create = f'[ "$1" = install ] && touch {apt_creates}\n' if apt_creates else ""
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path / "apt.log"}\n{create}exit 0\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def run(bin_dir: Path, *specs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run([str(SCRIPT), *specs], env=env, capture_output=True, text=True,
                          timeout=60)


def test_present_packages_need_nothing(tmp_path):
    bin_dir = fake_bin(tmp_path, uid=1000)
    done = run(bin_dir, "coreutils=ls", f"fake={bin_dir}/i*")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (tmp_path / "apt.log").exists()


def test_a_user_gets_the_command_to_run(tmp_path):
    bin_dir = fake_bin(tmp_path, uid=1000)
    done = run(bin_dir, "coreutils=ls", "lakehouse-none=lakehouse-no-such-tool",
               f"other-none={tmp_path}/nothing/*/bin/tool")
    assert done.returncode == 1
    assert ("sudo apt-get install -y -q --no-install-recommends lakehouse-none other-none"
            in done.stderr)
    assert not (tmp_path / "apt.log").exists()


def test_root_installs_what_is_missing(tmp_path):
    tool = tmp_path / "opt/9/bin/tool"
    tool.parent.mkdir(parents=True)
    bin_dir = fake_bin(tmp_path, uid=0, apt_creates=tool)
    spec = f"lakehouse-tool={tmp_path}/opt/*/bin/tool"
    done = run(bin_dir, "coreutils=ls", spec)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "apt.log").read_text() == (
        "install -y -q --no-install-recommends lakehouse-tool\n")
    again = run(bin_dir, "coreutils=ls", spec)  # now present: no second install
    assert again.returncode == 0 and (tmp_path / "apt.log").read_text().count("\n") == 1


def test_root_reports_a_package_that_brings_no_program(tmp_path):
    bin_dir = fake_bin(tmp_path, uid=0)
    done = run(bin_dir, "lakehouse-none=lakehouse-no-such-tool")
    assert done.returncode == 1
    assert "still not found: lakehouse-none" in done.stderr


def test_setup_installs_what_the_tests_start():
    """`make setup` runs the step for the JDK, Maven and PostgreSQL's server (the tests start
    a broker, Spark and PostgreSQL); nothing installs at test time."""
    done = subprocess.run(["make", "-n", "--no-print-directory", "setup"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    step = next(line for line in done.stdout.splitlines()
                if line.startswith("infra/system_packages.sh"))
    packages = {spec.split("=", 1)[0] for spec in step.split()[1:]}
    assert {"openjdk-17-jdk-headless", "maven", "postgresql"} <= packages
    assert '"apt-get"' not in (REPO / "infra/postgres/pg.py").read_text()  # runs no apt-get
