"""Where an ingest batch's per-record cost goes, step by step, on a cached in-memory batch (no
Kafka, no Delta log work beyond bronze's append): each step's wall time over BENCH_STEP_EVENTS
generated records (default 400,000: a steady batch at 20,000/s is 150-200k), medians of
BENCH_STEP_ROUNDS (3), in µs per record. The steps are the batch's own functions
(`transforms`), in the batch's order on one cache, the dedup's lookup against the earlier
batches' ids included (`recent_ids.RecentIds`, holding BENCH_STEP_EARLIER ids, default 3x the
batch: the watermark delay's worth at 20,000/s); `make profile` prices the whole batch with its
commits. The hand-written live query's `from_json` + windows runs on the same frame in the same
round (`bench.handwritten`), so the ratio of the two is the machine's hour divided out.

    python -m bench.step_costs          (writes bench/results/step-costs-<timestamp>.json)
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench import handwritten, write_result  # noqa: E402
from lakehouse.config.settings import Settings  # noqa: E402
from testkit.generator import GeneratorConfig, generate  # noqa: E402
from testkit.step_prices import PEER_STEP, SERVICE_STEPS  # noqa: E402


def _raw_frame(spark, n: int, now: datetime | None = None):
    import pyarrow as pa

    now = now or datetime.now(UTC).replace(microsecond=0)
    recs = generate(GeneratorConfig(count=n, seed=5, end=now - timedelta(minutes=1),
                                    span=timedelta(minutes=10), keys=max(50, n // 200))).records
    # The Kafka source's columns, handed over as one Arrow table (Spark reads its types from
    # the Arrow schema): row tuples took ~12 s for 100k records here.
    table = pa.table({"key": [r.key for r in recs], "value": [r.value for r in recs],
                      "topic": ["events"] * n, "partition": [i % 4 for i in range(n)],
                      "offset": list(range(n)), "timestamp": [now] * n, "timestampType": [1] * n},
                     schema=pa.schema([("key", pa.binary()), ("value", pa.binary()),
                                       ("topic", pa.string()), ("partition", pa.int32()),
                                       ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                                       ("timestampType", pa.int32())]))
    return spark.createDataFrame(table).repartition(2).cache()


def jvm_pid(spark) -> int:
    """The driver JVM's process id."""
    return spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()


