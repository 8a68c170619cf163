"""Drill 2, a broker outage under load: a broker of the drill's own (`infra/kafka/broker.py`'s
`Broker`), the service consuming from it with its production settings, a producer sending
RATE events/s (event time = now, 1% malformed) throughout; after BEFORE_S of steady state the
broker is stopped (SIGTERM) for OUTAGE_S while the producer keeps trying (librdkafka buffers
and retries until its queue is full, then the producing thread waits, as an application's
would; a record counts as sent only once its delivery report says so), then started again on
the same data, and the producer goes on at its rate (no burst to make up for the outage).

The service must ride out the outage by itself: still running afterwards, never restarted by
hand. Measured by a probe from outside the service: the lag (the topic's end offsets minus
the end offsets stamped on bronze's newest stream commit) every PROBE_S, its steady level
before the outage, and how long after the broker's return it is back to that level (`flat`:
at most 1.5 times the steady maximum plus one trigger's records). Verified: every
acknowledged offset in bronze or the quarantine exactly once, nothing else landed, bronze's
event ids each once and exactly the acknowledged valid events, every date proven (the
blocking check, gold == replay).
"""

from __future__ import annotations

import time
from collections import Counter

from bench.drills.common import (
    Context,
    DrillResult,
    LiveProducer,
    Probe,
    Record,
    broker_module,
    check_landing,
    event_ids_check,
    free_port,
    instance,
    land_and_stop,
    landed_rows,
    prove,
    say,
    service_env,
)
from testkit import faults

NAME = "broker_restart"
RATE = 10_000  # events/s at DRILLS_SCALE 1
BEFORE_S = 60  # steady state before the outage (its lag is the level to come back to)
OUTAGE_S = 180
RECOVERY_S = 120  # the lag must be flat again within this long of the broker's return
AFTER_S = 180  # the producer goes on this long after the broker's return
STALL_S = 300  # seconds without a new landed row that fail the wait for the acknowledged ones
TRIGGER = "10 seconds"  # the service's default STREAM_TRIGGER_INTERVAL


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from lakehouse.kafka.admin import ensure_topic, forget_admins

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    broker = broker_module().Broker(folder / "broker", free_port(), free_port())
    say(NAME, f"own broker: {broker.up()}")
    rate = ctx.n(RATE, 500)
    exits: list[dict] = []
    try:
        with instance(ctx, "broker", KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap) as settings:
            from dagster import DagsterInstance

            ensure_topic(settings)
            env = service_env(STREAM_TRIGGER_INTERVAL=TRIGGER, MAX_OFFSETS_PER_TRIGGER="2000000",
                              SPARK_CONF_SPARK_DRIVER_MEMORY="4g")
            svc = faults.start_service(env, folder / "service-0.log")
            result.runs += 1
            producer = LiveProducer(settings, rate)
            producer.producer.send(-1, Record(b"k0", b'{"event_id": broken'))  # a first batch
            producer.producer.flush()
            faults.wait_for(lambda: landed_rows(settings) > 0, svc, timeout=600,
                            what="the service's first batch")
            producer.begin()
            probe = Probe(settings)
            probe.thread.start()
            say(NAME, f"service consuming; producing {rate}/s; {BEFORE_S} s to a steady state")
            time.sleep(BEFORE_S)
            steady = probe.between(probe.now() - 30, probe.now())
            sent_before = producer.sent
            broker.down()
            down_at = probe.now()
            result.faults_injected += 1
            say(NAME, f"broker stopped (SIGTERM) after {sent_before} records sent; steady lag "
                      f"max {max(steady, default=0)}; keeping it down {OUTAGE_S} s")
            time.sleep(OUTAGE_S)
            sent_while_down = producer.sent - sent_before
            say(NAME, f"broker up again: {broker.up()}; {sent_while_down} records handed to the "
                      "producer while it was down (buffered, retried)")
            up_at = probe.now()
            level = int(1.5 * max(steady, default=0) + rate * 10)
            time.sleep(AFTER_S)
            acked, log, stopped = land_and_stop(settings, env, folder, svc, producer, probe,
                                                result, exits, NAME, STALL_S)
            # Flat again: from this sample on the lag stays at or under the steady level.
            flat, after = probe.flat_after(up_at, level)
            say(NAME, f"producer done: {len(acked)} acknowledged; lag back under {level} "
                      f"{f'{flat:.0f} s' if flat is not None else 'never'} after the broker's "
                      f"return (max after it {max((n for _, n in after), default=None)})")
            restarts = [line for line in log.splitlines() if "restarting from the checkpoint" in line]
            say(NAME, f"service {'rode out the outage' if not exits else 'EXITED'}; its query "
                      f"restarted {len(restarts)} time(s); stopped "
                      f"{'cleanly' if stopped else f'with {svc.returncode}'}")
            for line in restarts[:3] + restarts[-1:]:
                say(NAME, f"  {line.strip()[:240]}")

            expected = set(acked.values())
            landing = check_landing(settings, expected)
            extra = set(landing.positions) - expected
            want = Counter(producer.valid_ids[i] for i in acked if i in producer.valid_ids)
            id_missing, id_dups, id_extra = event_ids_check(settings, want)
            say(NAME, f"acknowledged positions: {landing.describe()}; landed without an "
                      f"acknowledgement: {len(extra)}; bronze event ids vs acknowledged valid "
                      f"events: {id_missing} missing, {id_dups} duplicated, {id_extra} extra")
            proof = prove(settings, DagsterInstance.ephemeral(), None, NAME)
            result.runs += len(proof.dates)
    finally:
        broker.down()
        forget_admins(broker.bootstrap)
    result.records_checked = landing.checked
    result.lost = landing.lost + id_missing
    result.duplicated = landing.duplicated + id_dups
    result.wrong = len(extra) + id_extra + proof.wrong + len(proof.failed_checks)
    result.details = {
        "rate": rate, "outage_s": OUTAGE_S, "acknowledged": len(acked),
        "sent_while_down": sent_while_down, "service_exits": exits, "rode_through": not exits,
        "query_restarts": len(restarts), "stopped_cleanly": stopped,
        "steady_lag_max": max(steady, default=0), "flat_level": level,
        "lag_flat_after_return_s": flat, "recovery_budget_s": RECOVERY_S,
        "down_at_s": round(down_at, 1), "up_at_s": round(up_at, 1),
        "lag_samples": probe.samples, "dates": [str(d) for d in proof.dates],
        "proof_failures": proof.failed_checks + proof.notes}
    result.passed = (result.lost == 0 and result.duplicated == 0 and result.wrong == 0
                     and not exits and stopped and flat is not None and flat <= RECOVERY_S
                     and proof.ok)
    return result
