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

import signal
import threading
import time
from collections import Counter, namedtuple
from datetime import UTC, datetime

from bench.drills.common import (
    AckedProducer,
    Context,
    DrillFailed,
    DrillResult,
    Feeder,
    broker_module,
    check_landing,
    free_port,
    instance,
    landed_rows,
    prove,
    say,
    service_env,
    table_or_empty,
)
from testkit import faults

NAME = "broker_restart"
RATE = 10_000  # events/s at DRILLS_SCALE 1
BEFORE_S = 60  # steady state before the outage (its lag is the level to come back to)
OUTAGE_S = 180
RECOVERY_S = 120  # the lag must be flat again within this long of the broker's return
AFTER_S = 180  # the producer goes on this long after the broker's return
PROBE_S = 2.0
STALL_S = 300  # seconds without a new landed row that fail the wait for the acknowledged ones
TRIGGER = "10 seconds"  # the service's default STREAM_TRIGGER_INTERVAL

Record = namedtuple("Record", "key value")


class LiveProducer(Feeder):
    """`rate` events/s in ten slices a second, made as they are sent (event time = now); one
    in a hundred malformed. After a stall (the broker away, the queue full) it goes on at its
    rate from then: no burst. Runs until `join`."""

    def __init__(self, settings, rate: int):
        super().__init__(settings, [], rate)
        self.valid_ids: dict[int, str] = {}

    def _record(self, i: int, stamp: str) -> Record:
        key = f"k{i % 50}"
        if i % 100 == 99:
            return Record(key.encode(), b'{"event_id": broken')
        event_id = self.valid_ids[i] = f"live-{i}"
        return Record(key.encode(), (f'{{"event_id":"{event_id}","key":"{key}","event_time":'
                                     f'"{stamp}","value":{i % 997}.25}}').encode())

    def _run(self) -> None:
        try:
            per_slice, start, tick = max(1, int(self.rate) // 10), time.monotonic(), 0
            while not self.stopping.is_set():
                stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
                for i in range(self.sent, self.sent + per_slice):
                    self.producer.send(i, self._record(i, stamp))
                self.sent += per_slice
                tick += 1
                ahead = start + tick / 10 - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -1:  # stalled: go on at the rate from now
                    start, tick = time.monotonic(), 0
            self.producer.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 900) -> AckedProducer:
        self.stop()
        return super().join(timeout)


def lag(settings) -> int | None:
    """The topic's end offsets minus the end offsets of bronze's newest stream commit (None
    while the broker does not answer)."""
    from lakehouse.kafka.admin import topic_offsets
    from lakehouse.tables.commit_tags import stream_commits

    try:
        ends = {p.partition: p.latest for p in topic_offsets(settings, timeout=2)}
    except Exception:  # noqa: BLE001 - the broker is away
        return None
    try:
        commits = stream_commits(settings, 8)
    except Exception:  # noqa: BLE001 - no bronze yet
        commits = []
    done = commits[0].end_offsets if commits else {}
    return sum(max(0, end - done.get(p, 0)) for p, end in ends.items())


class Probe:
    """The lag every PROBE_S from a thread: (seconds since the probe started, lag)."""

    def __init__(self, settings):
        self.settings, self.samples, self.t0 = settings, [], time.monotonic()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lag-probe", daemon=True)

    def _run(self) -> None:
        while not self.stopping.wait(PROBE_S):
            self.samples.append((round(time.monotonic() - self.t0, 1), lag(self.settings)))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def between(self, a: float, b: float) -> list[int]:
        return [n for t, n in self.samples if a <= t < b and n is not None]


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
            if svc.poll() is not None:
                exits.append({"exit": svc.returncode, "tail": faults.output(svc, 3000)[-600:]})
            acked = producer.join().acked
            after = [(t - up_at, n) for t, n in probe.samples if t >= up_at and n is not None]
            # Flat again: from this sample on the lag stays at or under the steady level.
            flat = next((t for i, (t, _) in enumerate(after)
                         if all(n <= level for _, n in after[i:])), None)
            say(NAME, f"producer done: {len(acked)} acknowledged; lag back under {level} "
                      f"{f'{flat:.0f} s' if flat is not None else 'never'} after the broker's "
                      f"return (max after it {max((n for _, n in after), default=None)})")

            landed, progress_at = landed_rows(settings), time.monotonic()
            while landed < len(acked) and time.monotonic() - progress_at < STALL_S:
                if svc.poll() is not None:
                    if not exits:
                        exits.append({"exit": svc.returncode,
                                      "tail": faults.output(svc, 3000)[-600:]})
                    say(NAME, f"service exited {svc.returncode}: restarting it to finish the "
                              "check (the drill fails)")
                    svc = faults.start_service(env, folder / f"service-{len(exits)}.log")
                    result.runs += 1
                time.sleep(2)
                if (now := landed_rows(settings)) > landed:
                    landed, progress_at = now, time.monotonic()
            probe.stopping.set()
            if landed < len(acked):
                raise DrillFailed(f"only {landed} of {len(acked)} acknowledged records landed, "
                                  f"none in the last {STALL_S} s: {faults.output(svc)}")
            log = faults.output(svc, 2_000_000)
            restarts = [line for line in log.splitlines() if "restarting from the checkpoint" in line]
            svc.send_signal(signal.SIGTERM)
            svc.wait(180)
            stopped = svc.returncode == 0
            say(NAME, f"service {'rode out the outage' if not exits else 'EXITED'}; its query "
                      f"restarted {len(restarts)} time(s); stopped "
                      f"{'cleanly' if stopped else f'with {svc.returncode}'}")
            for line in restarts[:3] + restarts[-1:]:
                say(NAME, f"  {line.strip()[:240]}")

            expected = set(acked.values())
            landing = check_landing(settings, expected)
            extra = set(landing.positions) - expected
            bronze = table_or_empty(settings, "bronze_events")
            ids = Counter(bronze["event_id"].to_pylist()) if bronze is not None else Counter()
            want = Counter(producer.valid_ids[i] for i in acked if i in producer.valid_ids)
            id_dups = sum(n - 1 for n in ids.values() if n > 1)
            id_missing, id_extra = sum((want - ids).values()), sum((ids - want).values())
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
