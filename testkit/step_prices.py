"""The steps of one ingest batch as the step benches price them (`bench.step_costs`), and the
verdict of the guard on the engine's price (`bench.guard`, run by `make test`): the service's
steps against the hand-written live query's, in the driver JVM's CPU seconds of interleaved
rounds, judged against the ratio recorded in `bench/guard.json`."""

from __future__ import annotations

import statistics

from testkit.results import REPO

# The service's steps of one batch, in its order, on one cache of the classified frame.
SERVICE_STEPS = ("classify + cache + counts", "bronze write (from the cache)",
                 "dedup against earlier ids + windows (from the cache)", "ids chunk (from the cache)")
PEER_STEP = "hand-written peer: from_json + windows"
RECORDED = REPO / "bench" / "guard.json"


def ratios(measured: list[dict]) -> list[float]:
    """Each round's service JVM CPU seconds over the peer's (for the record)."""
    return [sum(r["cpu"][s] for s in SERVICE_STEPS) / r["cpu"][PEER_STEP] for r in measured]


def ratio(measured: list[dict]) -> float:
    """The sum of the service's steps' median JVM CPU seconds over the peer's median: a spike in
    one step of one round (a GC, a compile) moves one median by one rank, not a round's ratio."""
    def median(step: str) -> float:
        return statistics.median(r["cpu"][step] for r in measured)

    return sum(median(s) for s in SERVICE_STEPS) / median(PEER_STEP)


def verdict(measured: list[dict], recorded: float, tolerance: float) -> dict:
    """The rounds' ratio against `recorded` raised by `tolerance` (a fraction)."""
    value, limit = ratio(measured), recorded * (1 + tolerance)
    return {"service_to_peer": round(value, 3), "recorded": recorded,
            "limit": round(limit, 3), "passed": value <= limit}
