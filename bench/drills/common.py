"""What every drill shares: its result row, the run context (scale, seed, one SparkSession,
printing), independent pipeline instances, producing with acknowledgements, and the checks
(offsets landed once, gold == replay == the plain-Python reference)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter, namedtuple
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from testkit import runs
from testkit.infra import broker_module, registry_module  # noqa: F401 - the drills import them
from testkit.ports import free_port  # noqa: F401 - the drills import it from here
from testkit.reference import expected_windows, table_windows
from testkit.runs import step_failures


@dataclass
class DrillResult:
    drill: str
    runs: int = 0  # pipeline runs (service lives, jobs, catch-ups) the drill made
    faults_injected: int = 0
    records_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    seconds: float = 0.0
    passed: bool = False
    details: dict = field(default_factory=dict)
    error: str | None = None

    def summary(self) -> dict:
        row = asdict(self)
        if row["error"] is None:
            row.pop("error")
        return row


class DrillFailed(AssertionError):
    pass


@dataclass
class Context:
    """One `python -m bench.drills` run."""

    scale: float
    seed: int
    bootstrap: str
    workdir: Path
    _spark: object = None

    def spark(self):
        """The runner's SparkSession (shared by the Dagster runs, whose resource gets it)."""
        if self._spark is None:
            from lakehouse.config.settings import Settings
            from spark_jobs.session import get_spark

            self._spark = get_spark(Settings.from_env(
                {"LAKEHOUSE_ROOT": str(self.workdir / "spark")}))
        return self._spark

    def n(self, full: int, minimum: int) -> int:
        """A size of the full drill, scaled by DRILLS_SCALE (at least `minimum`)."""
        return max(minimum, int(full * self.scale))

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


