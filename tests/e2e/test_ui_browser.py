"""The Dagster UI in a real browser (Playwright driving Debian's chromium): what a user sees on an
instance a demo leaves behind (events of two dates, caught up), served by the command `make ui`
runs. The asset graph with the contract's assets; a backfill of the two dates launched from the
UI, which runs and succeeds; then what it leaves for the user: a daily asset's partitions with
their status, the proof check's result per date, and a date's run metadata.

The backfill is the module's `backfilled` fixture (launched once, through the UI, before any
test that reads its results), so each test holds on its own in any order.

`make test-long` installs chromium (`infra/system_packages.sh`); Playwright comes with the venv.
With UI_SCREENSHOTS set to a folder, the pages are saved there as PNG."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import free_port

from testkit.webserver import gql, graph_url, stop, wait_ready

pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
CONTRACT = ("raw_events", "bronze_events", "streaming_aggregates", "late_corrections",
            "reconciled_aggregates", "replay_aggregates")
BACKFILL_TIMEOUT_S = 300


def ui_command(port: int) -> list[str]:
    """The command of the Makefile's `ui` target, on `port`: the test serves what users run."""
    recipe = re.search(r"^ui:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "the Makefile has no `ui:` target with a one-line recipe"
    line = (recipe.group(1).replace("$(VENV)", str(REPO / ".venv"))
            .replace("$${DAGSTER_PORT:-3000}", str(port)))
    assert "$" not in line, f"unexpanded make variable in the ui recipe: {line}"
    return shlex.split(line)


def dagster(env: dict, *args: str) -> None:
    done = subprocess.run([str(REPO / ".venv/bin/dagster"), "job", "execute", "-m",
                           "orchestration.definitions", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.fixture(scope="module")
def ui(tmp_path_factory, kafka_bootstrap):
    """(base URL, the two event dates, the screenshot folder or None): a demo-like instance
    served by `make ui`'s command (webserver and daemon) on a free port."""
    from lakehouse.config.env import overridden
    from lakehouse.config.settings import Settings
    from testkit.generator import GeneratorConfig, end_across_midnight, generate, produce

    base = tmp_path_factory.mktemp("ui")
    home = base / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "infra/dagster.yaml", home / "dagster.yaml")
    span = timedelta(hours=4)
    # The daily partitions run from the first event date to today's, and a date with no events
    # fails its proof ("no data on either side"): the events end today, a few minutes into it.
    # Close to a midnight (the module's minutes would cross it, or the new date has too little
    # yet), the fixture waits until a few minutes past it.
    room, module_run = timedelta(minutes=4), timedelta(minutes=5)  # waits 9 minutes at most
    now = datetime.now(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if now > midnight + timedelta(days=1) - module_run:
        midnight += timedelta(days=1)  # the next one is the one to clear
    time.sleep(max(0.0, (midnight + room - now).total_seconds()))
    end = end_across_midnight(datetime.now(UTC), margin=timedelta(seconds=30), room=room)
    dates = ((end - span).date().isoformat(), end.date().isoformat())
    # As on a user's instance: the daily partitions start at the first event date (the suite's
    # PARTITIONS_START pins them to a fixed date for its other tests).
    env = {**{k: v for k, v in os.environ.items() if k != "PARTITIONS_START"},
           "DAGSTER_HOME": str(home), "LAKEHOUSE_ROOT": str(base / "lakehouse"),
           "EVENTS_TOPIC": f"ui-{uuid.uuid4().hex[:10]}", "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "DAGSTER_DISABLE_TELEMETRY": "true", "GX_ANALYTICS_ENABLED": "false"}
    with overridden({k: env[k] for k in ("LAKEHOUSE_ROOT", "EVENTS_TOPIC",
                                         "KAFKA_BOOTSTRAP_SERVERS")}):
        produce(Settings.from_env(), generate(GeneratorConfig(
            count=600, seed=31, end=end, span=span, keys=3)).records)
    # Caught up before the UI starts: its definitions load the partitions from bronze's dates.
    dagster(env, "-j", "stream_catch_up")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = home / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(ui_command(port), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, url, log)
        shots = os.environ.get("UI_SCREENSHOTS")
        yield url, dates, Path(shots) if shots else None
    finally:
        stop(proc, grace_s=0)  # a throwaway instance: no graceful shutdown to wait for


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed: `make test-long` installs Debian's package"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture()
def page(browser, ui):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(60_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def open_page(page, url: str, shots: Path | None = None, name: str = ""):
    """Go to `url`; the callers wait for what they look at. A screenshot waits for the page's
    requests to settle first."""
    page.goto(url, wait_until="domcontentloaded")
    if shots is not None and name:
        page.wait_for_load_state("networkidle")
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / f"{name}.png"))
    return page


def visible(page, text, exact: bool = True):
    """The first visible element whose text is `text` (a string, exactly, or a pattern)."""
    return page.get_by_text(text, exact=exact).locator("visible=true").first


def shown_as(name: str, text: str) -> bool:
    """Whether a graph node's label `text` shows asset `name`: zoomed out, the UI truncates long
    names in the middle (`stream…_aggregates`)."""
    if "…" not in text:
        return text == name
    head, tail = text.split("…", 1)
    return name.startswith(head) and name.endswith(tail) and len(head + tail) < len(name)


def test_the_asset_graph_shows_the_contract_assets(page, ui):
    url, _, _ = ui
    open_page(page, graph_url(url))
    nodes = page.locator("[class*=AssetNode_assetName]")
    nodes.first.wait_for()
    labels = nodes.all_inner_texts()
    missing = [a for a in CONTRACT if not any(shown_as(a, t) for t in labels)]
    assert not missing, f"{missing} not in the asset graph's nodes {labels}"


def backfill_state(url: str, backfill_id: str) -> dict:
    backfill = gql(url, """query ($id: String!) { partitionBackfillOrError(backfillId: $id) {
        __typename ... on PartitionBackfill { status partitionNames
        runs(limit: 10) { runId status } } } }""", {"id": backfill_id})["partitionBackfillOrError"]
    assert backfill["__typename"] == "PartitionBackfill", backfill
    return backfill


@pytest.fixture(scope="module")
def backfilled(browser, ui):
    """A backfill of both dates launched from the UI as a user does: the job `reconcile_dates`,
    "Materialize all…", All, "Launch backfill". Returns (backfill id, its runs) once every run
    has ended; the backfill's own status is the daemon's to set on its next pass (the test that
    checks it waits for that)."""
    url, dates, shots = ui
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(60_000)
    try:
        page = open_page(context.new_page(), f"{url}/locations/__repository__@"
                                             "orchestration.definitions/jobs/reconcile_dates")
        page.get_by_role("button", name="Materialize all…").click()
        dialog = page.get_by_role("dialog").last
        dialog.get_by_text("Launch runs to materialize").wait_for()
        dialog.get_by_role("button", name="All", exact=True).click()
        dialog.get_by_text(f"{len(dates)} partitions").first.wait_for()
        if shots is not None:
            page.screenshot(path=str(shots / "backfill-dialog.png"))
        dialog.get_by_role("button", name="Launch backfill").click()
        created = page.get_by_text(re.compile(r"^Created backfill \w+$")).first
        created.wait_for()
        backfill_id = created.inner_text().split()[-1]
    finally:
        context.close()

    deadline = time.monotonic() + BACKFILL_TIMEOUT_S
    while True:
        backfill = backfill_state(url, backfill_id)
        runs = backfill["runs"]
        if runs and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs):
            return backfill_id, runs
        assert time.monotonic() < deadline, f"backfill {backfill_id} not done: {backfill}"
        time.sleep(2)


def test_a_daily_asset_shows_its_partitions_with_their_status(page, ui, backfilled):
    url, dates, shots = ui
    open_page(page, f"{url}/assets/reconciled_aggregates?view=partitions")
    for date in dates:
        visible(page, date).wait_for()
    # Both dates, and only they, materialized by the backfill; none failed or missing (the
    # counts are read once the materialized one shows both: the page fills them in as it loads).
    visible(page, f"Materialized ({len(dates)})").wait_for()
    counts = {}
    for status in ("Materialized", "Missing", "Failed"):
        label = page.get_by_text(re.compile(rf"^{status} \(\d+\)$")).first
        counts[status] = int(re.search(r"\((\d+)\)", label.inner_text()).group(1))
    assert counts == {"Materialized": len(dates), "Missing": 0, "Failed": 0}, counts
    if shots is not None:
        page.screenshot(path=str(shots / "partitions.png"))


def proof_totals(page, url: str, shots: Path | None = None) -> dict:
    """The proof check's latest result as its page shows it: Passed, its description, and the
    per-date totals of gold and the replay (its `totals` metadata, opened as JSON)."""
    open_page(page, f"{url}/assets/reconciled_aggregates?view=checks")
    visible(page, "reconciled_equals_replay").click()
    visible(page, "Passed").wait_for()
    visible(page, "reconciled == replay, row by row").wait_for()
    if shots is not None:
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(shots / "check.png"))
    page.locator("tr", has=page.get_by_text("totals", exact=True)).get_by_text(
        "[Show JSON]").click()
    shown = page.get_by_role("dialog").last.inner_text()
    return json.loads(shown[shown.index("{"):shown.rindex("}") + 1])


def test_the_proof_checks_result_and_its_totals_per_date(page, ui, backfilled):
    url, dates, shots = ui
    totals = proof_totals(page, url, shots)
    for date in dates:  # the backfill's one run proved both dates
        row = totals[date]
        for measure in ("event_count", "value_sum", "windows"):
            assert row[f"reconciled_{measure}"] == row[f"replay_{measure}"], (date, row)
        assert int(row["reconciled_event_count"]) > 0, (date, row)


def test_a_runs_metadata_names_the_date_and_its_mode(page, ui, backfilled):
    url, dates, shots = ui
    open_page(page, f"{url}/assets/reconciled_aggregates?view=partitions&partition={dates[0]}",
              shots, "partition")
    for label in ("per_date", "modes", "windows_recomputed", "duration_s"):
        visible(page, label).wait_for()
    visible(page, "first run for the date", exact=False).wait_for()


def test_a_backfill_of_two_dates_launched_from_the_ui_succeeds(page, ui, backfilled):
    url, dates, shots = ui
    backfill_id, runs = backfilled
    assert [r["status"] for r in runs] == ["SUCCESS"], runs  # one run for the range
    open_page(page, f"{url}/runs/{runs[0]['runId']}", shots, "backfill-run")
    visible(page, "Success").wait_for()
    # The daemon marks the backfill done on its next pass (every 30 s) after the run ended.
    deadline = time.monotonic() + 90
    while (backfill := backfill_state(url, backfill_id))["status"] == "REQUESTED":
        assert time.monotonic() < deadline, f"backfill {backfill_id} still REQUESTED: {backfill}"
        time.sleep(2)
    assert sorted(backfill["partitionNames"]) == sorted(dates), backfill
    assert backfill["status"] == "COMPLETED_SUCCESS", backfill
