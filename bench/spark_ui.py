"""Spark jobs from Spark's own REST API (the UI's data), grouped by the step that started them:
the `ingest:<step>` job descriptions, Delta's own names, else the Python call site."""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from datetime import datetime


def _time(s: str) -> float:
    return datetime.strptime(s.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def jobs(ui_url: str, app_id: str | None = None) -> list[dict]:
    """Every job of the application at `ui_url` (the only one when `app_id` is None)."""
    if app_id is None:
        with urllib.request.urlopen(f"{ui_url}/api/v1/applications", timeout=30) as response:
            app_id = json.load(response)[0]["id"]
    with urllib.request.urlopen(f"{ui_url}/api/v1/applications/{app_id}/jobs",
                                timeout=30) as response:
        return json.load(response)


def step_of(job: dict) -> str:
    description = (job.get("description") or "").split("\n")[0]
    if description.lower().startswith(("delta", "ingest:")):
        return description.split(" - ")[0][:100]
    return job.get("name", "?")[:100]


def submitted_at(job: dict) -> float:
    return _time(job["submissionTime"])


def by_step(done: list[dict], per: int = 1) -> list[dict]:
    """Completed jobs grouped by step, seconds summed (divided by `per`: per batch), largest
    first."""
    groups: dict[str, list[float]] = defaultdict(list)
    for j in done:
        if j.get("completionTime"):
            groups[step_of(j)].append(_time(j["completionTime"]) - _time(j["submissionTime"]))
    return [{"origin": k, "jobs": round(len(v) / per, 1), "seconds": round(sum(v) / per, 2)}
            for k, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))]
