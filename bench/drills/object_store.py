"""Drill: the object store. On the S3Proxy stack (an `s3a://` root of its own, the writer locks
on the stack's PostgreSQL: infra/cluster.env; Kafka and Spark stay on the local broker and
`local` master), the service is paused with SIGSTOP (its whole process group: Python driver and
JVM) for 90 s while an ingest batch is in flight, a second service is started meanwhile, then
the first is resumed with SIGCONT. Another process runs the Dagster job `table_maintenance` in a
loop the whole time, and records are produced before, during and after the pause. Then the
service is stopped, maintenance gets the stream's lock, and a last service runs to the end of
the topic.

What may happen to the paused holder's lock: PostgreSQL keeps a session-held advisory lock for as
long as the session lives, and a stopped process's kernel still answers for its TCP connection;
so the second service is refused (`CheckpointBusy`, naming the paused holder) and the first goes
on when resumed. Had the server dropped the paused session (a timeout, an operator), the second
would take the lock and the first, on SIGCONT, must stop at its next check (`WriterLockLost`,
exit 3) and never commit again. The drill finds out which happened and verifies that one:

- the second service refused while the first held the lock (exit 2, the holder's pid named,
  no `writer lock: took` line), or the lost-lock stop (exit 3, `writer lock: LOST`, no batch of
  the first after the resume);
- every Delta log (all tables) holds the versions 0..N, each once (listed through the S3 API):
  no commit lost or overwritten;
- each ingest batch tag (query id, batch id) is in at most one commit per table, and each
  `stream_progress` transaction (txnAppId, txnVersion) once;
- one runner writes at a time: every commit falls in the interval its runner's own output says
  it held the stream's lock (`writer lock:` lines of the services and of maintenance, epoch ms),
  by the runner the commit's tag names (maintenance-tagged commits in maintenance's intervals,
  the others in a service's), and in no other runner's; maintenance skipped the stream's tables,
  naming the holder, whenever a service held the lock (the paused one included), and took it
  only when none did;
- every offset of the topic in bronze or quarantine exactly once (`check_landing`);
- every date proven: gold == replay == the plain-Python count (`prove`, in a child process: its
  Spark session needs the s3a class path, which the drills' shared session lacks).

S3Proxy and PostgreSQL are started with their own scripts if they are not running, and stopped
at the end if the drill started them. `python -m bench.drills.object_store maintain|prove` are
the drill's child processes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import string
import subprocess
import sys
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    Feeder,
    check_landing,
    free_port,
    instance,
    produce_acked,
    say,
    service_env,
    wait_until,
)
from lakehouse.tables.delta_log import Commit, commit_versions, read_commit
from testkit import faults
from testkit.infra import infra_module

NAME = "object_store"
PAUSE_S = 90.0  # the SIGSTOP, whatever DRILLS_SCALE
FEED_S = 240.0  # the feeder's records last this long at its rate (it is stopped earlier)
AFTER_RESUME_S = 30.0  # records keep coming this long after the SIGCONT
REPO = Path(__file__).resolve().parents[2]
CLUSTER_ENV = REPO / "infra" / "cluster.env"
# Taken from infra/cluster.env: the object store and the lock server (not its Spark or Kafka).
STORE_KEYS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
              "AWS_S3_PATH_STYLE", "LAKEHOUSE_LOCK_URL")
# What the servers' scripts read (the lock server's port, role and password).
SERVER_KEYS = ("DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB")
SERVERS = (("S3Proxy", "infra/s3/s3proxy.py"), ("PostgreSQL", "infra/postgres/pg.py"))
MAINTENANCE_TAG = "lakehouse-pipeline:maintenance:"
LOCK_LINE = re.compile(r"writer lock: (took|releasing|LOST)\b.*? pid (\d+) at (\d{13})")
MAINT_LOCK_LINE = re.compile(
    r"writer lock: maintenance of (\w+) (took|releasing) .*? pid (\d+) at (\d{13})")
MAINT_RUN = "maintenance-run "


# ---------------------------------------------------------------------------------------------
# The stack
# ---------------------------------------------------------------------------------------------
def cluster_env() -> dict[str, str]:
    """infra/cluster.env as a dict, as `make` sources it: over the local stack's generated
    secrets (infra/local_secrets.py), its `${...}` expanded from them."""
    secrets = infra_module("local_secrets.py")
    out = secrets.ensure()
    for key, value in secrets.read(CLUSTER_ENV).items():
        out[key] = string.Template(value).substitute(out)
    return out


def _server(script: str, command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / script), command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@contextmanager
def object_store_stack(env: dict[str, str]):
    """S3Proxy and PostgreSQL up (with their own scripts) for the block; those this started are
    stopped afterwards, those already running are left alone. Yields the names started."""
    started: list[tuple[str, str]] = []
    try:
        for name, script in SERVERS:
            if _server(script, "status", env).returncode == 0:
                say(NAME, f"{name} already running: used and left running")
                continue
            done = _server(script, "up", env)
            if done.returncode != 0:
                raise DrillFailed(f"{name} did not start: {(done.stdout + done.stderr)[-1500:]}")
            started.append((name, script))
            say(NAME, (done.stdout.strip().splitlines() or [f"{name} up"])[-1])
        yield [name for name, _ in started]
    finally:
        for name, script in reversed(started):
            done = _server(script, "down", env)
            say(NAME, (done.stdout.strip().splitlines() or [f"{name} stopped"])[-1])


# ---------------------------------------------------------------------------------------------
# The Delta logs, read through the S3 API
# ---------------------------------------------------------------------------------------------
def read_log(settings, table: str) -> tuple[list[int], list[Commit]]:
    """The commit versions listed under the table's `_delta_log/` and the commits read."""
    uri = settings.table_path(table)
    versions = commit_versions(uri)
    return versions, [c for v in versions if (c := read_commit(uri, v)) is not None]


