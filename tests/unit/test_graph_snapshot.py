"""A snapshot of the asset graph (keys, deps, partitions, pools, checks, jobs, schedules,
sensors, resources) of the default deployment (the default pipeline alone, PIPELINES unset): a
change to the graph shows up as a diff of tests/snapshots/asset_graph.txt. After an intended
change: `UPDATE_SNAPSHOTS=1 pytest tests/unit/test_graph_snapshot.py`."""

import os
from pathlib import Path

from dagster import Definitions

from assets.pipelines import DEFAULT
from orchestration.definitions import definitions_for

SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "asset_graph.txt"


def describe(defs: Definitions) -> str:
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    lines = ["# assets: key <- deps | partitions | group | pool | checks"]
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        deps = ",".join(sorted(k.to_user_string() for k in node.parent_keys)) or "-"
        parts = type(node.partitions_def).__name__ if node.partitions_def else "-"
        checks = ",".join(sorted(c.name for c in node.check_keys)) or "-"
        pool = ",".join(sorted(node.pools or [])) or "-"
        lines.append(f"{key.to_user_string()} <- {deps} | {parts} | {node.group_name} | {pool} "
                     f"| {checks}")
    lines.append("# jobs: name: assets; checks")
    for job in sorted(repo.get_all_jobs(), key=lambda j: j.name):
        if job.name.startswith("__"):
            continue
        layer = job.asset_layer
        assets = ",".join(sorted(k.to_user_string() for k in layer.selected_asset_keys))
        checks = ",".join(sorted(k.name for k in layer.asset_graph.asset_check_keys))
        lines.append(f"{job.name}: {assets}; {checks or '-'}")
    lines.append("# schedules: name: job cron")
    for s in sorted(repo.schedule_defs, key=lambda s: s.name):
        lines.append(f"{s.name}: {s.job_name} {s.cron_schedule} {s.default_status.value}")
    lines.append("# sensors: name: jobs, resources")
    for s in sorted(repo.sensor_defs, key=lambda s: s.name):
        jobs = ",".join(sorted(j.name for j in s.jobs)) if s.has_jobs else "-"
        lines.append(f"{s.name}: {jobs or '-'}, {','.join(sorted(s.required_resource_keys)) or '-'}")
    lines.append("# resources")
    lines += sorted(defs.resources)
    return "\n".join(lines) + "\n"


def test_asset_graph_matches_the_snapshot():
    text = describe(definitions_for([DEFAULT]))  # whatever PIPELINES this process has
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), (
        "the asset graph changed: review the diff, then UPDATE_SNAPSHOTS=1 to accept it")