def _cpu_s(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The JVM's own compilers: what they spend depends on what the JVM has compiled so far, not on
# the work priced.
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")


def jvm_cpu_s(pid: int) -> float:
    """Process `pid`'s CPU seconds so far (/proc utime + stime) less its JIT compiler threads':
    for the driver JVM, which a loaded machine distorts much less than wall time (local mode: the
    executors' threads are in it). The compilers are left out: they go on compiling through the
    priced rounds on a schedule of their own (over a whole `make test` they took two fifths of
    the drivers' CPU), which is not the priced step's cost. Rounds still spread widely on two
    shared cores (1.9-4.9 over the 30 of bench/results/guard-2026-12-07T210214.json): the
    verdict is on medians."""
    jit = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() in JIT_THREADS:
                jit += _cpu_s(task / "stat")
        except OSError:  # the thread ended
            continue
    return _cpu_s(Path(f"/proc/{pid}/stat")) - jit


def _earlier_ids(spark, n: int, now: datetime, chunks: int = 3):
    """A `RecentIds` holding `n` ids above the watermark in `chunks` checkpointed chunks, as the
    service holds them between batches; 1% of the frame's ids among them (copies re-sent)."""
    from pyspark.sql import functions as F

    from spark_jobs.recent_ids import CHUNK_COLUMNS, RecentIds

    held = RecentIds()
    newest_ms = int((now + timedelta(hours=1)).timestamp() * 1000)
    per = -(-n // chunks)
    for c in range(chunks):
        ids = spark.range(c * per, min(n, (c + 1) * per)).select(
            F.when(F.col("id") % 100 == 0, F.concat(F.lit("evt-5-"), (F.col("id") / 100)
                                                   .cast("long").cast("string")))
            .otherwise(F.concat(F.lit("evt-9-"), F.col("id").cast("string"))).alias("event_id"),
            F.lit(now).cast("timestamp").alias("event_time"))
        ids = ids.select(F.to_date("event_time").alias("event_date"), "event_id", "event_time")
        held.advance(c, ids.select(*CHUNK_COLUMNS).localCheckpoint(eager=True), newest_ms, 0)
    return held


@dataclass
class Bench:
    """A Spark session on a throwaway lakehouse, a cached raw frame of `n` records and the ids of
    the earlier batches: what every round prices against."""

    spark: object
    settings: Settings
    raw: object
    earlier: object
    n: int
    n_earlier: int
    tmp: str

    @classmethod
    def start(cls, n: int, earlier: int) -> Bench:
        from lakehouse.tables.catalog import BRONZE
        from spark_jobs.session import get_spark
        from spark_jobs.writer import Writer

        tmp = tempfile.mkdtemp(prefix="step-costs-")
        settings = Settings(lakehouse_root=tmp)
        spark = get_spark(settings)
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        now = datetime.now(UTC).replace(microsecond=0)
        raw = _raw_frame(spark, n, now)
        raw.count()
        Writer(spark, settings).create(BRONZE)  # as the stream writes it (statistics columns)
        return cls(spark, settings, raw, _earlier_ids(spark, earlier, now), n, earlier, tmp)

    @cached_property
    def jvm_pid(self) -> int:
        return jvm_pid(self.spark)

    def cpu_s(self) -> float:
        return jvm_cpu_s(self.jvm_pid)

    def close(self) -> None:
        self.earlier.clear()
        self.spark.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _clock(self, out: dict, name: str, fn):
        """Run `fn`, its JVM CPU and wall seconds into `out["cpu"][name]`, `out["wall"][name]`."""
        c0, w0 = self.cpu_s(), time.perf_counter()
        value = fn()
        out["wall"][name] = time.perf_counter() - w0
        out["cpu"][name] = self.cpu_s() - c0
        return value

    def service_round(self, out: dict) -> None:
        """The service's steps of one batch on one cache, clocked into `out`."""
        from pyspark.sql import functions as F

        from spark_jobs.recent_ids import free_checkpointed
        from spark_jobs.transforms.ingest import counted_events
        from spark_jobs.transforms.parse import classify, valid_columns
        from spark_jobs.transforms.windows import aggregate_windows

        shape = self.settings.shape

        def classified():
            c = classify(self.raw, self.settings).persist()
            c.agg(F.count(F.when(F.col("reason").isNull(), 1))).first()
            return c

        c = self._clock(out, SERVICE_STEPS[0], classified)
        valid = c.where(F.col("reason").isNull()).select(*valid_columns(shape))
        # Each round's append is an empty bronze table's first commit: no round pays the Delta
        # checkpoint that every tenth commit writes (the service pays it once in ten batches).
        bronze = self.settings.table_path("bronze_events")
        table = f"{self.tmp}/bronze-round-{uuid.uuid4().hex[:8]}"
        shutil.copytree(f"{bronze}/_delta_log", f"{table}/_delta_log")
        self._clock(out, SERVICE_STEPS[1], lambda: (
            valid.select("*", F.current_timestamp().alias("ingested_at"),
                         F.lit(0).cast("long").alias("bronze_batch_id"))
            .write.format("delta").mode("append").save(table)))
        self._clock(out, SERVICE_STEPS[2], lambda: aggregate_windows(
            counted_events(valid, self.earlier.lookup(0), shape), self.settings)
            .write.format("noop").mode("overwrite").save())
        chunk = self._clock(out, SERVICE_STEPS[3], lambda: valid.select(
            "event_date", "event_id", "event_time").localCheckpoint(eager=True))
        free_checkpointed(chunk)
        c.unpersist()

    def peer_round(self, out: dict) -> None:
        """The hand-written live query's work on the same frame, clocked into `out`."""
        shape = self.settings.shape
        self._clock(out, PEER_STEP, lambda: handwritten.windows(
            handwritten.events(self.raw, shape), shape).write.format("noop").mode("overwrite")
            .save())

    def rounds(self, rounds: int) -> list[dict[str, dict[str, float]]]:
        """`rounds` interleaved rounds (the service's batch, then the peer): per round, seconds
        by step, of the JVM's CPU ("cpu") and of the wall clock ("wall")."""
        out = []
        for _ in range(rounds):
            r = {"cpu": {}, "wall": {}}
            self.service_round(r)
            self.peer_round(r)
            out.append(r)
        return out

    def us(self, seconds: float) -> float:
        return round(seconds / self.n * 1e6, 2)


def main() -> int:
    from spark_jobs.transforms.parse import classify

    n = int(os.environ.get("BENCH_STEP_EVENTS", "400000"))
    rounds = int(os.environ.get("BENCH_STEP_ROUNDS", "3"))
    bench = Bench.start(n, int(os.environ.get("BENCH_STEP_EARLIER", str(3 * n))))
    steps = {}

    def time_it(name, fn):
        seconds = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
        steps[name] = {"median_s": round(statistics.median(seconds), 3),
                       "us_per_record": bench.us(statistics.median(seconds))}
        print(name, steps[name], flush=True)

    time_it("scan (cached input)", lambda: bench.raw.write.format("noop").mode("overwrite").save())
    time_it("classify", lambda: classify(bench.raw, bench.settings).write.format("noop")
            .mode("overwrite").save())
    time_it("hand-written peer: from_json", lambda: handwritten.events(
        bench.raw, bench.settings.shape).write.format("noop").mode("overwrite").save())
    measured = bench.rounds(rounds)
    for name in (*SERVICE_STEPS, PEER_STEP):
        median = statistics.median(r["wall"][name] for r in measured)
        cpu = statistics.median(r["cpu"][name] for r in measured)
        steps[name] = {"median_s": round(median, 3), "us_per_record": bench.us(median),
                       "cpu_us_per_record": bench.us(cpu)}
        print(name, steps[name], flush=True)
    service = [sum(r["wall"][s] for s in SERVICE_STEPS) for r in measured]
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "events": n,
           "earlier_ids": bench.n_earlier,
           "rounds": rounds, "load_avg": os.getloadavg(), "steps": steps,
           "service_us_per_record": bench.us(statistics.median(service)),
           "service_to_peer": round(statistics.median(
               s / r["wall"][PEER_STEP] for s, r in zip(service, measured, strict=True)), 3)}
    write_result("step-costs", out)
    bench.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