def tag(c: Commit) -> tuple[str, int] | None:
    """The ingest batch (query id, batch id) a commit belongs to, if the ingest made it."""
    from lakehouse.tables.commit_tags import batch_of

    return batch_of(c.user_metadata)


def s3_in_flight(settings) -> int | None:
    """A batch whose write-ahead `offsets/N` is in the checkpoint (on S3) without `commits/N`."""
    from lakehouse.config import storage

    base = settings.checkpoint_path("ingest")
    started = {int(n) for n in storage.list_names(f"{base}/offsets") if n.isdigit()}
    done = {int(n) for n in storage.list_names(f"{base}/commits") if n.isdigit()}
    return max(started - done) if started - done else None


# ---------------------------------------------------------------------------------------------
# Who held the stream's lock when (from the runners' own output)
# ---------------------------------------------------------------------------------------------
@dataclass
class Held:
    runner: str  # e.g. "service-1 pid 123", "maintenance pid 456"
    kind: str  # "service" or "maintenance"
    start: int  # epoch ms
    end: int | None  # None: never said it released (killed, or lost)
    table: str | None = None  # maintenance holds it for one table at a time
    lost: bool = False


def service_holds(label: str, log: str) -> list[Held]:
    out: list[Held] = []
    for m in LOCK_LINE.finditer(log):
        event, pid, at = m.group(1), m.group(2), int(m.group(3))
        if event == "took":
            out.append(Held(f"{label} pid {pid}", "service", at, None))
        elif out and out[-1].end is None:
            out[-1].end = at
            out[-1].lost = event == "LOST"
    return out


def maintenance_holds(log: str) -> list[Held]:
    out: list[Held] = []
    open_: dict[str, Held] = {}
    for m in MAINT_LOCK_LINE.finditer(log):
        table, event, pid, at = m.group(1), m.group(2), m.group(3), int(m.group(4))
        if event == "took":
            open_[table] = Held(f"maintenance pid {pid}", "maintenance", at, None, table)
            out.append(open_[table])
        elif table in open_:
            open_.pop(table).end = at
    return out


def maintenance_runs(log: str) -> list[dict]:
    return [json.loads(line[len(MAINT_RUN):]) for line in log.splitlines()
            if line.startswith(MAINT_RUN)]


def batch_lines(log: str) -> list[int]:
    return [int(b) for b in re.findall(r"^ingest: batch (\d+) rows", log, re.M)]


