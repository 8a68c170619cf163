"""The guard on the engine's price, run by `make test`: the service's steps of one batch (parse
and classify, bronze's write, the dedup against the earlier batches' ids and the windows, the
ids chunk: `testkit.step_prices.SERVICE_STEPS`) against the hand-written live query's `from_json` +
windows, on the same cached frame in one process, in interleaved rounds (after two that are
not priced, while the JVM compiles). Priced in the driver JVM's CPU seconds less its JIT
compilers' (`bench.step_costs.jvm_cpu_s`; local mode: the executors' threads are in it), which a
loaded machine distorts much less than wall time (the wall seconds are recorded too).

It fails when the ratio of the two (the service's steps' medians summed, over the peer's median)
rises more than GUARD_TOLERANCE (0.15) above the ratio recorded in `bench/guard.json`: a ratio,
so the machine's hour divides out. A ratio over the limit is measured again (as many rounds
more) before the guard fails, and the verdict is on every round.

The recorded ratio moves only with a commit that says why: `python -m bench.guard --record`
writes the run's ratio into `bench/guard.json` with its date, commit and result file.

    make bench-guard    (GUARD_EVENTS=60000, GUARD_ROUNDS=6; bench/results/guard-<time>.json)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime

from bench import write_result
from bench.step_costs import Bench
from testkit.results import commit_of
from testkit.step_prices import PEER_STEP, RECORDED, SERVICE_STEPS, ratios, verdict


def main(argv: list[str]) -> int:
    record = "--record" in argv
    n = int(os.environ.get("GUARD_EVENTS", "60000"))
    rounds = int(os.environ.get("GUARD_ROUNDS", "6"))
    tolerance = float(os.environ.get("GUARD_TOLERANCE", "0.15"))
    base = json.loads(RECORDED.read_text()) if RECORDED.exists() else None
    if base is None and not record:
        print(f"no recorded ratio in {RECORDED}: run `python -m bench.guard --record` first",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    bench = Bench.start(n, 3 * n)
    try:
        bench.rounds(2)  # the JVM's first rounds run code not compiled yet: not priced
        measured = bench.rounds(rounds)
        result = verdict(measured, base["service_to_peer"] if base else 0.0, tolerance)
        if base and not result["passed"]:  # measured again before failing
            measured += bench.rounds(rounds)
            result = verdict(measured, base["service_to_peer"], tolerance)
    finally:
        bench.close()
    steps = {clock: {name: bench.us(statistics.median(r[clock][name] for r in measured))
                     for name in (*SERVICE_STEPS, PEER_STEP)} for clock in ("cpu", "wall")}
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit_of(),
           "events": n, "earlier_ids": 3 * n, "rounds": len(measured), "tolerance": tolerance,
           "us_per_record": steps,
           "service_cpu_us_per_record": bench.us(statistics.median(
               sum(r["cpu"][s] for s in SERVICE_STEPS) for r in measured)),
           "ratios": [round(r, 3) for r in ratios(measured)], **result,
           "measured": [{clock: {k: round(v, 3) for k, v in r[clock].items()} for clock in r}
                        for r in measured],
           "seconds": round(time.monotonic() - started, 1), "load_avg": os.getloadavg()}
    path = write_result("guard", out)
    if record:
        RECORDED.write_text(json.dumps({
            "service_to_peer": out["service_to_peer"], "events": n, "date": out["date"],
            "commit": out["commit"], "result": f"bench/results/{path.name}"}, indent=2) + "\n")
        print(f"recorded {out['service_to_peer']} in {RECORDED}")
        return 0
    print(f"engine price: the service's steps cost {out['service_to_peer']}x the hand-written "
          f"query's on the same frame ({out['service_cpu_us_per_record']} µs of CPU a record); "
          f"recorded {result['recorded']}, limit {result['limit']} (+{tolerance:.0%})")
    if not result["passed"]:
        print("the service's cost per record rose past the guard's limit: find the step above "
              "(us_per_record) that grew, or record a new ratio with a commit that says why",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
