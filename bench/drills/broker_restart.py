"""Drill 2, broker restart under a steady producer: a broker of the drill's own
(`infra/kafka/broker.py`'s `Broker`), the service consuming from it, a producer sending at a
steady rate throughout; the broker is stopped for a seeded 10-20 s while the producer keeps
trying (librdkafka buffers and retries; a record counts as sent only once its delivery report
says so), then started again on the same data.

The service either rides through the outage or exits with a clear error; then it is restarted
and resumes from its checkpoint. Verified: every acknowledged record is in bronze or quarantine
exactly once (by the (partition, offset) the broker acknowledged), bronze holds exactly the
acknowledged valid events (event ids, each once), and nothing else landed.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    Feeder,
    broker_module,
    check_landing,
    instance,
    landed_rows,
    produce_acked,
    restartable_port,
    say,
    service_env,
    table_or_empty,
)
from testkit import faults

STALL_S = 300  # seconds without a new landed row that fail the wait for the acknowledged ones
NAME = "broker_restart"


def run(ctx: Context, result: DrillResult) -> DrillResult:
    import json

    from lakehouse.kafka.admin import ensure_topic, forget_admins
    from testkit.generator import GeneratorConfig, generate

    rnd = random.Random(ctx.seed + 2)
    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    broker = broker_module().Broker(folder / "broker", restartable_port(), restartable_port())
    say(NAME, f"own broker: {broker.up()}")
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    records = generate(GeneratorConfig(count=ctx.n(60_000, 3_000), seed=ctx.seed + 2, end=end,
                                       span=timedelta(hours=2), keys=8, late_fraction=0.02,
                                       duplicate_fraction=0.0, malformed_fraction=0.01)).records
    outage = rnd.uniform(10, 20)
    head = max(1, len(records) // 20)  # ingested before the steady producer starts
    rate = max(20.0, (len(records) - head) / 75)  # the rest over ~75 s, the outage inside
    services: list[dict] = []
    try:
        with instance(ctx, "broker", KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap) as settings:
            ensure_topic(settings)
            first = produce_acked(settings, records[:head])
            env = service_env()
            svc = faults.start_service(env, folder / "service-0.log")
            result.runs += 1
            faults.wait_for(lambda: landed_rows(settings) > 0, svc, timeout=900,
                            what="the service's first batch")
            feeder = Feeder(settings, records[head:], rate, start=head).begin()
            say(NAME, f"service consuming ({head} records in); producing the other "
                      f"{len(records) - head} at {rate:.0f}/s (idempotent, acks=all, "
                      "message.timeout.ms 300000)")
            time.sleep(rnd.uniform(5, 15))
            acked_before, sent_before = len(feeder.producer.acked), feeder.sent
            t_down = time.monotonic()
            broker.down()
            result.faults_injected += 1
            say(NAME, f"broker stopped (SIGTERM) after {sent_before} records sent, "
                      f"{acked_before} acknowledged; keeping it down {outage:.1f}s")
            time.sleep(max(0.0, outage - (time.monotonic() - t_down)))
            sent_while_down = feeder.sent - sent_before
            broker.up()
            down_s = time.monotonic() - t_down
            say(NAME, f"broker up again after {down_s:.1f}s; {sent_while_down} records handed to "
                      "the producer while it was down (buffered, retried)")
            producer = feeder.join()
            acked = {**first.acked, **producer.acked}
            say(NAME, f"producer done: {len(acked)} acknowledged, {len(producer.failed)} failed "
                      "deliveries (not sent)")

            # Waits while rows keep landing (the drill's 500-record batches take 60,000 records
            # about 20 minutes at scale 1 on 2 cores): a failure is STALL_S without a new row.
            landed, progress_at = landed_rows(settings), time.monotonic()
            while landed < len(acked) and time.monotonic() - progress_at < STALL_S:
                if svc.poll() is not None:
                    tail = [line for line in faults.output(svc, 20_000).splitlines()
                            if line.startswith(("error", "Traceback")) or "Exception" in line]
                    services.append({"exit": svc.returncode, "error": (tail or ["?"])[-1][:300]})
                    say(NAME, f"service exited {svc.returncode} during/after the outage: "
                              f"{services[-1]['error']!r}; restarting it on its checkpoint")
                    svc = faults.start_service(env, folder / f"service-{len(services)}.log")
                    result.runs += 1
                time.sleep(2)
                if (now := landed_rows(settings)) > landed:
                    landed, progress_at = now, time.monotonic()
            if landed < len(acked):
                raise DrillFailed(f"only {landed} of {len(acked)} acknowledged records landed, "
                                  f"none in the last {STALL_S} s: {faults.output(svc)}")
            if not services:
                say(NAME, "the service rode through the outage (no exit)")
            time.sleep(3)
            svc.send_signal(signal.SIGTERM)
            svc.wait(180)
            stopped = svc.returncode == 0
            say(NAME, f"service stopped {'cleanly' if stopped else f'with {svc.returncode}'}")

            expected = set(acked.values())
            landing = check_landing(settings, expected)
            extra = set(landing.positions) - expected
            bronze = table_or_empty(settings, "bronze_events")
            ids = Counter(bronze["event_id"].to_pylist()) if bronze is not None else Counter()
            want = Counter(json.loads(records[i].value)["event_id"] for i in acked
                           if records[i].kind in ("event", "late"))
            id_dups = sum(n - 1 for n in ids.values() if n > 1)
            id_missing = sum((want - ids).values())
            id_extra = sum((ids - want).values())
            say(NAME, f"acknowledged positions: {landing.describe()}; landed without an "
                      f"acknowledgement: {len(extra)}; bronze event ids vs acknowledged valid "
                      f"events: {id_missing} missing, {id_dups} duplicated, {id_extra} extra")
    finally:
        broker.down()
        forget_admins(broker.bootstrap)
    result.records_checked = landing.checked
    result.lost = landing.lost + id_missing
    result.duplicated = landing.duplicated + id_dups
    result.wrong = len(extra) + id_extra
    result.details = {"outage_s": round(down_s, 1), "acknowledged": len(acked),
                      "failed_deliveries": len(producer.failed), "service_exits": services,
                      "rode_through": not services, "stopped_cleanly": stopped,
                      "sent_while_down": sent_while_down}
    result.passed = (result.lost == 0 and result.duplicated == 0 and result.wrong == 0
                     and stopped and len(acked) + len(producer.failed) == len(records)
                     and sent_while_down > 0)
    return result

