"""The everyday commands of docs/operations.md, docs/runbook.md and docs/specs.md, run as printed
(through bash, from the repo root) on a deployment of this test's own: its DAGSTER_HOME,
LAKEHOUSE_ROOT and topic on the suite's broker, events of yesterday and today. The catch-up by
hand, the backfill of yesterday and today as one run, the runbook's reconcile and feed of one
date (each `make materialize`, whose recipe is docs/design.md's `dagster asset materialize ...
--partition`), and a spec pipeline's catch-up and `make ui` with PIPELINES.

The only substitutions are the commands' placeholders: `<date>` (a date of the events), and
`examples/orders.yaml` by a copy of it with a topic of its own (the tests share one broker).
Minutes in all (a Dagster process and a Spark driver per command): `make test-long`, which
starts the broker `make kafka-up` finds running (the suite's own broker, on other ports, is not
the one the Makefile's `kafka-up` knows)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
import yaml
from conftest import REPO, free_port
from doc_commands import documented
from reference import Expected
from test_pipeline_e2e import measures, window_rows

from lakehouse.config.settings import Settings
from lakehouse.tables.reads import bronze_dates, compare_tables, read
from testkit.feed import closed_windows, committed_messages, fold
from testkit.generator import GeneratorConfig, generate, produce
from testkit.webserver import gql, stop

pytestmark = pytest.mark.long

CATCH_UP = "make materialize SELECT=raw_events,bronze_events,streaming_aggregates"
BACKFILL = ("make materialize SELECT=replay_aggregates,late_corrections,reconciled_aggregates "
            "PARTITION_RANGE=$(date -u -d yesterday +%F)...$(date -u +%F)")
RECONCILE = ("make materialize SELECT=replay_aggregates,late_corrections,reconciled_aggregates "
             "PARTITION=<date>")
FEED = "make materialize SELECT=reconciled_feed PARTITION=<date>"
ORDERS = ("make materialize PIPELINES=examples/orders.yaml SELECT=orders/raw_events,"
          "orders/bronze_events,orders/streaming_aggregates")
UI = "make ui PIPELINES=examples/orders.yaml"
RUN_SUCCESS = re.compile(r" - ([0-9a-f-]{36}) - .*RUN_SUCCESS")
# The UI's daemon launches no scheduled run while the test looks at it.
NO_SCHEDULED_RUN = {name: "0 0 1 1 *" for name in (
    "CATCH_UP_CRON", "CORRECTIONS_CRON", "VERIFICATION_CRON", "TIMELINE_CRON", "MAINTENANCE_CRON")}


def as_printed(command: str, **placeholders: str) -> str:
    """`command`, which a page shows, with its placeholders (`<name>`) filled in."""
    assert command in {c.text for c in documented()}, f"no page shows `{command}` any more"
    for name, value in placeholders.items():
        command = command.replace(f"<{name}>", value)
    return command


def run(command: str, env: dict, timeout: float = 900) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, kafka_bootstrap):
    """(environment, settings, records, today): a deployment's environment with its instance
    created, and 400 events of the last day (yesterday and today, UTC) on its topic."""
    from dagster import DagsterInstance

    base = tmp_path_factory.mktemp("doc-commands")
    home = base / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "infra/dagster.yaml", home / "dagster.yaml")
    DagsterInstance.from_config(str(home)).dispose()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "SPARK_REMOTE")}
    env.update({"DAGSTER_HOME": str(home), "LAKEHOUSE_ROOT": str(base / "lakehouse"),
                "EVENTS_TOPIC": f"doc-{uuid.uuid4().hex[:10]}",
                "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    settings = Settings.from_env(env)
    # Yesterday and today (UTC) whatever the hour: up to a minute ahead just after midnight.
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    end = max(now - timedelta(minutes=1), now.replace(hour=0, minute=1))
    records = generate(GeneratorConfig(count=400, seed=23, end=end, span=timedelta(days=1),
                                       keys=4)).records
    produce(settings, records)
    return env, settings, records, now.date()


def utc_today(env: dict) -> date:
    """The date `$(date -u +%F)` gives a command now."""
    done = subprocess.run(["date", "-u", "+%F"], env=env, capture_output=True, text=True,
                          check=True)
    return date.fromisoformat(done.stdout.strip())


def test_the_operations_commands_catch_up_backfill_reconcile_and_feed(deployment):
    env, settings, records, today = deployment
    expected = Expected.of([records])

    run(as_printed(CATCH_UP), env)  # the catch-up by hand
    assert read(settings, "bronze_events").num_rows == len(expected.rows)
    assert sorted(bronze_dates(settings)) == [today - timedelta(days=1), today]

    # The backfill of the dates of a fresh demo, yesterday and today: one run proves both (the
    # dates the command's `date` gives: a midnight passed since the events moves them by one).
    now = utc_today(env)
    output = run(as_printed(BACKFILL), env)
    backfilled = {now - timedelta(days=1), now} & bronze_dates(settings)
    assert len(set(RUN_SUCCESS.findall(output))) == 1, output[-4000:]
    gold = window_rows(read(settings, "reconciled_aggregates"))
    assert {k: measures(r) for k, r in gold.items()} == {
        k: v for k, v in expected.reconciled().items() if k[0].date() in backfilled}
    assert backfilled and all(compare_tables(settings, d) == 0 for d in backfilled)

    # The runbook's: one date reconciled again, then its feed sent.
    d = max(backfilled).isoformat()
    run(as_printed(RECONCILE, date=d), env)
    assert compare_tables(settings, max(backfilled)) == 0
    run(as_printed(FEED, date=d), env)
    folded = fold(committed_messages(settings, settings.feed_topic))
    closed = closed_windows(read(settings, "reconciled_aggregates").to_pylist())
    assert closed and {k: v["revision"] for k, v in folded.items()} == {
        k: r["revision"] for k, r in closed.items()}


def test_a_spec_pipelines_commands_catch_it_up_and_show_it_in_the_ui(deployment, tmp_path):
    from lakehouse.specs.pipeline import load_spec
    from testkit.spec_events import generate_for_spec

    env, settings, _, _ = deployment
    spec = yaml.safe_load((REPO / "examples/orders.yaml").read_text())
    spec["topic"] = f"orders-{uuid.uuid4().hex[:8]}"
    orders = tmp_path / "orders.yaml"
    orders.write_text(yaml.safe_dump(spec))
    loaded = load_spec(orders)
    spec_settings = loaded.settings(settings, env)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
    produce(spec_settings, generate_for_spec(loaded, GeneratorConfig(
        count=200, seed=24, end=end, span=timedelta(hours=2), malformed_fraction=0)).records)

    output = run(as_printed(ORDERS).replace("examples/orders.yaml", str(orders)), env)
    [run_id] = set(RUN_SUCCESS.findall(output))
    assert read(spec_settings, "bronze_events").num_rows > 0

    port = free_port()
    log = tmp_path / "ui.log"
    ui_env = {**env, **NO_SCHEDULED_RUN, "DAGSTER_PORT": str(port)}
    with open(log, "wb") as out:
        ui = subprocess.Popen(["bash", "-c", as_printed(UI).replace("examples/orders.yaml",
                                                                    str(orders))],
                              cwd=REPO, env=ui_env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert ui.poll() is None, f"`{UI}` exited {ui.returncode}: {log.read_text()[-3000:]}"
            try:
                nodes = gql(url, "{ assetNodes { assetKey { path } } }")["assetNodes"]
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
        assert {"reconciled_aggregates", "orders/raw_events", "orders/reconciled_aggregates"} \
            <= keys, sorted(keys)
        runs = gql(url, "{ runsOrError { ... on Runs { results { runId status } } } }")
        assert {"runId": run_id, "status": "SUCCESS"} in runs["runsOrError"]["results"]
    finally:
        stop(ui)
