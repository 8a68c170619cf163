"""Where the CPU of a batch's steps goes inside the JVM: Java Flight Recorder samples of the driver
JVM (local mode: the executors' task threads are in it) while the guard's frame (`bench.step_costs
.Bench`) runs the service's steps, then while it runs the hand-written query's, each side in
rounds of its own after three warm-up rounds. Per side: the executor samples, the frames most
often on top of the stack (self), those most often anywhere in it (inclusive), and the share of
a few frames named below, with their callers.

    make bench-jfr      (JFR_EVENTS=100000, JFR_ROUNDS=5; bench/results/jfr-steps-<time>.json)

Samples are counts, not seconds: compare shares within one side, and sides by their cost in
the rounds' JVM CPU (`us_per_record`, inflated by the recording)."""

from __future__ import annotations

import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench import write_result
from bench.step_costs import Bench
from testkit.results import commit_of

# Frames whose inclusive share says what a lever would buy, with the callers worth knowing.
NAMED = (
    "VariantBuilder.parseJson",  # the JSON parse into a VARIANT
    "VariantGet$.variantGet",  # each try_variant_get
    "VariantGet$.cast",  # ... its cast of the value found (a Cast built per row)
    "SQLConf$.get",  # a SQLConf built per call on a task thread
    "JacksonParser.parse",  # from_json
    "JsonFactory.createParser",  # a Jackson parser per row
    "RegExpUtils$.",  # rlike
    "MemoryStore.putIteratorAsValues",  # building the cache
    "ParquetWriteSupport.write",  # bronze's Parquet
    "UnsafeExternalRowSorter.sort",  # sorts (the writer's by date, sort-merge joins)
    "ShuffleWriteProcessor.write",  # map-side shuffle writes
    "BroadcastExchangeExec",  # broadcasts (the earlier ids)
)
_FRAME = re.compile(r"^\s+([\w$/.<>]+)\(", re.M)


def _short(frame: str) -> str:
    parts = frame.split(".")
    return ".".join(parts[-2:])


def _samples(path: Path) -> list[list[str]]:
    """The executor task threads' stacks, top frame first, from `jfr print` (a thread is named
    by its last name: "Executor task idle worker", however busy it was when sampled)."""
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth",
                           "40", str(path)], capture_output=True, text=True, check=True).stdout
    stacks = []
    for event in text.split("jdk.ExecutionSample")[1:]:
        if "Executor task" not in event or "stackTrace = [" not in event:
            continue
        frames = [_short(f) for f in _FRAME.findall(event.split("stackTrace = [", 1)[1])]
        if frames:
            stacks.append(frames)
    return stacks


def _summary(stacks: list[list[str]]) -> dict:
    n = len(stacks) or 1
    top, anywhere = collections.Counter(), collections.Counter()
    named = {k: collections.Counter() for k in NAMED}
    for frames in stacks:
        top[frames[0]] += 1
        anywhere.update(set(frames))
        for key in NAMED:
            at = next((i for i, f in enumerate(frames) if f.startswith(key)), None)
            if at is not None:
                named[key][" < ".join(frames[at + 1:at + 4])] += 1

    def share(counter: collections.Counter, k: int) -> list[list]:
        return [[name, count, round(count / n, 3)] for name, count in counter.most_common(k)]

    return {"executor_samples": len(stacks), "self": share(top, 30),
            "inclusive": share(anywhere, 40),
            "named": {k: {"share": round(sum(c.values()) / n, 3), "callers": share(c, 3)}
                      for k, c in named.items()}}


def _record(bench: Bench, side: str, rounds: int, into: Path) -> tuple[list[list[str]], dict]:
    run = bench.service_round if side == "service" else bench.peer_round
    path = into / f"{side}.jfr"
    subprocess.run(["jcmd", str(bench.jvm_pid), "JFR.start", f"name={side}", "settings=profile",
                    f"filename={path}"], check=True, capture_output=True)
    measured = []
    for _ in range(rounds):
        r = {"cpu": {}, "wall": {}}
        run(r)
        measured.append(r)
    subprocess.run(["jcmd", str(bench.jvm_pid), "JFR.stop", f"name={side}"], check=True,
                   capture_output=True)
    us = {step: bench.us(statistics.median(r["cpu"][step] for r in measured))
          for step in measured[0]["cpu"]}
    return _samples(path), us


def main() -> int:
    n = int(os.environ.get("JFR_EVENTS", "100000"))
    rounds = int(os.environ.get("JFR_ROUNDS", "5"))
    bench = Bench.start(n, 3 * n)
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit_of(),
           "events": n, "earlier_ids": 3 * n, "rounds": rounds, "sides": {}}
    try:
        for _ in range(3):  # the JIT's rounds: not recorded
            warm = {"cpu": {}, "wall": {}}
            bench.service_round(warm)
            bench.peer_round(warm)
        tmp = Path(tempfile.mkdtemp(prefix="jfr-"))  # the recordings stay for `jfr` by hand
        for side in ("service", "peer"):
            stacks, us = _record(bench, side, rounds, tmp)
            out["sides"][side] = {"us_per_record_cpu": us, "recording": str(tmp / f"{side}.jfr"),
                                  **_summary(stacks)}
    finally:
        bench.close()
    path = write_result("jfr-steps", out)
    for side, s in out["sides"].items():
        print(f"{side}: {s['executor_samples']} samples, {s['us_per_record_cpu']}")
        for key, v in s["named"].items():
            if v["share"]:
                print(f"  {v['share']:6.1%}  {key}")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
