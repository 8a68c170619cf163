"""The suite's own timing record: with SUITE_TIER set (the make targets set it), the controller
writes `bench/results/suite-<tier>-<UTC time>.json` at the end of the session: the tier's wall
time, its outcome counts, the commit, and every test's setup/call/teardown seconds and worker
(setup includes the fixtures it built first, as `--durations` counts it). Never overwrites a file.

Loaded by tests/conftest.py (`pytest_plugins`)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from testkit.results import REPO, RESULTS, commit_of

_tests: dict[str, dict] = {}
_started = {"wall": 0.0, "at": "", "commit": ""}


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    _started["wall"] = time.monotonic()
    _started["at"] = datetime.now(UTC).isoformat(timespec="seconds")
    if os.environ.get("SUITE_TIER") and _controller(session.config):
        _started["commit"] = commit_of()  # the code the run started on


def pytest_runtest_logreport(report):
    entry = _tests.setdefault(report.nodeid, {"outcome": "passed"})
    entry[report.when] = round(report.duration, 3)
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    entry["worker"] = getattr(gateway, "id", None) or os.environ.get("PYTEST_XDIST_WORKER", "main")
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session, exitstatus):
    tier = os.environ.get("SUITE_TIER")
    if not tier or not _controller(session.config) or not _tests:
        return
    wall = time.monotonic() - _started["wall"]
    counts: dict[str, int] = {}
    for entry in _tests.values():
        entry["total"] = round(sum(entry.get(k, 0.0) for k in ("setup", "call", "teardown")), 3)
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"suite-{tier}-{stamp}.json"
    n = 1
    while path.exists():
        path, n = RESULTS / f"suite-{tier}-{stamp}-{n}.json", n + 1
    record = {
        "kind": "suite", "tier": tier, "commit": _started["commit"], "started": _started["at"],
        "wall_s": round(wall, 1), "exitstatus": int(exitstatus), "counts": counts,
        "workers": getattr(session.config.option, "numprocesses", None) or 0,
        "args": session.config.invocation_params.args and
        list(session.config.invocation_params.args),
        "tests": dict(sorted(_tests.items(), key=lambda kv: -kv[1]["total"])),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"suite timings: {path.relative_to(REPO)} ({wall:.0f} s wall)")


def newest() -> dict[str, Path]:
    """The newest timing file of each tier (names sort by time)."""
    out: dict[str, Path] = {}
    for path in sorted(RESULTS.glob("suite-*.json")):
        out[json.loads(path.read_text())["tier"]] = path
    return out


def main(top: int = 8) -> None:
    """`python -m testkit.suite_timings`: each tier's newest file, its wall time, counts and
    slowest tests (setup + call + teardown)."""
    for tier, path in sorted(newest().items()):
        record = json.loads(path.read_text())
        print(f"{tier}: {record['wall_s']:.0f} s wall, {record['counts']}, commit "
              f"{record['commit']} ({path.relative_to(REPO)})")
        for nodeid, entry in list(record["tests"].items())[:top]:
            print(f"  {entry['total']:7.1f} s  {nodeid.split('@')[0]}")


if __name__ == "__main__":
    main()
