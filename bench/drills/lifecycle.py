"""Drill: checkpoint and topic lifecycle, on the real service process.

(a) The service is SIGKILLed inside an ingest batch, then its checkpoint folder is deleted and
    it is restarted to the end of the topic (a new checkpoint starts at the Kafka position
    stamped on bronze's newest stream commit):
    - at `quarantine_before_bronze` (the batch's quarantine rows committed, bronze not: the
      records have malformed ones, so every batch quarantines some): every acknowledged offset
      lands in bronze or quarantine exactly once, the killed batch's quarantined offsets
      included (its orphan rows are dropped and the records read again, once);
    - at `bronze_before_aggregates` (bronze committed, the aggregates commit not): the same,
      and (at the end) every date proven: gold == replay == the plain-Python count.
(c) More than 100 bronze commits made after the newest stream commit (commits outside the
    stream, tagged as maintenance), the checkpoint deleted, more records produced, the service
    restarted: it resumes at the stamped position (no offset twice, none lost) with the
    watermark stamped there.
(b) The topic deleted and re-created, refilled past the old end offsets of every partition:
    the service exits non-zero naming the topic id change (both ids), and writes nothing (no
    table's Delta version moves, the checkpoint is unchanged).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    check_landing,
    instance,
    produce_acked,
    prove,
    say,
    service_env,
    table_or_empty,
    unique_changelog,
    wait_until,
)
from testkit import faults

NAME = "lifecycle"
KILL_POINTS = ("quarantine_before_bronze", "bronze_before_aggregates")
MAINTENANCE_COMMITS = 110  # bronze commits made outside the stream after its newest one
ATTEMPTS = 3  # per kill point: a kill can land just past its gap (the next commit got in)


def _local(path: str) -> Path:
    return Path(str(path).removeprefix("file://"))


def _positions_of_commit(settings, table: str, batch: tuple[str, int]) -> set[tuple[int, int]]:
    """(partition, offset) of the rows the ingest batch `batch` (query id, batch id) committed
    to `table`, read from the data files its commit added."""
    import pyarrow.parquet as pq

    log = faults.DeltaLog(settings.table_path(table)).refresh()
    out: set[tuple[int, int]] = set()
    for commit in log.commit_of(batch):
        for add in commit.adds:
            t = pq.read_table(log.table / unquote(add["path"]), columns=["partition", "offset"])
            out |= set(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    return out


def _positions(settings, table: str) -> Counter:
    t = table_or_empty(settings, table)
    if t is None:
        return Counter()
    return Counter(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


def _versions(settings) -> dict[str, int]:
    from lakehouse.tables import delta_log
    from lakehouse.tables.catalog import ALL_TABLES

    return {t.name: delta_log.version(settings, t.name) for t in ALL_TABLES}


def _checkpoint_files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from lakehouse.tables.commit_tags import newest_stream_commit, stream_commits
    from spark_jobs import stream
    from testkit.generator import GeneratorConfig, generate

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    ctx.spark()  # the proof's Dagster runs share this session
    problems: list[str] = []
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    # Chunks of at least three batches of 500 (the service's MAX_OFFSETS_PER_TRIGGER), a tenth
    # malformed, so every batch has quarantine rows; one chunk per service life that kills or
    # resumes, and spares for kills that land just past their gap.
    chunk_size = ctx.n(30_000, 1_500)
    records = generate(GeneratorConfig(count=8 * chunk_size, seed=ctx.seed + 21,
                                       end=end, span=timedelta(hours=2), keys=8,
                                       late_fraction=0.05, duplicate_fraction=0.04,
                                       malformed_fraction=0.1)).records
    chunks = [records[i:i + chunk_size] for i in range(0, len(records), chunk_size)]
    produced: list = []
    acked: set[tuple[int, int]] = set()
    lives = 0
    faults_done: list[dict] = []

    with instance(ctx, NAME) as settings:
        env = service_env()
        ckpt = settings.checkpoint_path(stream.INGEST_QUERY)
        ckpt_dir = _local(ckpt)

        def produce_next(n_chunks: int = 1) -> None:
            for _ in range(n_chunks):
                if not chunks:
                    raise DrillFailed("out of records to produce")
                chunk = chunks.pop(0)
                p = produce_acked(settings, chunk, start=len(produced))
                produced.extend(chunk)
                acked.update(p.acked.values())

        def start(label: str):
            nonlocal lives
            lives += 1
            result.runs += 1
            return faults.start_service(env, folder / f"service-{lives}-{label}.log")

        def service_to_end(label: str):
            """A service life until every acknowledged offset has landed and no batch is in
            flight; then SIGTERM, which must stop it cleanly."""
            svc = start(label)
            t0 = time.monotonic()
            try:
                wait_until(lambda: check_landing(settings, acked).lost == 0, 900,
                           f"every acknowledged offset landed ({label})", poll=2, proc=svc)
                wait_until(lambda: faults.in_flight(ckpt) is None, 300,
                           f"the last batch committed ({label})", poll=0.5, proc=svc)
                svc.send_signal(signal.SIGTERM)
                svc.wait(180)
            finally:
                if svc.poll() is None:
                    faults.crash(svc)
            log = faults.output(svc, 200_000)
            if svc.returncode != 0 or "stopped cleanly" not in log:
                raise DrillFailed(f"service ({label}) did not stop cleanly: {log[-2000:]}")
            say(NAME, f"service life {lives} ({label}): to the end of the topic in "
                      f"{time.monotonic() - t0:.0f}s, stopped cleanly")

        def delete_checkpoint(why: str) -> None:
            shutil.rmtree(ckpt_dir)
            faults_done.append({"fault": "checkpoint deleted", "after": why})
            say(NAME, f"checkpoint {ckpt_dir} deleted ({why})")

        def landing_once(what: str) -> None:
            landing = check_landing(settings, acked)
            full = check_landing(settings)  # the topic's whole offset range, too
            say(NAME, f"after {what}: {landing.describe()}; topic range: {full.describe()}")
            if landing.lost or landing.duplicated or full.lost or full.duplicated:
                problems.append(f"after {what}: {landing.describe()}; first missing "
                                f"{landing.missing_examples or full.missing_examples}")

        # ---- (a) a kill inside a batch, then the checkpoint lost --------------------------
        for point in KILL_POINTS:
            landed_at = None
            for attempt in range(1, ATTEMPTS + 1):
                produce_next()
                min_batch = max(1, faults.next_batch(ckpt))  # a stamped position before it
                svc = start(f"kill-{point}")
                t0 = time.monotonic()
                try:
                    batch, landed = faults.kill_inside_batch(svc, settings, point, min_batch,
                                                             timeout=600)
                finally:
                    if svc.poll() is None:
                        faults.crash(svc)
                query = json.loads((ckpt_dir / "metadata").read_text())["id"]
                after, _ = faults.INGEST_KILL_POINTS[point]
                killed = _positions_of_commit(settings, after, (query, batch))
                say(NAME, f"SIGKILL at {point}, batch {batch} of query {query[:8]}: "
                          f"{'landed' if landed else 'MISSED (the next commit got in)'}, "
                          f"{time.monotonic() - t0:.0f}s after start; the batch's {after} "
                          f"commit holds {len(killed)} rows")
                delete_checkpoint(f"a SIGKILL at {point}")
                service_to_end(f"after-{point}")
                landing_once(f"the kill at {point} and a new checkpoint")
                if landed:
                    landed_at = {"fault": f"SIGKILL at {point}", "batch": batch,
                                 "attempt": attempt, "rows": len(killed)}
                    break
            if landed_at is None:
                problems.append(f"no kill landed at {point} in {ATTEMPTS} attempts")
                continue
            faults_done.append(landed_at)
            # The killed batch's rows of that table, each exactly once, where they belong.
            table = faults.INGEST_KILL_POINTS[point][0]
            now = _positions(settings, table)
            if not killed:
                problems.append(f"the batch killed at {point} committed no {table} rows")
            twice = sum(1 for p in killed if now[p] > 1)
            gone = sum(1 for p in killed if now[p] == 0)
            say(NAME, f"the killed batch's {len(killed)} {table} offsets: {gone} missing, "
                      f"{twice} more than once")
            if twice or gone:
                problems.append(f"{point}: of the killed batch's {len(killed)} {table} offsets "
                                f"{gone} are missing and {twice} are there more than once")
            result.duplicated += twice
            result.lost += gone

        # ---- (c) the stream's position more than 100 commits back ---------------------------
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, write_deltalake

        stamped = newest_stream_commit(settings)
        uri, options = settings.delta_rs("bronze_events")
        empty = pa.schema(DeltaTable(uri, storage_options=options).schema().to_arrow()
                          ).empty_table()
        t0 = time.monotonic()
        for i in range(MAINTENANCE_COMMITS):  # commits outside the stream, no rows
            write_deltalake(uri, empty, mode="append", storage_options=options,
                            commit_properties=CommitProperties(
                                custom_metadata={"userMetadata": f"drill-maintenance-{i}"}))
        now_version = DeltaTable(uri, storage_options=options).version()
        found = newest_stream_commit(settings)
        back = now_version - stamped.version
        say(NAME, f"{MAINTENANCE_COMMITS} bronze commits outside the stream in "
                  f"{time.monotonic() - t0:.0f}s: the newest stream commit (version "
                  f"{stamped.version}, offsets {stamped.end_offsets}) is {back} commits back; "
                  f"found again: {found == stamped}")
        faults_done.append({"fault": f"{MAINTENANCE_COMMITS} bronze commits outside the "
                                     "stream", "commits_back": back})
        if back <= 100 or found != stamped:
            problems.append(f"the stream commit is {back} commits back (want > 100), found "
                            f"{found} (want version {stamped.version})")
        produce_next()
        delete_checkpoint(f"the stream's commit {back} commits back")
        service_to_end("position-far-back")
        landing_once(f"a new checkpoint {back} commits past the stream's position")
        # The new query's first batch judged lateness by the watermark stamped back there.
        query = json.loads((ckpt_dir / "metadata").read_text())["id"]
        ours = [c for c in stream_commits(settings, 1000) if c.query == query]
        first = min(ours, key=lambda c: c.batch_id) if ours else None
        say(NAME, f"the new query's first batch: watermark {first and first.watermark_ms} "
                  f"(stamped {back} commits back: {stamped.next_watermark_ms})")
        if first is None or first.watermark_ms != stamped.next_watermark_ms:
            problems.append(f"the new checkpoint's first batch used watermark "
                            f"{first and first.watermark_ms}, not the stamped "
                            f"{stamped.next_watermark_ms}")

        # ---- the proof of everything produced so far ---------------------------------------
        landing = check_landing(settings, acked)
        late = _positions(settings, "late_events")
        late_dup = sum(n - 1 for n in late.values() if n > 1)
        proof = prove(settings, DagsterInstance.ephemeral(), produced, NAME)
        result.runs += len(proof.dates)
        twice = unique_changelog(settings)
        say(NAME, f"late_events duplicated: {late_dup}; revisions logged twice: {twice}")

        # ---- (b) the topic deleted and re-created ------------------------------------------
        from lakehouse.kafka.admin import admin, ensure_topic, topic_id, topic_offsets

        old_id = topic_id(settings)
        old_ends = {o.partition: o.latest for o in topic_offsets(settings)}
        before_versions = _versions(settings)
        before_ckpt = _checkpoint_files(ckpt_dir)
        admin(settings).delete_topics([settings.events_topic])[settings.events_topic].result(60)
        wait_until(lambda: topic_id(settings) is None, 120, "the topic deleted", poll=0.5)

        def recreate() -> bool:
            try:
                ensure_topic(settings)
                return True
            except Exception:  # noqa: BLE001 - "marked for deletion" for a moment
                return False

        wait_until(recreate, 120, "the topic re-created", poll=0.5)
        new_id = topic_id(settings)
        refill = 0
        while True:  # past the old end offsets of every partition
            ends = {o.partition: o.latest for o in topic_offsets(settings)}
            if all(ends.get(p, 0) > o for p, o in old_ends.items()):
                break
            if refill > 5 * len(produced):
                raise DrillFailed(f"the re-created topic did not pass the old offsets: {ends} "
                                  f"vs {old_ends}")
            produce_acked(settings, produced[:chunk_size])
            refill += chunk_size
        faults_done.append({"fault": "topic deleted and re-created", "old_id": old_id,
                            "new_id": new_id})
        say(NAME, f"topic deleted and re-created: id {old_id} -> {new_id}; {refill} records "
                  f"produced, end offsets {ends} past the old {old_ends}")
        svc = start("replaced-topic")
        try:
            svc.wait(600)
        finally:
            if svc.poll() is None:
                faults.crash(svc)
                problems.append("the service on a re-created topic did not exit within 600 s")
        out = faults.output(svc, 200_000)
        named = (new_id is not None and old_id is not None and new_id != old_id
                 and "deleted and re-created" in out and f"id is now {new_id}" in out
                 and f"topic id {old_id}" in out)
        versions_moved = {k: (v, before_versions[k]) for k, v in _versions(settings).items()
                          if v != before_versions[k]}
        ckpt_changed = _checkpoint_files(ckpt_dir) != before_ckpt
        message = next((line for line in out.splitlines() if line.startswith("error:")), "")
        say(NAME, f"service on the re-created topic: exit {svc.returncode}; "
                  f"{message[:300]!r}; tables moved: {versions_moved or 'none'}; checkpoint "
                  f"changed: {ckpt_changed}")
        if svc.returncode in (0, None) or not named:
            problems.append(f"the service on a re-created topic exited {svc.returncode} without "
                            f"naming the topic id change ({old_id} -> {new_id}): {out[-1500:]}")
        if versions_moved or ckpt_changed:
            problems.append(f"the refused start wrote: tables {versions_moved}, checkpoint "
                            f"changed {ckpt_changed}")

    result.faults_injected = len(faults_done)
    result.records_checked = landing.checked
    result.lost += landing.lost
    result.duplicated += landing.duplicated + late_dup + twice
    result.wrong = proof.wrong + len(proof.failed_checks) + len(problems)
    result.details = {"faults": faults_done, "produced": len(produced), "service_lives": lives,
                      "dates": [str(d) for d in proof.dates],
                      "windows_checked": proof.windows_checked,
                      "proof_failures": proof.failed_checks, "notes": proof.notes,
                      "problems": problems}
    result.passed = (not problems and proof.ok and result.lost == 0
                     and result.duplicated == 0)
    return result
