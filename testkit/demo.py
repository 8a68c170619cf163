"""`make demo`: a day of realistic events through the whole pipeline, run by Dagster.

Produces the day in arrival-ordered chunks with a stream catch-up after each (so records that
arrive behind the watermark really are late for the fast path), then runs corrections, replay
and the blocking reconciliation check for every event date, and prints a summary. The runs are
recorded in $DAGSTER_HOME, so `make ui` shows them afterwards.

The console gets one line per step (each Dagster run: job, partition, ok/FAILED, seconds, run
id) and, on a terminal, a live line while a step runs. Dagster's event stream stays in the run
storage (the UI shows it); Spark's and Dagster's console output goes to $DAGSTER_HOME/demo.log.
`DEMO_VERBOSE=1` shows all of it on the console instead. A failed run prints its error and where
to read its logs, and the demo exits non-zero.

After the chunks, the streaming service (`make stream`'s code, in this process) runs for
DEMO_LIVE while events arrive in real time: its metrics are what `make observe-up`'s Prometheus
scrapes.

Knobs (demo only): DEMO_EVENTS (40000), DEMO_CHUNKS (4), DEMO_SEED (now), DEMO_SPAN (1 day of
event time, ending now), DEMO_LIVE (30 seconds; 0: no live step). PIPELINE=<spec.yaml>
(`make demo PIPELINE=examples/orders.yaml`) runs that spec's pipeline instead, with events
generated from the spec (`testkit.spec_events`), through its prefixed jobs in the same code
location (the spec is added to PIPELINES).
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from lakehouse.config import storage
from lakehouse.config.settings import Settings, SettingsError, parse_duration
from lakehouse.kafka.feed import published_version
from lakehouse.specs.pipeline import PipelineSpec, selected_pipeline
from lakehouse.tables import delta_log
from testkit.console import Console, quiet_process_output
from testkit.runs import run_job

# Dagster's console logger at WARNING: the DEBUG event stream still goes to the run storage.
ERROR_CHARS = 300


class DemoError(Exception):
    """The demo cannot start: a bad knob or environment (exit code 2)."""


@dataclass(frozen=True)
class Knobs:
    count: int
    chunks: int
    seed: int
    span: timedelta
    live: timedelta = timedelta(0)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Knobs:
        def positive(name: str, default: int) -> int:
            raw = env.get(name, "").strip() or str(default)
            if not raw.isdigit() or int(raw) <= 0:
                raise DemoError(f"{name}={raw!r} must be a positive integer")
            return int(raw)

        seed = env.get("DEMO_SEED", "").strip() or str(int(time.time()))
        if not seed.lstrip("-").isdigit():
            raise DemoError(f"DEMO_SEED={seed!r} must be an integer")
        try:
            span = parse_duration(env.get("DEMO_SPAN", "").strip() or "1 day", "DEMO_SPAN")
            raw = env.get("DEMO_LIVE", "").strip() or "30 seconds"
            live = timedelta(0) if raw == "0" else parse_duration(raw, "DEMO_LIVE")
        except SettingsError as exc:
            raise DemoError(str(exc)) from exc
        return cls(positive("DEMO_EVENTS", 40000), positive("DEMO_CHUNKS", 4), int(seed), span,
                   live)


@dataclass
class RunOutcome:
    job: str
    partition: str | None
    run_id: str
    seconds: float
    success: bool
    error: str | None = None
    checks: list = field(default_factory=list)
    result: object = None

    @property
    def proven(self) -> bool:
        return self.success and bool(self.checks) and all(c.passed for c in self.checks)


def short(text: str, limit: int = ERROR_CHARS) -> str:
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def run_error(result) -> str | None:
    """The first failed step's error (the user code's, not Dagster's wrapper), else the run's
    failure message or the failed checks."""
    failed_checks = []
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE":
            error = event.step_failure_data.error
            while error.cause is not None and (error.cls_name or "").startswith("Dagster"):
                error = error.cause
            head, sep, rest = short(error.message, 10 * ERROR_CHARS).partition(": ")
            if error.cls_name and head.split(".")[-1] == error.cls_name:
                message = f"{error.cls_name}: {rest}"  # without the module path
            else:
                message = f"{error.cls_name}: {head}{sep}{rest}" if error.cls_name else head + sep + rest
            return f"step {event.step_key}: {short(message)}"
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            check = event.asset_check_evaluation_data
            if not check.passed:
                failed_checks.append(check.check_name)
    if failed_checks:
        return "failed checks: " + ", ".join(failed_checks)
    failure = next((e for e in result.all_events if e.event_type_value == "RUN_FAILURE"), None)
    return short(failure.message) if failure is not None else None


class Demo:
    def __init__(self, settings: Settings, instance, console: Console, log_path: str | None,
                 prefix: str | None = None):
        self.settings = settings
        self.prefix = prefix
        self.instance = instance
        self.console = console
        self.log_path = log_path
        self.failures: list[RunOutcome] = []

    def named(self, name: str) -> str:
        """A job or node of the demo's pipeline (`orders__stream_catch_up` for a spec's)."""
        return f"{self.prefix}__{name}" if self.prefix else name

    def run(self, job_name: str, partition: str | None = None, note: str = "") -> RunOutcome:
        job_name = self.named(job_name)
        run_id = str(uuid.uuid4())
        step = {"key": ""}

        def on_event(entry) -> None:
            event = entry.dagster_event
            if event is not None and event.event_type_value == "STEP_START":
                step["key"] = entry.step_key or ""

        self.instance.add_event_listener(run_id, on_event)
        label = f"  {job_name:{16 + len(self.named(''))}s} {partition or '':11s}"
        start = time.monotonic()
        outcome = RunOutcome(job_name, partition, run_id, 0.0, False)
        with self.console.running(label.rstrip(), lambda: step["key"]):
            try:
                result, checks = run_job(job_name, self.instance, run_id=run_id,
                                         partition_key=partition,
                                         quiet=not self.settings.demo_verbose)
            except Exception as exc:  # noqa: BLE001 - e.g. invalid config: report as the run's
                traceback.print_exc()  # to the log file (or the console when verbose)
                outcome.error = short(f"{type(exc).__name__}: {exc}")
            else:
                outcome.result = result
                outcome.success = result.success
                outcome.checks = checks
                if not result.success:
                    outcome.error = run_error(result) or "the run failed"
        outcome.seconds = time.monotonic() - start
        self.console.line(f"{label} {'ok' if outcome.success else 'FAILED':6s} "
                          f"{outcome.seconds:6.1f}s  run {run_id}" + (f"  ({note})" if note else ""))
        if not outcome.success:
            self.failures.append(outcome)
            self.explain(outcome)
        return outcome

    def explain(self, outcome: RunOutcome) -> None:
        port = os.environ.get("DAGSTER_PORT", "3000")
        self.console.line(f"    error: {outcome.error}")
        where = (f"    logs: `make ui` (DAGSTER_HOME={self.instance.root_directory}), then "
                 f"http://127.0.0.1:{port}/runs/{outcome.run_id}")
        self.console.line(where + (f"; console output: {self.log_path}" if self.log_path else ""))

    def produce(self, records, label: str) -> None:
        from testkit.generator import produce

        start = time.monotonic()
        with self.console.running(f"  {'produce':16s} {label}"):
            produce(self.settings, records)
        self.console.line(f"  {'produce':16s} {label:11s} {len(records)} records "
                          f"{time.monotonic() - start:6.1f}s")


LIVE_RATE = 20  # events a second while the service runs


def live(run: Demo, knobs: Knobs, spec: PipelineSpec | None) -> bool:
    """The service (`make stream`'s `serve`, in this process, on the runs' Spark session) for
    DEMO_LIVE while events arrive in real time (LIVE_RATE a second, a few malformed): what
    Prometheus scrapes on METRICS_PORT meanwhile (`make observe-up`). Says how many batches it
    committed and their end-to-end latency from its own metrics; False when it failed."""
    import threading
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from lakehouse.tables.commit_tags import stream_commits
    from orchestration.service.runner import serve
    from testkit.generator import GeneratorConfig, generate, produce
    from testkit.spec_events import generate_for_spec

    settings, console = run.settings, run.console
    before = {c.version for c in stream_commits(settings, 50)}
    stop, status = threading.Event(), []
    service = threading.Thread(target=lambda: status.append(serve([settings], stop)), daemon=True)
    label = f"  {'service':16s} live {int(knobs.live.total_seconds())}s"
    start = time.monotonic()
    sent, latency = 0, None
    with console.running(label):
        service.start()
        for second in range(int(knobs.live.total_seconds())):
            cfg = GeneratorConfig(count=LIVE_RATE, seed=knobs.seed * 1000 + second + 1,
                                  span=timedelta(seconds=1), end=datetime.now(UTC),
                                  late_fraction=0.0, duplicate_fraction=0.0,
                                  malformed_fraction=0.05)
            records = (generate_for_spec(spec, cfg) if spec else generate(cfg)).records
            sent += produce(settings, records)
            time.sleep(max(0.0, start + second + 1 - time.monotonic()))
            if status:  # the service stopped by itself
                break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.metrics_port}/metrics",
                                        timeout=10) as r:
                samples = {s.name: s.value for f in text_string_to_metric_families(
                    r.read().decode()) for s in f.samples
                    if s.labels.get("pipeline") == settings.pipeline}
            n = samples.get("lakehouse_end_to_end_latency_seconds_count") or 0
            latency = samples["lakehouse_end_to_end_latency_seconds_sum"] / n if n else None
        except OSError:  # the port was taken: the service ran without metrics
            pass
        stop.set()
        service.join(timeout=300)
    batches = len({c.version for c in stream_commits(settings, 200)} - before)
    ok = status == [0]
    console.line(f"{label:30s} {sent} records, {batches} batches"
                 + (f", mean end-to-end latency {latency:.1f}s" if latency is not None else "")
                 + f" {'ok' if ok else 'FAILED'} {time.monotonic() - start:6.1f}s")
    return ok


def _has_bronze(settings: Settings) -> bool:
    return delta_log.exists(settings, "bronze_events")


def demo(settings: Settings, knobs: Knobs, instance, console: Console,
         log_path: str | None, spec: PipelineSpec | None = None) -> int:
    from lakehouse.tables.reads import compare_tables, table_counts
    from testkit.generator import GeneratorConfig, generate
    from testkit.spec_events import generate_for_spec

    cfg = GeneratorConfig(count=knobs.count, seed=knobs.seed, span=knobs.span)
    generated = generate_for_spec(spec, cfg) if spec else generate(cfg)
    kinds = generated.kinds()
    console.line(f"demo: pipeline {settings.pipeline!r}, {knobs.count} records (seed {knobs.seed}) "
                 f"to topic {settings.events_topic!r} in {knobs.chunks} chunks; lakehouse at "
                 f"{settings.root}")
    ui = f"`make ui PIPELINES={os.environ.get('PIPELINES', '')}`" if spec else "`make ui`"
    console.line(f"  runs recorded in {instance.root_directory} ({ui})"
                 + (f"; Spark/Dagster console output in {log_path}" if log_path else ""))
    run = Demo(settings, instance, console, log_path, spec.prefix if spec else None)
    before = table_counts(settings)["bronze_rows"] if _has_bronze(settings) else 0
    if before:
        console.line(f"  note: the lakehouse already holds {before} bronze rows from earlier runs; "
                     "the summary counts them too (`make clean` starts from scratch)")
    step = -(-len(generated.records) // knobs.chunks)
    for i in range(knobs.chunks):
        run.produce(generated.records[i * step:(i + 1) * step], f"chunk {i + 1}/{knobs.chunks}")
        if not run.run("stream_catch_up").success:
            return 1
        if i == knobs.chunks // 2 - 1:
            # Publish what is there mid-way, so later late events correct published windows.
            for d in sorted(table_counts(settings)["bronze_dates"]):
                run.run("reconcile_dates", d.isoformat(), note="published mid-way")
    if knobs.live:  # then a catch-up takes what arrived after the service's last batch
        if not live(run, knobs, spec) or not run.run("stream_catch_up").success:
            return 1
    dates = sorted(table_counts(settings)["bronze_dates"])
    verdicts: dict[date, bool] = {}
    for d in dates:
        verdicts[d] = run.run("reconcile_dates", d.isoformat()).proven
    report = run.run("report_timeline")
    run.run("check_freshness")  # so every check the UI lists has an evaluation
    card = run.run("report_scorecard")  # the scorecard's rows are checks too
    counts = table_counts(settings)
    console.line()
    console.line("summary")
    console.line(
        f"  produced           {len(generated.records)}  "
        f"(late {kinds['late']}, duplicates {kinds['duplicate'] + kinds['late_duplicate']}, "
        f"malformed {sum(v for k, v in kinds.items() if k not in ('event', 'late', 'duplicate', 'late_duplicate'))})")
    for k in ("bronze_rows", "duplicate_rows", "quarantined", "late_events", "streaming_windows",
              "reconciled_windows", "corrections"):
        console.line(f"  {k:18s} {counts[k]}")
    console.line(f"  quarantine reasons {counts['quarantine_reasons']}")
    ok = True
    for d in dates:
        diff = compare_tables(settings, d)
        equal = verdicts[d] and diff == 0
        ok &= equal
        console.line(f"  {d}: reconciled == replay: {'yes' if equal else f'NO ({diff} windows differ)'}"
                     f" (GX check {'passed' if verdicts[d] else 'FAILED'})")
    path = settings.path("reports", "timeline.html")
    if report.success:
        path = next((m.metadata["path"].value
                     for m in report.result.asset_materializations_for_node(
                         run.named("timeline_report"))
                     if "path" in m.metadata), path)
    console.line(f"  timeline report    {path if report.success else 'FAILED'}")
    sent, gold = published_version(settings), delta_log.version(settings, "reconciled_aggregates")
    ok &= sent == gold
    console.line(f"  downstream feed    {settings.feed_topic}: gold version {sent} of {gold} published")
    text = storage.read_text(settings.path("reports", "scorecard.json")) if card.success else None
    rows = json.loads(text)["rows"] if text else []
    failing = [r["name"] for r in rows if not r["passed"]]
    console.line(f"  scorecard          {len(rows) - len(failing)} of {len(rows)} rows pass"
                 + (f" (failing: {', '.join(failing)})" if failing else "")
                 + f": {settings.path('reports', 'scorecard.html')}")
    return 0 if ok and not run.failures else 1


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        spec, settings = selected_pipeline(env)
        if env is os.environ and not env.get("PIPELINE_OWNER"):
            # The scorecard's governance row wants an owner: a demo's is whoever runs it.
            os.environ["PIPELINE_OWNER"] = f"{getpass.getuser()} (the demo's; set PIPELINE_OWNER)"
        _add_to_code_location(env)
        knobs = Knobs.from_env(env)
        if not env.get("DAGSTER_HOME"):
            raise DemoError("DAGSTER_HOME is not set: run `make demo`, or set it to a folder "
                            "holding a dagster.yaml (cp infra/dagster.yaml)")
        if env.get("SPARK_REMOTE"):
            raise DemoError("SPARK_REMOTE is set: the demo runs every job in this one process "
                            "with a Spark driver of its own (a process holds one kind of "
                            "session); unset it for `make demo`. The runs that `make ui` "
                            "launches use it")
    except (SettingsError, DemoError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    from dagster import DagsterInstance

    instance = DagsterInstance.get()
    if settings.demo_verbose:
        console = Console(sys.stdout, live=False)
        try:
            return _guarded(lambda: demo(settings, knobs, instance, console, None, spec), None,
                            console)
        finally:
            _stop_spark()
    log_path = os.path.join(instance.root_directory, "demo.log")
    with quiet_process_output(log_path) as stream:
        console = Console(stream)
        try:
            return _guarded(lambda: demo(settings, knobs, instance, console, log_path, spec),
                            log_path, console)
        finally:
            _stop_spark()


def _add_to_code_location(env: Mapping[str, str]) -> None:
    """PIPELINE's spec joins PIPELINES, so the code location the runs use holds its jobs."""
    path = env.get("PIPELINE", "").strip()
    listed = [p.strip() for p in env.get("PIPELINES", "").split(",") if p.strip()]
    if path and not any(os.path.realpath(p) == os.path.realpath(path) for p in listed):
        os.environ["PIPELINES"] = ",".join([*listed, path])


def _stop_spark() -> None:
    """Stop the Spark session the runs shared (the `spark` resource keeps it for the process)
    while the interpreter is whole: the JVM and py4j's callback threads end cleanly instead of
    during interpreter teardown (its output goes to the log)."""
    if "pyspark.sql" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if session is not None:
        session.stop()


def _guarded(body, log_path: str | None, console: Console) -> int:
    """Run the demo; an unexpected error is one line on the console, its traceback in the log."""
    try:
        return body()
    except KeyboardInterrupt:
        console.line("demo: interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - a tool reports, it does not dump a traceback
        traceback.print_exc()
        console.line(f"demo: error: {short(f'{type(exc).__name__}: {exc}')}")
        if log_path:
            console.line(f"  traceback in {log_path}")
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: native libraries' static destructors (pyarrow, grpc) can abort
    # it after everything is written ("terminate called without an active exception").
    os._exit(code)