def say(drill: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {drill}: {message}", flush=True)


@contextmanager
def instance(ctx: Context, name: str, topic: str | None = None, **extra: str):
    """An independent pipeline instance (own LAKEHOUSE_ROOT, own topic unless given) in this
    process's environment, restored afterwards. Yields its Settings."""
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings

    env = {
        "KAFKA_BOOTSTRAP_SERVERS": ctx.bootstrap,
        "EVENTS_TOPIC": topic or f"drill-{name}-{uuid.uuid4().hex[:8]}",
        "LAKEHOUSE_ROOT": str(ctx.workdir / f"{name}-{uuid.uuid4().hex[:6]}"),
        **extra,
    }
    with overridden(env):
        yield Settings.from_env()


def service_env(**extra: str) -> dict[str, str]:
    """Environment of a service child process: this one's plus a quick trigger, small batches
    (many batches to crash into), a smaller driver heap and a metrics port of its own."""
    return {**os.environ, "STREAM_TRIGGER_INTERVAL": "2 seconds",
            "MAX_OFFSETS_PER_TRIGGER": "500", "SPARK_CONF_SPARK_DRIVER_MEMORY": "2g",
            "METRICS_PORT": str(free_port()), **extra}


# ---------------------------------------------------------------------------------------------
# Producing, with acknowledgements
# ---------------------------------------------------------------------------------------------
class AckedProducer:
    """confluent-kafka producer (idempotent, acks=all, retries until `message.timeout.ms`)
    that records, per record index, the (partition, offset) the broker acknowledged; a record
    whose delivery failed is not "sent"."""

    def __init__(self, settings, timeout_ms: int = 300_000, **conf):
        from confluent_kafka import Producer

        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: dict[int, str] = {}
        self.producer = Producer({
            **settings.client_config, "enable.idempotence": True, "linger.ms": 20,
            "compression.type": "lz4", "message.timeout.ms": timeout_ms, "log_level": 3,
            "batch.num.messages": 10000, **conf})
        self.topic = settings.events_topic

    def _callback(self, i: int):
        def done(err, msg):
            if err is None:
                self.acked[i] = (msg.partition(), msg.offset())
            else:
                self.failed[i] = str(err)
        return done

    def send(self, i: int, record) -> None:
        while True:
            try:
                self.producer.produce(self.topic, key=record.key, value=record.value,
                                      on_delivery=self._callback(i))
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def send_all(self, records, start: int = 0) -> None:
        for i, r in enumerate(records, start):
            self.send(i, r)

    def flush(self, timeout: float = 600) -> int:
        """Wait for every delivery report; returns the records still undecided."""
        return self.producer.flush(timeout)


def produce_acked(settings, records, start: int = 0) -> AckedProducer:
    """Produce `records` (topic created if missing) and wait until all are acknowledged."""
    from lakehouse.kafka.admin import ensure_topic

    ensure_topic(settings)
    p = AckedProducer(settings)
    p.send_all(records, start)
    left = p.flush()
    if left or p.failed:
        raise DrillFailed(f"{left} records undelivered, {len(p.failed)} failed: "
                          f"{next(iter(p.failed.values()), '')}")
    return p


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
def table_or_empty(settings, name: str):
    from lakehouse.tables.reads import read

    try:
        return read(settings, name)
    except Exception:  # noqa: BLE001 - not created yet
        return None


def landed_rows(settings) -> int:
    n = 0
    for name in ("bronze_events", "quarantined_events"):
        t = table_or_empty(settings, name)
        n += t.num_rows if t is not None else 0
    return n


@dataclass
class Landing:
    """Where the topic's records landed: bronze and quarantine positions, checked against the
    topic's offsets (every offset of every partition exactly once, in one of the two)."""

    checked: int
    lost: int
    duplicated: int
    positions: Counter
    missing_examples: list

    def describe(self) -> str:
        return (f"{self.checked} offsets checked: {self.lost} missing, {self.duplicated} "
                "duplicated (bronze and quarantine unique on (partition, offset))")


def check_landing(settings, expected: set[tuple[int, int]] | None = None) -> Landing:
    """Every offset in [earliest, latest) of each partition (or exactly `expected`, e.g. the
    acknowledged positions) is in bronze or quarantine exactly once."""
    from lakehouse.kafka.admin import topic_offsets

    positions: Counter = Counter()
    for name in ("bronze_events", "quarantined_events"):
        t = table_or_empty(settings, name)
        if t is not None:
            positions.update(zip(t["partition"].to_pylist(), t["offset"].to_pylist(),
                                 strict=True))
    if expected is None:
        expected = {(p.partition, o) for p in topic_offsets(settings)
                    for o in range(p.earliest, p.latest)}
    missing = sorted(expected - set(positions))
    duplicated = sum(n - 1 for n in positions.values() if n > 1)
    return Landing(len(expected), len(missing), duplicated, positions, missing[:5])


def run_job(name: str, dagster_instance, defs=None, **kw):
    """A job of `defs` (the code location's, or a drill's own built for its spec pipeline),
    in-process, its console quiet. Returns (result, check evaluations)."""
    if defs is None:
        return runs.run_job(name, dagster_instance, quiet=True, **kw)
    kw.setdefault("run_config", runs.QUIET)
    return runs.run_in(defs, name, dagster_instance, **kw)


def bronze_dates(settings) -> list[date]:
    from lakehouse.tables.reads import bronze_dates as dates

    return sorted(dates(settings))


@dataclass
class Proof:
    dates: list
    windows_checked: int
    wrong: int  # windows where gold, replay and the reference do not all agree
    failed_checks: list
    notes: list

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and not self.failed_checks


def prove(settings, dagster_instance, records, drill: str, job: str = "reconcile_dates",
          defs=None) -> Proof:
    """For every event date in bronze: `reconcile_dates` in-process (corrections, replay and
    the blocking check `reconciled_equals_replay`), then gold == replay (`compare_tables`) and
    gold == the plain-Python count of `records` (every date, every window, exact decimals;
    `records` None: the drill made too many to keep, or they are not the default pipeline's,
    and gold == replay is the proof). A spec pipeline's: its `job` (`<prefix>__reconcile_dates`)
    in `defs`, a code location holding it."""
    from lakehouse.tables.reads import compare_tables, read

    dates = bronze_dates(settings)
    failed, notes = [], []
    wrong = 0
    for d in dates:
        result, checks = run_job(job, dagster_instance, defs, partition_key=d.isoformat())
        bad = [c.check_name for c in checks if not c.passed]
        if not result.success or bad:
            failed.append(f"{d}: run {'ok' if result.success else 'failed'}, failed checks "
                          f"{bad}: {step_failures(result)}")
        diff = compare_tables(settings, d)
        if diff:
            notes.append(f"{d}: {diff} windows differ between gold and replay")
        wrong += diff
    gold = read(settings, "reconciled_aggregates")
    # The reference is the default pipeline's shape (a (window, key) row each): kept records only.
    want = expected_windows(records) if records is not None else {}
    got = table_windows(gold) if records is not None else {}
    differing = [k for k in want.keys() | got.keys() if want.get(k) != got.get(k)]
    if differing:
        k = sorted(differing)[0]
        notes.append(f"{len(differing)} windows differ between gold and the reference, e.g. "
                     f"{k}: gold {got.get(k)} reference {want.get(k)}")
    wrong += len(differing)
    say(drill, f"proof over {len(dates)} date(s) {[d.isoformat() for d in dates]}: "
               f"{len(want)} reference windows, {gold.num_rows} gold windows; {job} "
               f"{'passed' if not failed else 'FAILED'} (blocking check reconciled_equals_replay)"
               f"; gold == replay: {not any('replay' in n for n in notes)}; gold == reference: "
               f"{not differing if records is not None else 'not kept'}")
    return Proof(dates, len(want), wrong, failed, notes)


def unique_changelog(settings) -> int:
    """Revisions logged twice in late_corrections (must be 0)."""
    t = table_or_empty(settings, "late_corrections")
    if t is None:
        return 0
    keys = Counter(zip(t["window_start"].to_pylist(), t["key"].to_pylist(),
                       t["revision"].to_pylist(), strict=True))
    return sum(n - 1 for n in keys.values() if n > 1)


def wait_until(predicate, timeout: float, what: str, poll: float = 1.0, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            from testkit.faults import output

            raise DrillFailed(f"process exited {proc.returncode} while waiting for {what}: "
                              f"{output(proc)}")
        time.sleep(poll)
    raise DrillFailed(f"timed out after {timeout:.0f}s waiting for {what}")



class Feeder:
    """Produces records in a thread at a steady rate (records/s) through an AckedProducer,
    until the records run out or `stop()` (then `sent` says how many of them went out)."""

    def __init__(self, settings, records, rate: float, start: int = 0, **conf):
        import threading

        self.producer = AckedProducer(settings, **conf)
        self.records, self.rate, self.start = records, rate, start
        self.sent = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def _run(self) -> None:
        try:
            t0 = time.monotonic()
            for n, r in enumerate(self.records):
                if self.stopping.is_set():
                    break
                self.producer.send(self.start + n, r)
                self.sent = n + 1
                ahead = (n + 1) / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
            self.producer.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def begin(self) -> Feeder:
        """Start producing (the topic must exist: `ensure_topic`)."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Produce no more records (those sent are still flushed by `join`)."""
        self.stopping.set()

    def join(self, timeout: float = 900) -> AckedProducer:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise DrillFailed("the producer did not finish")
        if self.error is not None:
            raise self.error
        return self.producer


# ---------------------------------------------------------------------------------------------
# A live load and its lag, for the outage drills (broker, registry)
# ---------------------------------------------------------------------------------------------
Record = namedtuple("Record", "key value")
PROBE_S = 2.0  # the lag probe's period


class LiveProducer(Feeder):
    """`rate` events/s in ten slices a second, made as they are sent (event time = now, one
    instant a slice); one in a hundred malformed. After a stall (the broker away, the queue
    full) it goes on at its rate from then: no burst. Runs until `join`. `_record` makes record
    `i` (JSON here; a subclass another encoding) and notes a valid one's event id in
    `valid_ids`."""

    def __init__(self, settings, rate: int):
        super().__init__(settings, [], rate)
        self.valid_ids: dict[int, str] = {}

    def _record(self, i: int, now: datetime) -> Record:
        key = f"k{i % 50}"
        if i % 100 == 99:
            return Record(key.encode(), b'{"event_id": broken')
        stamp = now.isoformat(timespec="milliseconds")
        event_id = self.valid_ids[i] = f"live-{i}"
        return Record(key.encode(), (f'{{"event_id":"{event_id}","key":"{key}","event_time":'
                                     f'"{stamp}","value":{i % 997}.25}}').encode())

    def _run(self) -> None:
        try:
            per_slice, start, tick = max(1, int(self.rate) // 10), time.monotonic(), 0
            while not self.stopping.is_set():
                now = datetime.now(UTC)
                for i in range(self.sent, self.sent + per_slice):
                    self.producer.send(i, self._record(i, now))
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

    def flat_after(self, since: float, level: int) -> tuple[float | None, list]:
        """How long after `since` the lag is flat again: the first sample from which it stays
        at or under `level` (None: never), and the samples after `since` (seconds from it)."""
        after = [(t - since, n) for t, n in self.samples if t >= since and n is not None]
        flat = next((t for i, (t, _) in enumerate(after)
                     if all(n <= level for _, n in after[i:])), None)
        return flat, after


def await_landing(settings, want: int, svc, restart, exits: list, drill: str,
                  stall_s: float = 300):
    """Wait until `want` rows landed (bronze + quarantine), as long as rows keep landing (none
    in `stall_s` fails). A service that exited meanwhile is noted in `exits` (its first exit)
    and replaced by `restart()` to finish the check (the drill fails). Returns the service."""
    from testkit import faults

    landed, progress_at = landed_rows(settings), time.monotonic()
    while landed < want and time.monotonic() - progress_at < stall_s:
        if svc.poll() is not None:
            if not exits:
                exits.append({"exit": svc.returncode, "tail": faults.output(svc, 3000)[-600:]})
            say(drill, f"service exited {svc.returncode}: restarting it to finish the check "
                       "(the drill fails)")
            svc = restart()
        time.sleep(2)
        if (now := landed_rows(settings)) > landed:
            landed, progress_at = now, time.monotonic()
    if landed < want:
        raise DrillFailed(f"only {landed} of {want} acknowledged records landed, none in the "
                          f"last {stall_s:.0f} s: {faults.output(svc)}")
    return svc


def land_and_stop(settings, env: dict, folder, svc, producer, probe, result, exits: list,
                  drill: str, stall_s: float = 300):
    """The end of an outage drill, the fault over and the load run: the service's exit recorded
    (should it have died), the producer joined, every acknowledged record waited for
    (`await_landing`, restarting a service that died: the drill then fails), the lag probe
    stopped, the service stopped with SIGTERM. Returns (the acknowledged records, the service's
    log, whether it stopped cleanly)."""
    from testkit import faults

    if svc.poll() is not None:
        exits.append({"exit": svc.returncode, "tail": faults.output(svc, 3000)[-600:]})
    acked = producer.join().acked

    def restart():
        result.runs += 1
        return faults.start_service(env, folder / f"service-{len(exits)}.log")

    svc = await_landing(settings, len(acked), svc, restart, exits, drill, stall_s)
    probe.stopping.set()
    log = faults.output(svc, 2_000_000)
    svc.send_signal(signal.SIGTERM)
    svc.wait(180)
    return acked, log, svc.returncode == 0


def event_ids_check(settings, want: Counter) -> tuple[int, int, int]:
    """Bronze's event ids against `want` (the acknowledged valid events): (missing,
    duplicated, extra)."""
    bronze = table_or_empty(settings, "bronze_events")
    ids = Counter(bronze["event_id"].to_pylist()) if bronze is not None else Counter()
    return (sum((want - ids).values()), sum(n - 1 for n in ids.values() if n > 1),
            sum((ids - want).values()))

