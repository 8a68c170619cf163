"""Where benchmarks, drills and the cluster scenario write their figures: bench/results/, one
file per run, never overwritten (the docs cite them by name)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def commit_of() -> str:
    """The checkout's short commit, `-dirty` when tracked files differ from it."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") or "unknown"


def write_result(kind: str, result: dict) -> Path:
    """`result` (with an ISO `date`) to bench/results/<kind>-<date>T<time>.json, said on stdout.
    Never overwrites: the docs cite these files by name, so a later run of the same kind gets a
    name of its own (a numeric suffix should two runs end in the same second). The checkout's
    commit is recorded unless `result` names one (`make report` shows it beside the figures)."""
    result = {"commit": commit_of(), **result}
    RESULTS.mkdir(exist_ok=True)
    stamp = result["date"][:19].replace(":", "")
    out, n = RESULTS / f"{kind}-{stamp}.json", 1
    while out.exists():
        n += 1
        out = RESULTS / f"{kind}-{stamp}-{n}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written to {out}")
    return out
