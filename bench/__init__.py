"""Benchmarks and drills: each writes its figures to bench/results/<kind>-<date>.json."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(kind: str, result: dict) -> Path:
    """`result` (with an ISO `date`) to bench/results/<kind>-<day>.json, said on stdout."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{kind}-{result['date'][:10]}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written to {out}")
    return out