# ---------------------------------------------------------------------------------------------
# The drill
# ---------------------------------------------------------------------------------------------
def _ms() -> int:
    return int(time.time() * 1000)


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def run(ctx: Context, result: DrillResult) -> DrillResult:
    conf = cluster_env()
    store = {k: conf[k] for k in STORE_KEYS if k in conf}
    bucket = conf["LAKEHOUSE_ROOT"].removeprefix("s3a://").split("/", 1)[0]
    root = f"s3a://{bucket}/drill-object-store-{uuid.uuid4().hex[:8]}"
    stack_env = {**os.environ, **store, **{k: conf[k] for k in SERVER_KEYS if k in conf}}
    with object_store_stack(stack_env) as started:
        with instance(ctx, NAME, LAKEHOUSE_ROOT=root, **store) as settings:
            _drill(ctx, result, settings)
            result.details["servers_started"] = started
            if result.passed:  # like the work folder: kept for a look when the drill fails
                _remove_root(root)
    return result


def _remove_root(root: str) -> None:
    from lakehouse.config import storage

    filesystem, path = storage.arrow_fs(root)
    try:
        filesystem.delete_dir(path)
    except OSError as exc:
        say(NAME, f"could not remove {root}: {exc}")


def _drill(ctx: Context, result: DrillResult, settings) -> None:
    from lakehouse.kafka.admin import ensure_topic
    from lakehouse.tables import delta_log
    from lakehouse.tables.catalog import ALL_TABLES, BRONZE
    from spark_jobs.maintenance import STREAM_WRITTEN
    from testkit.generator import GeneratorConfig, generate

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    t_start = _ms()
    now = datetime.now(UTC)
    # Events from yesterday 18:00 to 10 minutes ago, in time order: the early batches fill
    # yesterday's partitions (>= 10 files each: maintenance has compacting to do once it gets
    # the stream's lock), the later ones today's.
    end = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    first = datetime.combine(now.date(), datetime.min.time(), tzinfo=UTC) - timedelta(hours=6)
    count = ctx.n(40_000, 2_000)
    records = generate(GeneratorConfig(count=count, seed=ctx.seed + 31, end=end,
                                       span=end - first, keys=8, late_fraction=0.03,
                                       duplicate_fraction=0.03,
                                       malformed_fraction=0.05)).records
    tail = ctx.n(4_000, 200)  # produced while no service runs, for the last one
    feed, last = records[:-tail], records[-tail:]
    env = service_env()
    procs: list[subprocess.Popen] = []
    lives = 0

    def service(label: str) -> subprocess.Popen:
        nonlocal lives
        lives += 1
        result.runs += 1
        proc = faults.start_service({**env, "METRICS_PORT": str(free_port())},
                                    folder / f"service-{lives}-{label}.log")
        procs.append(proc)
        return proc

    def log(proc: subprocess.Popen) -> str:
        return faults.output(proc, 10_000_000)

    def stop_when_landed(proc: subprocess.Popen, who: str) -> None:
        """Wait until every acknowledged offset landed and no batch is in flight, then SIGTERM
        the service; a stop that is not clean is a problem."""
        wait_until(lambda: check_landing(settings, acked).lost == 0, 900,
                   f"every acknowledged offset landed ({who})", poll=3, proc=proc)
        wait_until(lambda: s3_in_flight(settings) is None, 300, "the last batch committed",
                   poll=1, proc=proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(300)
        if proc.returncode != 0 or "stopped cleanly" not in log(proc):
            problems.append(f"{who} did not stop cleanly: exit {proc.returncode}: "
                            f"{log(proc)[-1500:]}")

    ensure_topic(settings)
    feeder = Feeder(settings, feed, rate=len(feed) / FEED_S).begin()
    maint = None
    try:
        # ---- the first service, maintenance beside it ---------------------------------------
        s1 = service("first")
        bronze_commits = lambda: sum(1 for c in read_log(settings, BRONZE.name)[1]  # noqa: E731
                                     if c.operation == "WRITE")
        wait_until(lambda: bronze_commits() >= 2, 600, "the first service's first batches",
                   poll=2, proc=s1)
        stop_maintenance = folder / "maintenance.stop"
        maint = faults._spawn([sys.executable, "-m", "bench.drills.object_store", "maintain",
                               str(stop_maintenance)],
                              {**env, "SPARK_CONF_SPARK_DRIVER_MEMORY": "1g"},
                              folder / "maintenance.log")
        procs.append(maint)
        result.runs += 1
        wait_until(lambda: maintenance_runs(log(maint)), 600, "maintenance's first run",
                   poll=2, proc=maint)
        wait_until(lambda: bronze_commits() >= 4, 600, "more batches", poll=2, proc=s1)

        # ---- SIGSTOP while a batch is in flight ----------------------------------------------
        deadline = time.monotonic() + 300
        while (batch := s3_in_flight(settings)) is None:
            if time.monotonic() > deadline or s1.poll() is not None:
                raise DrillFailed(f"no batch in flight within 300 s: {log(s1)[-2000:]}")
            time.sleep(0.1)
        os.killpg(s1.pid, signal.SIGSTOP)
        t_pause, sent_at_pause = _ms(), feeder.sent
        say(NAME, f"SIGSTOP service 1 (pid {s1.pid}, its process group) with batch {batch} in "
                  f"flight; {sent_at_pause} records sent so far")
        s2 = service("second")
        while s2.poll() is None and "writer lock: took" not in log(s2) \
                and _ms() < t_pause + PAUSE_S * 1000:
            time.sleep(0.5)
        s2_refused_in_pause = s2.poll() is not None
        time.sleep(max(0.0, (t_pause + PAUSE_S * 1000 - _ms()) / 1000))
        sent_at_resume = feeder.sent
        os.killpg(s1.pid, signal.SIGCONT)
        t_resume = _ms()
        paused_s = (t_resume - t_pause) / 1000
        say(NAME, f"SIGCONT service 1 after {paused_s:.1f} s; "
                  f"{sent_at_resume - sent_at_pause} records sent during the pause")
        if s2.poll() is None and "writer lock: took" not in log(s2):
            s2.wait(300)  # still starting at the resume: refused now (s1 runs), or takes over
        took_over = "writer lock: took" in log(s2)
        live = s2 if took_over else s1
        if took_over:
            behaviour = "lost-lock stop: the second service took the lock"
            s1.wait(300)
            out1 = log(s1)
            said = "writer lock: LOST" in out1
            say(NAME, f"the second service took the lock; service 1 exited {s1.returncode} "
                      f"after the resume ({'saying' if said else 'NOT saying'} it lost the lock)")
            if s1.returncode != 3 or not said:
                problems.append(f"service 1 lost its lock but exited {s1.returncode}: "
                                f"{out1[-1500:]}")
        else:
            out2 = log(s2)
            refusal = next((line for line in out2.splitlines() if line.startswith("error:")), "")
            behaviour = ("refused: the paused holder kept its PostgreSQL session" if
                         s2_refused_in_pause else "refused after the resume")
            say(NAME, f"second service: exit {s2.returncode}"
                      f"{' during the pause' if s2_refused_in_pause else ' after the resume'}: "
                      f"{refusal[:240]!r}")
            if s2.returncode != 2 or "is in use by" not in refusal \
                    or f"pid {s1.pid}" not in refusal:
                problems.append(f"the second service was not refused naming the holder (pid "
                                f"{s1.pid}): exit {s2.returncode}: {out2[-1500:]}")
        result.faults_injected += 2  # the pause, the second service

        # ---- records after the resume, then everything landed -------------------------------
        time.sleep(AFTER_RESUME_S)
        feeder.stop()
        producer = feeder.join()
        produced = feed[:feeder.sent]
        acked = set(producer.acked.values())
        if producer.failed or len(acked) != feeder.sent:
            problems.append(f"{feeder.sent} records sent, {len(acked)} acknowledged, "
                            f"{len(producer.failed)} failed")
        phases = {"before": sent_at_pause, "during": sent_at_resume - sent_at_pause,
                  "after": feeder.sent - sent_at_resume}
        say(NAME, f"records produced before/during/after the pause: {phases}")
        if min(phases.values()) <= 0:
            problems.append(f"records were not produced in every phase: {phases}")
        stop_when_landed(live, "the live service")
        t_stopped = _ms()

        # ---- maintenance gets the lock once no service holds it ------------------------------
        def maintained_freely() -> bool:
            return any(r["start_ms"] > t_stopped and r["stream_tables_maintained"]
                       for r in maintenance_runs(log(maint)))

        wait_until(maintained_freely, 600, "a maintenance run holding the stream's lock",
                   poll=2, proc=maint)
        stop_maintenance.touch()  # (SIGTERM would interrupt a run: Dagster takes the signal)
        maint.wait(300)
        if maint.returncode != 0:
            problems.append(f"maintenance exited {maint.returncode}: {log(maint)[-1500:]}")

        # ---- a last service to the end of the topic ------------------------------------------
        p = produce_acked(settings, last, start=len(produced))
        produced += last
        acked |= set(p.acked.values())
        s3 = service("last")
        stop_when_landed(s3, "the last service")
        t_end_services = _ms()
    finally:
        feeder.stop()
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                faults.crash(proc)

    # ---- the proof (a child process: its Spark session needs the s3a class path) -------------
    records_file = folder / "produced.pkl"
    records_file.write_bytes(pickle.dumps(produced))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench.drills.object_store", "prove",
                           str(records_file)], cwd=REPO, env={**env},
                          capture_output=True, text=True, timeout=3600)
    (folder / "proof.log").write_text(done.stdout + done.stderr)
    proof_line = next((line for line in done.stdout.splitlines() if line.startswith("PROOF ")),
                      None)
    if done.returncode != 0 or proof_line is None:
        raise DrillFailed(f"the proof process exited {done.returncode}: "
                          f"{(done.stdout + done.stderr)[-3000:]}")
    proof = json.loads(proof_line[len("PROOF "):])
    print(next((line for line in done.stdout.splitlines() if f"{NAME}: proof over" in line),
               ""), flush=True)
    result.runs += proof["runs"]
    say(NAME, f"proof in {time.monotonic() - t0:.0f}s: {proof['windows_checked']} windows, "
              f"wrong {proof['wrong']}, failed checks {proof['failed_checks']}")

    # ---- the logs of every table ---------------------------------------------------------------
    logs = {t.name: read_log(settings, t.name) for t in ALL_TABLES}
    versions_checked = 0
    for name, (versions, _) in logs.items():
        versions_checked += len(versions)
        newest = delta_log.version(settings, name)
        if versions != list(range(len(versions))) or newest != len(versions) - 1:
            gaps = sorted(set(range(newest + 1)) - set(versions))
            problems.append(f"{name}: _delta_log versions not contiguous 0..{newest}: "
                            f"{len(versions)} listed, missing {gaps[:10]}")
    tags_twice = {name: [b for b, n in Counter(tag(c) for c in commits
                                               if tag(c) is not None).items() if n > 1]
                  for name, (_, commits) in logs.items()}
    tags_twice = {k: v for k, v in tags_twice.items() if v}
    txns_twice = {name: [t for t, n in Counter(t for c in commits for t in c.txns).items()
                         if n > 1] for name, (_, commits) in logs.items()}
    txns_twice = {k: v for k, v in txns_twice.items() if v}
    tagged = sum(1 for _, commits in logs.values() for c in commits if tag(c) is not None)
    say(NAME, f"Delta logs: {versions_checked} versions over {len(logs)} tables, contiguous: "
              f"{not any('contiguous' in p for p in problems)}; {tagged} ingest-tagged commits, "
              f"tags twice: {tags_twice or 'none'}; txn twice: {txns_twice or 'none'}")
    if tags_twice or txns_twice:
        problems.append(f"committed twice: ingest tags {tags_twice}, txns {txns_twice}")

    # ---- one writer at a time ------------------------------------------------------------------
    holds: list[Held] = []
    service_logs = {}
    for proc in (p for p in procs if p is not maint):
        label = Path(proc.log_path).stem
        service_logs[label] = faults.output(proc, 10_000_000)
        holds += service_holds(label, service_logs[label])
    maint_log = faults.output(maint, 10_000_000)
    m_holds = maintenance_holds(maint_log)
    holds += m_holds
    for h in holds:
        if h.end is None:
            problems.append(f"{h.runner} took the lock at {_clock(h.start)} and never said it "
                            "released it")
    intervals = [h for h in holds if h.end is not None]
    service_intervals = [h for h in intervals if h.kind == "service"]
    say(NAME, "stream lock held by: " + "; ".join(
        f"{h.runner} {_clock(h.start)}-{_clock(h.end)}{' (LOST)' if h.lost else ''}"
        for h in service_intervals) + f"; maintenance {len(m_holds)} times")
    # The logged intervals of different runners never overlap (a lost holder's ends where the
    # other took over: it did not know).
    ordered = sorted(intervals, key=lambda h: h.start)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.start < a.end and a.runner != b.runner and not a.lost:
            problems.append(f"{a.runner} ({_clock(a.start)}-{_clock(a.end)}) and {b.runner} "
                            f"({_clock(b.start)}-{_clock(b.end)}) held the lock at once")
    stream_tables = {t.name for t in STREAM_WRITTEN}
    attributed: Counter = Counter()
    bad_commits: list[str] = []
    for name, (_, commits) in logs.items():
        for c in commits:
            if c.timestamp > t_end_services:
                if name in stream_tables:
                    bad_commits.append(f"{name} v{c.version} at {_clock(c.timestamp)} after the "
                                       "last service stopped (no stream lock held)")
                else:
                    attributed["proof (daily tables, date locks)"] += 1
                continue
            kind = ("maintenance" if (c.user_metadata or "").startswith(MAINTENANCE_TAG)
                    else "service")
            inside = [h for h in intervals if h.start <= c.timestamp <= h.end
                      and (h.table is None or h.table == name)]
            # A lost holder's interval ends where the new holder's starts.
            inside = [h for h in inside if not (h.lost and any(
                o.kind == "service" and o is not h and o.start <= c.timestamp
                for o in service_intervals if o.start > h.start))]
            if len(inside) != 1 or inside[0].kind != kind:
                bad_commits.append(
                    f"{name} v{c.version} ({c.operation}, {(c.user_metadata or '')[:60]!r}) at "
                    f"{_clock(c.timestamp)}: held by {[h.runner for h in inside] or 'nobody'}")
            else:
                attributed[inside[0].runner.split(' pid')[0] if kind == "service"
                           else "maintenance"] += 1
    say(NAME, f"commits by runner: {dict(attributed)}; outside their runner's lock: "
              f"{len(bad_commits)}")
    if bad_commits:
        problems.append(f"{len(bad_commits)} commits not made by the one lock holder: "
                        f"{bad_commits[:8]}")
    if took_over:
        after = [c for _, commits in logs.values() for c in commits
                 if c.timestamp >= t_resume and any(h.lost and h.start <= c.timestamp <= h.end
                                                    for h in service_intervals)]
        if after:
            problems.append(f"service 1 committed after it lost the lock: {after[:3]}")
    else:
        s1_hold = next((h for h in service_intervals if h.runner.startswith("service-1")), None)
        resumed_commits = sum(1 for _, commits in logs.values() for c in commits
                              if s1_hold and t_resume <= c.timestamp <= s1_hold.end)
        say(NAME, f"service 1 after the resume: {resumed_commits} commits, its batches "
                  f"{batch_lines(service_logs.get('service-1-first', ''))[-1:]} last")
        if not resumed_commits:
            problems.append("service 1 committed nothing after the resume")
    # Maintenance: skipped (naming the holder) while a service held the lock, and it ran freely.
    runs = maintenance_runs(maint_log)
    during = [r for r in runs if any(h.start <= r["start_ms"] and r["end_ms"] <= h.end
                                     for h in service_intervals)]
    in_pause = [r for r in runs if t_pause <= r["start_ms"] and r["end_ms"] <= t_resume]
    # (Other tables may be skipped for their own reasons: gold while the feed has not sent its
    # change data.)
    wrong_skip = [r["i"] for r in during if r["stream_tables_maintained"]
                  or not all(f"pid {_holder(r, service_intervals)}" in why
                             for why, tables in r["skipped"].items()
                             if stream_tables & set(tables))]
    failed_runs = [r["i"] for r in runs if not r["success"]]
    compacted = sum(r["files_removed"] for r in runs)
    say(NAME, f"maintenance: {len(runs)} runs, {len(during)} while a service held the lock (all "
              f"skipped the stream's tables naming it: {not wrong_skip}), {len(in_pause)} during "
              f"the pause; {len(m_holds)} lock holds once free, {compacted} files compacted "
              f"away; failed runs {failed_runs or 'none'}")
    if wrong_skip or failed_runs or not in_pause:
        problems.append(f"maintenance: runs {wrong_skip} did not skip naming the holder, runs "
                        f"{failed_runs} failed, {len(in_pause)} runs during the pause")

    # ---- every offset once ---------------------------------------------------------------------
    landing = check_landing(settings)
    acked_landing = check_landing(settings, acked)
    say(NAME, f"landing: {landing.describe()}; acknowledged: {acked_landing.describe()}")
    if landing.lost or landing.duplicated or acked_landing.lost:
        problems.append(f"landing: {landing.describe()}, first missing "
                        f"{landing.missing_examples or acked_landing.missing_examples}")

    result.records_checked = landing.checked
    result.lost = max(landing.lost, acked_landing.lost)
    result.duplicated = (landing.duplicated + proof["changelog_twice"]
                         + sum(map(len, tags_twice.values()))
                         + sum(map(len, txns_twice.values())))
    result.wrong = proof["wrong"] + len(proof["failed_checks"]) + len(problems)
    result.details = {
        "root": settings.root, "topic": settings.events_topic, "behaviour": behaviour,
        "pause_s": round(paused_s, 1), "batch_in_flight_at_pause": batch,
        "produced": len(produced), "produced_by_phase": {**phases, "last_service": len(last)},
        "service_lives": lives, "versions_checked": versions_checked,
        "ingest_tagged_commits": tagged, "commits_by_runner": dict(attributed),
        "maintenance_runs": len(runs), "maintenance_runs_while_held": len(during),
        "maintenance_runs_in_pause": len(in_pause), "maintenance_lock_holds": len(m_holds),
        "maintenance_files_compacted": compacted,
        "dates": proof["dates"], "windows_checked": proof["windows_checked"],
        "proof_failures": proof["failed_checks"], "notes": proof["notes"],
        "problems": problems, "seconds_to_services_end": round((t_end_services - t_start) / 1000),
    }
    result.passed = (not problems and not proof["failed_checks"] and proof["wrong"] == 0
                     and result.lost == 0 and result.duplicated == 0)


