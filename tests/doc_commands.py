"""Every command README.md and docs/*.md show, with the test that runs it or why none does: the
one table `COMMANDS` (tests/unit/test_doc_commands.py holds the pages and the tests to it).

What counts as a command, outside the pages' other text:

- each line of a fenced block tagged `bash`, `sh`, `shell` or `console` (a `$ ` prompt and a
  trailing `# comment` dropped, `\\` continuations joined);
- each inline code span (its whitespace collapsed) whose first word, after any `NAME=value`
  assignments, is a program of `PROGRAMS`, a `.venv/bin/` tool or a script of the repo
  (`infra/`, `scripts/`, `bench/` `*.py`/`*.sh`), followed by at least one more word: `make demo`
  is a command, `make` or `dagster` alone is a name;
- each fenced `python` block, an example, keyed `<page> python <n>` (its n-th on the page).

An entry is either `Run(<test node id>)`, the test that runs the command as printed (or its
`make` target's recipe), checked mechanically by the unit test, or one reason of `REASONS`.
Words a command shows as placeholders (`<date>`, `...`, `YYYY-MM-DD`, `$(...)`, `$VAR`,
`/path/to/`) are not looked for; `instead` names a word the test replaces with its own (a name
of the docs' example)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
PROGRAMS = {"make", "dagster", "dg", "python", "python3", "pip", "mkdocs", "promtool", "curl",
            "sudo", "apt-get", "kill", "ps", "set", "git", "env"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SCRIPT = re.compile(r"(infra|scripts|bench)/\S+\.(py|sh)")


@dataclass(frozen=True)
class Command:
    page: str  # relative to the repo
    line: int
    text: str  # the key of COMMANDS
    kind: str  # "shell" or "python"
    body: str = ""  # a python block's code


@dataclass(frozen=True)
class Run:
    """The test that runs the command: a node id (`path::function`, parameters left out)."""

    test: str
    instead: tuple[tuple[str, str], ...] = ()  # (the docs' word, the test's)


def words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def is_command(span: str) -> bool:
    """Whether an inline code span is a command (see the module's docstring)."""
    ws = words(span)
    i = 0
    while i < len(ws) and ASSIGNMENT.match(ws[i]):
        i += 1
    if len(ws) - i < 2:
        return False
    program = ws[i]
    return (program in PROGRAMS or program.startswith(".venv/bin/")
            or bool(SCRIPT.fullmatch(program)))


def page_commands(path: Path) -> list[Command]:
    """The commands and python examples of one page, in page order."""
    page = str(path.relative_to(REPO))
    out: list[Command] = []
    prose: list[str] = []
    fence = None
    pending, block, start, blocks = "", [], 0, 0
    for number, line in enumerate(path.read_text().split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            prose.append("")
            if fence is None:
                fence, block, start = stripped[3:].strip(), [], number
            else:
                if fence == "python":
                    blocks += 1
                    out.append(Command(page, start, f"{page} python {blocks}", "python",
                                       "\n".join(block) + "\n"))
                fence = None
            continue
        if fence is None:
            prose.append(line)
            continue
        prose.append("")
        block.append(line)
        if fence in SHELL_FENCES:
            text = stripped[2:] if stripped.startswith("$ ") else stripped
            text = re.sub(r"(^|\s+)#.*$", "", text).strip()
            text = f"{pending} {text}".strip() if pending else text
            if text.endswith("\\"):
                pending = text[:-1].strip()
                continue
            pending = ""
            if text:
                out.append(Command(page, number, text, "shell"))
    body = "\n".join(prose)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", body):
        span = " ".join(m.group(1).split())
        if is_command(span):
            out.append(Command(page, body.count("\n", 0, m.start()) + 1, span, "shell"))
    return sorted(out, key=lambda c: c.line)


def untagged_commands(path: Path) -> list[tuple[int, str]]:
    """Lines of a page's untagged fenced blocks (output, diagrams) that read as commands: such a
    block is tagged `bash` when it holds commands."""
    out, fence = [], None
    for number, line in enumerate(path.read_text().split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
        elif fence == "" and is_command(re.sub(r"(^|\s+)#.*$", "", stripped)):
            out.append((number, stripped))
    return out


def documented() -> list[Command]:
    """Every command and python example of README.md and docs/*.md."""
    return [c for path in PAGES for c in page_commands(path)]


def python_blocks(page: str) -> list[str]:
    """The python examples of `page` (relative to the repo), as printed."""
    return [c.body for c in page_commands(REPO / page) if c.kind == "python"]


# Why a documented command is run by no test: the closed set of reasons.
CLUSTER = ("the cluster stack, not the local one: `make test-cluster` brings it up, runs "
           "tests/cluster on it and takes it down")
TIER = "a test tier or a step of one: it runs the suite itself (CI runs every tier: .ci/run)"
BENCH = ("a measurement: a benchmark or drill target, or the command of a recorded figure; run "
         "by hand for minutes, its results under bench/results/")
MAINTAINER = ("rewrites committed files (the docs' tables, plots and pictures): a maintainer's "
              "target; a unit test holds the repo to what it writes")
HUMAN = "needs a human: an editor, a browser, or a process of theirs named by its pid"
DESTRUCTIVE = "destructive: deletes the checkout's data and stops its servers"
HOST = ("installs on the host: Debian packages (root), Python packages or a venv from a given "
        "Python (the network)")
NAME = "names a program's mode in passing: nothing to run as printed"
REASONS = {CLUSTER, TIER, BENCH, MAINTAINER, HUMAN, DESTRUCTIVE, HOST, NAME}

# The tests that run what most commands run.
DEMO = "tests/alerts/test_demo_observed.py::test_after_the_demos_prometheus_has_every_sli_and_panel_for_both_pipelines"
OPERATIONS = "tests/e2e/test_doc_commands_e2e.py::test_the_operations_commands_catch_up_backfill_reconcile_and_feed"
SPEC_PIPELINE = "tests/e2e/test_doc_commands_e2e.py::test_a_spec_pipelines_commands_catch_it_up_and_show_it_in_the_ui"
EXAMPLES = "tests/e2e/test_doc_examples.py::test_the_python_examples_run_on_a_published_instance"
MAKE_DOWN = "tests/e2e/test_make_down.py::test_make_down_stops_every_server_and_keeps_the_data"
DG = "tests/unit/test_pipeline_components.py::test_dg_checks_and_lists_the_project_with_a_scaffolded_pipeline"
SCAFFOLD = "tests/e2e/test_spec_pipeline_e2e.py::test_the_pipeline_equals_the_reference_and_stays_in_its_folder"
SERVICE_PIPELINES = "tests/e2e/test_service_pipelines.py::test_three_pipelines_in_one_service"
SPEC_SERVICE = "tests/e2e/test_generations.py::test_a_spec_edit_while_the_service_runs_waits_for_its_next_start"
DAGSTER_CLI = "tests/e2e/test_definitions_materialize.py::test_asset_materialize_cli_from_repo_root"

COMMANDS: dict[str, Run | str] = {
    # The demo, the operations and the local servers.
    "make demo": Run(DEMO),
    "make demo PIPELINE=...": Run(DEMO),
    "make demo PIPELINE=<spec>": Run(DEMO),
    "make demo PIPELINE=examples/orders.yaml": Run(DEMO),
    "make scorecard": Run(DEMO),
    "make daily-metrics": Run(DEMO),
    "PIPELINES=examples/orders.yaml make observe-up": Run(DEMO),
    "make setup": Run(OPERATIONS),
    "make system-deps": Run(OPERATIONS),
    "make class-archive": Run(OPERATIONS),
    "make materialize": Run(OPERATIONS),
    "make materialize SELECT=... PARTITION=...": Run(OPERATIONS),
    "make materialize SELECT=raw_events,bronze_events,streaming_aggregates": Run(OPERATIONS),
    "make materialize SELECT=replay_aggregates,late_corrections,reconciled_aggregates "
    "PARTITION_RANGE=$(date -u -d yesterday +%F)...$(date -u +%F)": Run(OPERATIONS),
    "make materialize SELECT=replay_aggregates,late_corrections,reconciled_aggregates "
    "PARTITION=<date>": Run(OPERATIONS),
    "make materialize SELECT=reconciled_feed PARTITION=<date>": Run(OPERATIONS),
    "dagster asset materialize -m orchestration.definitions --select ... "
    "[--partition YYYY-MM-DD]": Run(OPERATIONS),
    "make materialize PIPELINES=examples/orders.yaml SELECT=orders/raw_events,"
    "orders/bronze_events,orders/streaming_aggregates": Run(SPEC_PIPELINE),
    "make ui PIPELINES=examples/orders.yaml": Run(SPEC_PIPELINE),
    "make ui": Run("tests/e2e/test_ui_browser.py::test_the_asset_graph_shows_the_contract_assets"),
    "make stream": Run("tests/e2e/test_service.py::"
                       "test_a_crash_inside_a_batch_and_a_catch_up_lose_and_duplicate_nothing"),
    "make stream PIPELINES=...": Run(SERVICE_PIPELINES),
    "make stream PIPELINES=examples/orders.yaml,examples/app_events.yaml": Run(SERVICE_PIPELINES),
    "make stream PIPELINE=<spec>": Run(SPEC_SERVICE),
    "make stream PIPELINE=examples/orders.yaml": Run(SPEC_SERVICE),
    "make kafka-up": Run("tests/e2e/test_broker.py::test_up_is_idempotent_and_down_stops_it"),
    "make kafka-down": Run(MAKE_DOWN),
    "make down": Run(MAKE_DOWN),
    "make spark-down": Run(MAKE_DOWN),
    "make registry-down": Run(MAKE_DOWN),
    "make cluster-down": Run(MAKE_DOWN),
    "make spark-up": Run("tests/e2e/test_connect_token.py::"
                         "test_the_projects_client_presents_the_token_and_runs"),
    "infra/spark/connect.py up": Run("tests/e2e/test_connect_token.py::"
                                     "test_the_projects_client_presents_the_token_and_runs"),
    "make registry-up": Run("tests/e2e/test_schema_registry.py::"
                            "test_the_schemas_are_the_subjects_versions_checked_like_files"),
    "make observe-up": Run("tests/e2e/test_observe_stack.py::test_observe_up_status_down"),
    "make observe-down": Run("tests/e2e/test_observe_stack.py::test_observe_up_status_down"),
    "make pg-up": Run("tests/e2e/test_infra_servers.py::test_postgres_holds_a_dagster_instance"),
    "make s3-up": Run("tests/e2e/test_infra_servers.py::"
                      "test_s3proxy_serves_signed_requests_on_its_bucket"),
    "make dashboards": Run("tests/unit/test_dashboard.py::"
                           "test_the_committed_dashboard_is_the_generators_output"),
    # Dagster's and dg's own commands.
    "dagster asset materialize": Run(DAGSTER_CLI),
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster ...": Run(DAGSTER_CLI),
    "dagster job execute": Run("tests/e2e/test_secrets_exposure.py::"
                               "test_no_secret_on_a_command_line_or_in_a_file_others_read"),
    "dg check": Run(DG),
    "dg list component-tree": Run(DG),
    "dg list defs --path orchestration/defs/deployment": Run(DG),
    ".venv/bin/dg check yaml && .venv/bin/dg check defs": Run(DG),
    ".venv/bin/dg list defs": Run(DG),
    ".venv/bin/dg list component-tree": Run(DG),
    ".venv/bin/dg list defs --path orchestration/defs/deployment": Run(DG),
    "dg scaffold defs": Run(SCAFFOLD),
    ".venv/bin/dg scaffold defs orchestration.components.PipelineComponent shipments":
        Run(SCAFFOLD, instead=(("shipments", "clash"),)),
    "$EDITOR orchestration/defs/shipments/defs.yaml": HUMAN,
    # The suite's own checks and tools.
    "mkdocs build --strict": Run("tests/unit/test_readme.py::"
                                 "test_the_docs_site_builds_strictly_offline"),
    "promtool check rules": Run("tests/unit/test_prometheus_rules.py::test_promtool_checks_the_rules"),
    "promtool test rules": Run("tests/unit/test_prometheus_rules.py::test_promtool_unit_tests_pass"),
    ".venv/bin/python -m testkit.suite_timings": Run(
        "tests/unit/test_doc_commands.py::test_the_suite_timings_command_prints_each_tiers_newest_file"),
    # The python examples.
    "docs/feed.md python 1": Run(EXAMPLES),
    "docs/feed.md python 2": Run(EXAMPLES),
    "docs/reading.md python 1": Run(EXAMPLES),
    # Run by no test, each for its reason.
    "make test": TIER,
    "make test*": TIER,
    "make test-unit": TIER,
    "make test-alerts": TIER,
    "make test-long": TIER,
    "make test-cluster": TIER,
    "make test PYTEST_ARGS=tests/unit/test_spec.py": TIER,
    "TZ=America/New_York make test": TIER,
    "make lint": TIER,
    "make cluster-up": CLUSTER,
    "make demo-cluster": CLUSTER,
    "make ui-cluster": CLUSTER,
    "SPARK_REMOTE=sc://127.0.0.1:15002 make ui-cluster": CLUSTER,
    "set -a; . .secrets/local.env; . infra/cluster.env; set +a": CLUSTER,
    "make bench": BENCH,
    "make bench-commits": BENCH,
    "make bench-fence": BENCH,
    "make bench-guard": BENCH,
    "make bench-jfr": BENCH,
    "make bench-replay-cost": BENCH,
    "make bench-run-path": BENCH,
    "make bench-service": BENCH,
    "make bench-stages": BENCH,
    "make bench-steps": BENCH,
    "STEP_AB=fields make bench-steps": BENCH,
    "make drills": BENCH,
    'make drills DRILLS_ARGS="--only registry"': BENCH,
    "DRILLS_SCALE=0.05 .venv/bin/python -m bench.drills --only registry": BENCH,
    "make profile": BENCH,
    "python -m bench.format_pair": BENCH,
    "python -m bench.guard --record": BENCH,
    "python -m bench.raw_record_cost": BENCH,
    "python -m bench.step_ab bronze": BENCH,
    'DEMO_EVENTS=5000 DEMO_LIVE="4 minutes" make demo': BENCH,
    "make report": MAINTAINER,
    "make screenshots": MAINTAINER,
    ".venv/bin/mkdocs serve -a 127.0.0.1:8000": HUMAN,
    "kill -CONT <pid>": HUMAN,
    "ps -o stat -p <pid>": HUMAN,
    "make clean": DESTRUCTIVE,
    "make setup PYTHON=/path/to/python3.11": HOST,
    "sudo apt-get install": HOST,
    "sudo apt-get install ...": HOST,
    "pip install polars": HOST,
    "python -c": NAME,
}
