"""Where benchmarks, drills and the cluster scenario write their figures: bench/results/, one
file per run, never overwritten (the docs cite them by name)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def write_result(kind: str, result: dict) -> Path:
    """`result` (with an ISO `date`) to bench/results/<kind>-<date>T<time>.json, said on stdout.
    Never overwrites: the docs cite these files by name, so a later run of the same kind gets a
    name of its own (a numeric suffix should two runs end in the same second)."""
    RESULTS.mkdir(exist_ok=True)
    stamp = result["date"][:19].replace(":", "")
    out, n = RESULTS / f"{kind}-{stamp}.json", 1
    while out.exists():
        n += 1
        out = RESULTS / f"{kind}-{stamp}-{n}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written to {out}")
    return out
