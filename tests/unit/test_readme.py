"""The README tells the truth about the names it gives: make targets, environment variables,
Prometheus metrics and the design's sections. No Spark: files, the settings model and the
metrics registry only."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

from lakehouse.config.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()
PRODUCT = ("orchestration", "service", "assets", "expectations", "reporting", "spark_jobs",
           "transforms", "specs", "lakehouse")
# Variables the README names that no file of the repo reads, each for a reason.
READ_ELSEWHERE = {
    "TZ": "the C library's time zone (`TZ=America/New_York make test`)",
    "ORDERS_SASL_PASSWORD": "an example of a variable a spec's `secret_env` names",
}
# The pass-through families (lakehouse/config/settings.py, `_PassThrough`): every variable of each is a
# client option.
PASSED = {"KAFKA_SECURITY_", "KAFKA_SASL_", "KAFKA_SSL_", "SPARK_CONF_"}
# Product code may read these without the README naming them.
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


def readme_variables() -> tuple[set[str], set[str]]:
    """(variables, families): upper-case names with an underscore in code spans, and names set
    as `NAME=value`; families are written `PREFIX_*` or `PREFIX_<key>`."""
    names, families = set(), set()
    for span in code_spans(README):
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


def test_every_make_target_the_readme_names_exists():
    named = set(re.findall(r"`make ([a-z][\w-]*)", README))
    named |= {m for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL)
              for m in re.findall(r"^make ([a-z][\w-]*)", block, re.MULTILINE)}
    targets = set(re.findall(r"^([a-z][\w.-]*):(?!=)", MAKEFILE, re.MULTILINE))
    assert {"demo", "test", "materialize", "system-deps"} <= named
    assert not named - targets, f"named in README.md, not targets of the Makefile: {named - targets}"


def test_every_variable_the_readme_names_is_read():
    names, families = readme_variables()
    parsed = trees()
    literals = {n.value for t in parsed.values() for n in ast.walk(t)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    constants = {t.id for tree in parsed.values() for n in tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    family_members = {n for n in names if n.startswith(tuple(PASSED))}
    unread = sorted(n for n in names - constants - family_members - set(READ_ELSEWHERE)
                    if n not in literals and not read_by_make_or_dagster(n))
    assert PASSED <= families and len(names) > 50
    assert not unread, f"README.md names variables nothing reads: {unread}"
    # A pass-through family's members are handed to the clients: Settings takes them in.
    for name in sorted(family_members | {f + "X" for f in PASSED}):
        s = Settings.from_env({name: "v"})
        assert s.kafka_options or s.spark_conf_extra, f"{name} is not read by Settings"
    # Another family (`AWS_*`) is read by name: some of its members are.
    for family in families - PASSED:
        assert any(n.startswith(family) for n in literals), f"nothing reads {family}*"


def test_every_setting_is_in_the_readme():
    names, families = readme_variables()
    read = settings_variables()
    for path, tree in trees().items():
        if path.relative_to(REPO).parts[0] in PRODUCT:
            read |= environment_reads(tree)
    read -= set(NOT_SETTINGS)
    assert {"WINDOW_SIZE", "TIMELINE_CRON", "SPARK_UI", "AWS_REGION", "PIPELINES"} <= read
    missing = sorted(read - names)
    assert not missing, f"read by the code, not in README.md: {missing}"
    assert PASSED <= families and "KAFKA_ISOLATION_LEVEL" in names
    assert Settings.from_env({"KAFKA_ISOLATION_LEVEL": "read_uncommitted"}).spark_kafka_options[
        "kafka.isolation.level"] == "read_uncommitted"


def test_every_metric_the_readme_names_is_exported():
    from prometheus_client import generate_latest

    from orchestration.daily_metrics import DailyCollector
    from service.metrics import StreamMetrics

    metrics = StreamMetrics(Settings.from_env({}), offsets=lambda _: [])
    metrics.lock_held(True)  # the lock gauge appears once the runner took the lock
    exported = {f.name for f in DailyCollector([], None).collect()}  # the daily exporter's
    for family in metrics.registry.collect():
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert "lakehouse_stream_batch_duration_seconds" in generate_latest(metrics.registry).decode()
    # The watermark gauges appear once a watermark is known: their names as the source gives them.
    source = ast.parse((REPO / "service/metrics.py").read_text())
    gauges = {n.value for n in ast.walk(source) if isinstance(n, ast.Constant)
              and isinstance(n.value, str) and re.fullmatch(r"lakehouse_[a-z_]+_seconds", n.value)}
    named = {m for span in code_spans(README) for m in re.findall(r"\blakehouse_[a-z_]+", span)}
    named -= {"lakehouse_stream", "lakehouse_daily"}  # Dagster pools, not metrics
    assert len(named) >= 10 and "lakehouse_aggregate_freshness_seconds" in gauges
    assert named <= exported | gauges, f"named in README.md, not exported: {named - exported - gauges}"
    assert exported <= named, f"exported, not in README.md: {exported - named}"


def test_design_references_point_at_numbered_sections():
    sections = set(re.findall(r"^##+ (\d+(?:\.\d+)?)\.? ", (REPO / "docs/design.md").read_text(),
                              re.MULTILINE))
    refs = {}
    for path in [*python_files(), REPO / "Makefile", REPO / "README.md"]:
        for ref in re.findall(r"(?:DESIGN|design\.md) §(\d+(?:\.\d+)?)", path.read_text()):
            refs.setdefault(ref, []).append(str(path.relative_to(REPO)))
    assert len(refs) >= 5
    assert set(refs) <= sections, {r: f for r, f in refs.items() if r not in sections}


def folder_rows() -> dict[str, tuple[str, set[str]]]:
    """README's folder table: room -> (what it holds, the rooms its imports column names)."""
    rows = {}
    for holds_room, holds, imports in re.findall(r"^\| `(\w+)/` \| (.*) \| (.*) \|$", README,
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
        assert not unnamed, f"{room}/ modules the README's folder table leaves out: {unnamed}"
        imported = set()
        for path, tree in trees().items():
            if path.relative_to(REPO).parts[0] == room:
                imported |= {n.split(".")[0] for node in ast.walk(tree)
                             for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                       else [node.module] if isinstance(node, ast.ImportFrom)
                                       and node.level == 0 and node.module else [])}
        assert imports == (imported & set(rooms)) - {room}, room
