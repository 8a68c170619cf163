"""The README and the docs site (docs/, mkdocs.yml) tell the truth about the names they give:
make targets, environment variables, Prometheus metrics, the design's sections, the folders and
their modules; the README stays one screen and the site builds with --strict. No Spark, no
broker: files, the settings model and the metrics registry only."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

from lakehouse.config.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
# The README and every page of the docs site: a name is documented when any of them gives it.
PAGES = {p: p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
DOCS = "\n\n".join(PAGES.values())
# Every page names only what exists today, docs/changelog.md included.
CURRENT = DOCS
ARCHITECTURE = (REPO / "docs/architecture.md").read_text()  # the folder table
MAKEFILE = (REPO / "Makefile").read_text()
PRODUCT = ("orchestration", "assets", "expectations", "spark_jobs", "lakehouse")
# Variables the docs name that no file of the repo reads, each for a reason.
READ_ELSEWHERE = {
    "TZ": "the C library's time zone (`TZ=America/New_York make test`)",
    "ORDERS_SASL_PASSWORD": "an example of a variable a spec's `secret_env` names",
}
# The pass-through families (lakehouse/config/settings.py, `_PassThrough`): every variable of each is a
# client option.
PASSED = {"KAFKA_SECURITY_", "KAFKA_SASL_", "KAFKA_SSL_", "SPARK_CONF_"}
# Product code may read these without the docs naming them.
NOT_SETTINGS = {"TERM": "the console's colour check"}


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


@cache
def python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [REPO / line for line in out.splitlines()]


@cache
def trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in python_files()}


def documented_variables(text: str = CURRENT) -> tuple[set[str], set[str]]:
    """(variables, families): upper-case names with an underscore in code spans, and names set
    as `NAME=value`; families are written `PREFIX_*` or `PREFIX_<key>`."""
    names, families = set(), set()
    for span in code_spans(text):
        families |= set(re.findall(r"(?<![\w$=])([A-Z][A-Z0-9_]*_)(?:\*|<\w+>)", span))
        names |= set(re.findall(r"(?<![\w$=])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?![\w.*<])", span))
        names |= set(re.findall(r"(?<![\w$=])([A-Z][A-Z0-9_]*)=", span))
    return names, families


def settings_variables() -> set[str]:
    """The variables the `Settings` fields read (their aliases)."""
    out = set()
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", ()):
            if not str(choice).startswith("_"):
                out.add(str(choice))
    return out


def environment_reads(tree: ast.Module) -> set[str]:
    """Names read from `os.environ` (or a mapping called `env`/`environ` standing for it):
    `.get("NAME")`, `["NAME"]`, `os.getenv("NAME")`."""

    def is_environ(node: ast.expr) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "environ")
                or (isinstance(node, ast.Name) and node.id in {"env", "environ"}))

    out = set()
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            if (node.func.attr == "get" and is_environ(node.func.value)) or node.func.attr == "getenv":
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.add(key.value)
    return out


def read_by_make_or_dagster(name: str) -> bool:
    make = re.search(rf"\$[({{]{name}[)}}]|\$\$\{{{name}[}}:]|^(export )?{name} \?=", MAKEFILE,
                     re.MULTILINE)
    yaml = any(re.search(rf"\{{env: {name}\}}", p.read_text())
               for p in (REPO / "infra").glob("*.yaml"))
    return bool(make or yaml)


def make_targets(text: str) -> set[str]:
    """The make targets a text names: `make <target>` in code spans and bash blocks."""
    named = set(re.findall(r"`make ([a-z][\w-]*)", text))
    return named | {m for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
                    for m in re.findall(r"^make ([a-z][\w-]*)", block, re.MULTILINE)}


def test_every_make_target_the_docs_name_exists():
    named = make_targets(DOCS)
    targets = set(re.findall(r"^([a-z][\w.-]*):(?!=)", MAKEFILE, re.MULTILINE))
    assert {"demo", "test", "materialize", "system-deps"} <= named
    assert not named - targets, f"named in the docs, not targets of the Makefile: {named - targets}"
    # The first screen: the two commands, the test tiers, and how to stop what keeps running.
    assert {"demo", "test", "test-unit", "test-cluster", "kafka-down", "down"} <= make_targets(README)


def test_every_variable_the_docs_name_is_read():
    names, families = documented_variables()
    parsed = trees()
    literals = {n.value for t in parsed.values() for n in ast.walk(t)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    constants = {t.id for tree in parsed.values() for n in tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    family_members = {n for n in names if n.startswith(tuple(PASSED))}
    unread = sorted(n for n in names - constants - family_members - set(READ_ELSEWHERE)
                    if n not in literals and not read_by_make_or_dagster(n))
    assert PASSED <= families and len(names) > 50
    assert not unread, f"the docs name variables nothing reads: {unread}"
    # A pass-through family's members are handed to the clients: Settings takes them in.
    for name in sorted(family_members | {f + "X" for f in PASSED}):
        s = Settings.from_env({name: "v"})
        assert s.kafka_options or s.spark_conf_extra, f"{name} is not read by Settings"
    # Another family (`AWS_*`) is read by name: some of its members are.
    for family in families - PASSED:
        assert any(n.startswith(family) for n in literals), f"nothing reads {family}*"


def test_every_setting_is_in_the_docs():
    names, families = documented_variables()
    read = settings_variables()
    for path, tree in trees().items():
        if path.relative_to(REPO).parts[0] in PRODUCT:
            read |= environment_reads(tree)
    read -= set(NOT_SETTINGS)
    assert {"WINDOW_SIZE", "TIMELINE_CRON", "SPARK_UI", "AWS_REGION", "PIPELINES"} <= read
    missing = sorted(read - names)
    assert not missing, f"read by the code, not in the docs: {missing}"
    assert PASSED <= families and "KAFKA_ISOLATION_LEVEL" in names
    assert Settings.from_env({"KAFKA_ISOLATION_LEVEL": "read_uncommitted"}).spark_kafka_options[
        "kafka.isolation.level"] == "read_uncommitted"


def test_every_metric_the_docs_name_is_exported():
    from prometheus_client import generate_latest

    from orchestration.daily_metrics import DailyCollector
    from orchestration.service.metrics import StreamMetrics

    metrics = StreamMetrics(Settings.from_env({}), offsets=lambda _: [])
    metrics.lock_held(True)  # the lock gauge appears once the runner took the lock
    exported = {f.name for f in DailyCollector([], None).collect()}  # the daily exporter's
    for family in metrics.registry.collect():
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert "lakehouse_stream_batch_duration_seconds" in generate_latest(metrics.registry).decode()
    # The watermark gauges appear once a watermark is known: their names as the source gives them.
    source = ast.parse((REPO / "orchestration/service/metrics.py").read_text())
    gauges = {n.value for n in ast.walk(source) if isinstance(n, ast.Constant)
              and isinstance(n.value, str) and re.fullmatch(r"lakehouse_[a-z_]+_seconds", n.value)}
    # Recording rules (`pipeline:lakehouse_..._seconds:p95_5m`, `instance:lakehouse_service_up`)
    # are the rules' names, not metrics (infra/prometheus/rules, tested with promtool).
    named = {m for span in code_spans(DOCS)
             for m in re.findall(r"(?<![:\w])lakehouse_[a-z_]+\b(?!:)", span)}
    # Dagster pools and the lock server's tables (lakehouse.tables.locks, .commit_log), not
    # metrics.
    named -= {"lakehouse_stream", "lakehouse_daily", "lakehouse_lock_work",
              "lakehouse_delta_commits"}
    assert len(named) >= 10 and "lakehouse_aggregate_freshness_seconds" in gauges
    assert named <= exported | gauges, f"named in the docs, not exported: {named - exported - gauges}"
    assert exported <= named, f"exported, not in the docs: {exported - named}"


def test_design_references_point_at_numbered_sections():
    sections = set(re.findall(r"^##+ (\d+(?:\.\d+)?)\.? ", (REPO / "docs/design.md").read_text(),
                              re.MULTILINE))
    refs = {}
    for path in [*python_files(), REPO / "Makefile", *PAGES]:
        for ref in re.findall(r"(?:DESIGN|design\.md) §(\d+(?:\.\d+)?)", path.read_text()):
            refs.setdefault(ref, []).append(str(path.relative_to(REPO)))
    assert len(refs) >= 5
    assert set(refs) <= sections, {r: f for r, f in refs.items() if r not in sections}


def folder_rows() -> dict[str, tuple[str, set[str]]]:
    """The folder table of docs/architecture.md: room -> (what it holds, the rooms its imports
    column names)."""
    rows = {}
    for holds_room, holds, imports in re.findall(r"^\| `(\w+)/` \| (.*) \| (.*) \|$", ARCHITECTURE,
                                                 re.MULTILINE):
        rows[holds_room] = (holds, set(re.findall(r"`(\w+)`", imports)))
    return rows


def test_the_folder_table_lists_every_module_and_what_each_room_imports():
    rows = folder_rows()
    rooms = [*PRODUCT, "testkit"]
    assert set(rooms) <= set(rows)
    for room in rooms:
        holds, imports = rows[room]
        modules = [p.relative_to(REPO / room) for p in python_files()
                   if p.relative_to(REPO).parts[0] == room and p.name != "__init__.py"]
        named = set(code_spans(holds))
        unnamed = [str(m) for m in modules
                   if m.stem not in named or any(f"{d}/" not in named for d in m.parts[:-1])]
        assert not unnamed, f"{room}/ modules the folder table leaves out: {unnamed}"
        imported = set()
        for path, tree in trees().items():
            if path.relative_to(REPO).parts[0] == room:
                imported |= {n.split(".")[0] for node in ast.walk(tree)
                             for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                       else [node.module] if isinstance(node, ast.ImportFrom)
                                       and node.level == 0 and node.module else [])}
        assert imports == (imported & set(rooms)) - {room}, room


def test_the_readme_is_one_screen_and_points_into_the_docs():
    lines = README.splitlines()
    assert len(lines) <= 70, f"README.md has {len(lines)} lines: one screen, the rest in docs/"
    assert max(map(len, lines)) <= 200, "no 1,000-character table rows on the first screen"
    headings = re.findall(r"^## (.+)$", README, re.MULTILINE)
    # docs/design.md and the Makefile refer to these sections by name (README "Operations",
    # README "Your own events"): they stay, each a pointer into the site.
    assert {"Prerequisites", "Code map", "Tests", "Operations", "Your own events"} <= set(headings)
    code_map = README.split("## Code map", 1)[1].split("\n## ", 1)[0]
    for folder in ("orchestration/", "assets/", "spark_jobs/", "expectations/", "lakehouse/",
                   "infra/", "tests/"):
        assert f"`{folder}`" in code_map, f"the code map leaves out {folder}"
    for item in ("Python 3.11", "venv", "sudo", "12 GB", "3 GB", "9092", "3000", "15002",
                 "9190", "9193"):
        assert item in README, f"the prerequisites or ports leave out {item!r}"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not link.startswith("http")]
    assert {"docs/operations.md", "docs/specs.md", "docs/performance.md"} <= set(local)
    assert not [link for link in local if not (REPO / link).exists()], "README links to nothing"


def test_the_docs_site_builds_strictly_offline(tmp_path):
    """Every page is in the nav and every link and anchor resolves (`mkdocs build --strict`:
    the suite's one build of the site, in `make test-unit` and `make test`; without -q, whose
    log level hides the warnings --strict counts); no plugin fetches anything (material's fonts
    are off, no social cards)."""
    config = (REPO / "mkdocs.yml").read_text()
    assert "font: false" in config and "social" not in config
    nav = set(re.findall(r"^\s*- (?:[^:]+: )?([\w-]+\.md)$", config, re.MULTILINE))
    assert {p.name for p in (REPO / "docs").glob("*.md")} == nav
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "https_proxy": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                            str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    assert (tmp_path / "site" / "performance.html").is_file()
