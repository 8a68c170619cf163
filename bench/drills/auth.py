"""Drill 6, authentication: a broker of the drill's own whose client listener requires
SASL/SCRAM-SHA-512 (`infra/kafka/sasl_broker.py`), the pipeline configured through its
environment variables (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME /
KAFKA_SASL_PASSWORD for librdkafka, KAFKA_SASL_JAAS_CONFIG for Spark).

1. Right credentials: records produced with confluent-kafka on `settings.client_config`, a
   `stream_catch_up` run (Dagster, in-process) lands every one of them in bronze/quarantine.
2. Wrong password everywhere, and 3. a wrong password for Spark only (librdkafka's right): each
   (with new records produced first, so that the catch-up must read) a `stream_catch_up` run
   in a child process (Dagster instance on disk) that must fail within
   FAIL_FAST_S with an error naming authentication, a bounded number of failed handshakes in
   the broker log (and none after the failure: no retry storm), and neither password in the
   exception text, the child's stdout/stderr (Python, Dagster and the JVM's log4j), the run's
   Dagster event log records and run record, the Dagster storage files, or the broker log.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from bench.drills.common import (
    Context,
    DrillResult,
    check_landing,
    free_port,
    instance,
    produce_acked,
    run_job,
    say,
    step_failures,
)
from testkit.infra import sasl_broker_module
from testkit.run_report import event_log_text, failure_text

NAME = "authentication"
FAIL_FAST_S = 60.0
MAX_FAILED_HANDSHAKES = 30
QUIET_AFTER_S = 10.0


def sasl_broker(folder: Path, users: dict[str, str]):
    return sasl_broker_module().SaslBroker(folder, free_port(), free_port(), users=users)


def leaks(texts: dict[str, str], secret_values: list[str]) -> list[str]:
    """Names of the texts that contain any of the secrets."""
    return [name for name, text in texts.items() if any(s in text for s in secret_values)]


def wrong_credentials_run(env: dict[str, str], folder: Path, label: str,
                          warm_spark: bool = False) -> dict:
    """A `stream_catch_up` run with `env`, in a child process with a Dagster instance on disk.
    Returns what the child saw (seconds, success, error text) and its captured output."""
    home = folder / f"dagster-{label}"
    home.mkdir(parents=True, exist_ok=True)
    out = folder / f"{label}.json"
    t0 = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-m", "bench.drills.auth", "probe", str(home), str(out),
         *(["--warm-spark"] if warm_spark else [])],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=600)
    seen = json.loads(out.read_text()) if out.exists() else {"error": "no result file"}
    seen.update(stdout=child.stdout, stderr=child.stderr, exit=child.returncode,
                process_s=round(time.monotonic() - t0, 1), home=str(home))
    return seen


def _probe(home: str, out: str, warm_spark: bool = False) -> int:
    """Child side of `wrong_credentials_run`. `warm_spark`: start the SparkSession first (the
    run's resource then reuses it), so the time measured is the run's, not the JVM's start."""
    from dagster import DagsterInstance

    from testkit import runs

    if warm_spark:
        from lakehouse.config.settings import Settings
        from spark_jobs.session import get_spark

        get_spark(Settings.from_env())
    dagster_instance = DagsterInstance.local_temp(tempdir=home)
    t0 = time.monotonic()
    result, _ = runs.run_job("stream_catch_up", dagster_instance, quiet=True)
    seconds = time.monotonic() - t0
    Path(out).write_text(json.dumps({
        "run_id": result.run_id, "success": result.success, "seconds": round(seconds, 1),
        "failure": failure_text(result), "event_log": event_log_text(dagster_instance,
                                                                     result.run_id)}))
    print(f"stream_catch_up {'succeeded' if result.success else 'failed'} in {seconds:.1f}s",
          flush=True)
    return 0


def storage_text(home: str) -> str:
    """Raw bytes of every file of the Dagster instance (sqlite event/run storage, logs)."""
    chunks = []
    for p in Path(home).rglob("*"):
        if p.is_file():
            chunks.append(p.read_bytes().decode("latin-1"))
    return "\n".join(chunks)


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from testkit.generator import GeneratorConfig, generate

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    user, password = "lakehouse", "right-" + secrets.token_urlsafe(16)
    wrong = "wrong-" + secrets.token_urlsafe(16)
    broker = sasl_broker(folder / "broker", {user: password})
    say(NAME, f"starting a SASL_PLAINTEXT/SCRAM-SHA-512 broker: {broker.up()}")
    problems: list[str] = []
    cases: dict[str, dict] = {}
    try:
        right_env = broker.client_env(user, password)
        with instance(ctx, "auth", **right_env) as settings:
            records = generate(GeneratorConfig(count=ctx.n(20_000, 500), seed=ctx.seed,
                                               span=timedelta(hours=1),
                                               keys=5)).records
            produce_acked(settings, records)
            say(NAME, f"right credentials: {len(records)} records produced and acknowledged "
                      "(confluent-kafka, settings.client_config)")
            run_result, _ = run_job("stream_catch_up", DagsterInstance.ephemeral())
            result.runs += 1
            landing = check_landing(settings)
            say(NAME, f"right credentials: stream_catch_up "
                      f"{'succeeded' if run_result.success else 'FAILED'}; {landing.describe()}")
            if not run_result.success:
                problems.append(f"catch-up with the right credentials failed: "
                                f"{step_failures(run_result)}")
            result.records_checked += landing.checked
            result.lost += landing.lost
            result.duplicated += landing.duplicated
            # Records the wrong-credential runs must read: with nothing new, a catch-up starts
            # no Kafka read (an empty catch-up), and Spark's credentials would go untried.
            produce_acked(settings, generate(GeneratorConfig(
                count=ctx.n(2_000, 100), seed=ctx.seed + 1, span=timedelta(hours=1),
                keys=5)).records)
            topic, root = settings.events_topic, settings.lakehouse_root

        base = {**os.environ, "EVENTS_TOPIC": topic, "LAKEHOUSE_ROOT": root,
                "SPARK_CONF_SPARK_DRIVER_MEMORY": "2g"}
        variants = {
            "wrong_password": {**right_env, "KAFKA_SASL_PASSWORD": wrong,
                               "KAFKA_SASL_JAAS_CONFIG": right_env["KAFKA_SASL_JAAS_CONFIG"]
                               .replace(password, wrong)},
            "wrong_password_spark_only": {**right_env, "KAFKA_SASL_JAAS_CONFIG":
                                          right_env["KAFKA_SASL_JAAS_CONFIG"]
                                          .replace(password, wrong)},
        }
        for label, creds in variants.items():
            before = broker.failed_authentications()
            # Spark's reader is the one that fails in the second case: its JVM is started
            # before the measured run.
            seen = wrong_credentials_run({**base, **creds}, folder, label,
                                         warm_spark=label.endswith("spark_only"))
            result.runs += 1
            result.faults_injected += 1
            during = broker.failed_authentications() - before
            time.sleep(QUIET_AFTER_S)
            after = broker.failed_authentications() - before - during
            texts = {"exception text": seen.get("failure", ""), "stdout": seen["stdout"],
                     "stderr": seen["stderr"], "event log records": seen.get("event_log", ""),
                     "dagster storage files": storage_text(seen["home"]),
                     "broker log": broker.log_file.read_text(errors="replace")}
            leaked = leaks(texts, [password, wrong])
            named = "authentication" in seen.get("failure", "").lower()
            first = next((line for line in seen.get("failure", "").splitlines()
                          if "authentication" in line.lower()), "")
            case = {"seconds": seen.get("seconds"), "process_s": seen["process_s"],
                    "failed": seen.get("success") is False, "names_authentication": named,
                    "failed_handshakes": during, "handshakes_after_failure": after,
                    "leaked_in": leaked, "error": first.strip()[:300]}
            cases[label] = case
            say(NAME, f"{label}: stream_catch_up {'failed' if case['failed'] else 'SUCCEEDED'} "
                      f"after {case['seconds']}s (child process {case['process_s']}s); error "
                      f"names authentication: {named} ({case['error'][:160]!r}); failed "
                      f"handshakes in the broker log: {during} during the run, {after} in the "
                      f"{QUIET_AFTER_S:.0f}s after; secret found in: {leaked or 'nothing'} "
                      f"(searched {', '.join(texts)})")
            if not case["failed"]:
                problems.append(f"{label}: the run did not fail")
            if not named:
                problems.append(f"{label}: the error does not name authentication")
            if case["seconds"] is None or case["seconds"] > FAIL_FAST_S:
                problems.append(f"{label}: failed after {case['seconds']}s > {FAIL_FAST_S}s")
            if during > MAX_FAILED_HANDSHAKES or after > 0:
                problems.append(f"{label}: {during} failed handshakes (max "
                                f"{MAX_FAILED_HANDSHAKES}), {after} after the failure")
            if leaked:
                problems.append(f"{label}: secret found in {leaked}")
    finally:
        broker.down()
        from lakehouse.kafka.admin import forget_admins

        forget_admins(broker.bootstrap)
    result.wrong = len(problems)
    result.details = {"cases": cases, "problems": problems}
    result.passed = not problems and result.lost == 0 and result.duplicated == 0
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        sys.exit(_probe(sys.argv[2], sys.argv[3], "--warm-spark" in sys.argv[4:]))
    sys.exit("usage: python -m bench.drills.auth probe <dagster_home> <out.json>")