def _holder(run: dict, service_intervals: list[Held]) -> str:
    h = next(h for h in service_intervals if h.start <= run["start_ms"] and run["end_ms"] <= h.end)
    return h.runner.rsplit(" ", 1)[1]


# ---------------------------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------------------------
def _maintain_main(stop: Path) -> int:
    """`table_maintenance` (the Dagster job, in-process, its Spark session kept) in a loop
    until the file `stop` exists; a `maintenance-run {json}` line per run."""
    from dagster import DagsterInstance

    from bench.drills.common import run_job, step_failures
    from spark_jobs.maintenance import STREAM_WRITTEN

    stream_tables = {t.name for t in STREAM_WRITTEN}
    instance = DagsterInstance.ephemeral()
    i = 0
    while not stop.exists():
        i += 1
        start = _ms()
        result, _ = run_job("table_maintenance", instance)
        rows = []
        for event in result.all_events:
            if event.event_type_value == "STEP_OUTPUT":
                meta = event.event_specific_data.metadata
                if "tables" in meta:
                    rows = [r.data for r in meta["tables"].records]
        skipped: dict[str, list[str]] = {}  # why -> tables
        for r in rows:
            if r["skipped"]:
                skipped.setdefault(r["skipped"], []).append(r["table"])
        line = {"i": i, "start_ms": start, "end_ms": _ms(), "success": result.success,
                "skipped": skipped,
                "stream_tables_maintained": sorted(
                    r["table"] for r in rows if r["table"] in stream_tables and not r["skipped"]
                    and r["files_before"] > 0),
                "files_removed": sum(r["files_before"] - r["files_after"] for r in rows),
                "files_vacuumed": sum(r["files_vacuumed"] for r in rows),
                "error": None if result.success else step_failures(result)[:1000]}
        print(MAINT_RUN + json.dumps(line), flush=True)
        time.sleep(1.0)
    return 0


def _prove_main(records_file: str) -> int:
    from dagster import DagsterInstance

    from bench.drills.common import prove, unique_changelog
    from lakehouse.config.settings import Settings

    settings = Settings.from_env()
    records = pickle.loads(Path(records_file).read_bytes())
    proof = prove(settings, DagsterInstance.ephemeral(), records, NAME)
    print("PROOF " + json.dumps({
        "dates": [d.isoformat() for d in proof.dates], "runs": len(proof.dates),
        "windows_checked": proof.windows_checked, "wrong": proof.wrong,
        "failed_checks": proof.failed_checks, "notes": proof.notes,
        "changelog_twice": unique_changelog(settings)}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if sys.argv[1:2] == ["maintain"]:
        sys.exit(_maintain_main(Path(sys.argv[2])))
    if sys.argv[1:2] == ["prove"]:
        sys.exit(_prove_main(sys.argv[2]))
    sys.exit("usage: python -m bench.drills.object_store maintain <stop-file> | prove <records.pkl>")
