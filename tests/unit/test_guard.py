"""The engine-price guard (`bench.guard`, run by `make test`): its verdict is the median of the
rounds' service-to-peer ratios against the recorded one plus the tolerance, and the recorded
ratio names the run it came from."""

import json
from pathlib import Path

from testkit.step_prices import PEER_STEP, RECORDED, SERVICE_STEPS, verdict

REPO = Path(__file__).resolve().parents[2]


def round_of(service_s: float, peer_s: float) -> dict:
    share = service_s / len(SERVICE_STEPS)
    cpu = {**dict.fromkeys(SERVICE_STEPS, share), PEER_STEP: peer_s}
    return {"cpu": cpu, "wall": {k: 2 * v for k, v in cpu.items()}}


def test_the_median_ratio_passes_up_to_the_tolerance_and_fails_past_it():
    rounds = [round_of(3.0, 1.0), round_of(3.3, 1.0), round_of(9.0, 1.0)]  # one noisy round
    assert verdict(rounds, recorded=3.0, tolerance=0.15) == {
        "service_to_peer": 3.3, "recorded": 3.0, "limit": 3.45, "passed": True}
    slid = [round_of(3.5, 1.0), round_of(3.6, 1.0), round_of(3.0, 1.0)]
    assert not verdict(slid, recorded=3.0, tolerance=0.15)["passed"]
    # A ratio: a machine twice as slow for both sides changes nothing.
    assert verdict([round_of(6.6, 2.0)], 3.0, 0.15)["service_to_peer"] == 3.3


def test_the_recorded_ratio_names_its_run():
    recorded = json.loads(RECORDED.read_text())
    assert recorded["service_to_peer"] > 0
    result = json.loads((REPO / recorded["result"]).read_text())
    assert result["service_to_peer"] == recorded["service_to_peer"]
    assert result["commit"] == recorded["commit"] and result["events"] == recorded["events"]
