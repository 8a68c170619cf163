"""Every command README.md and docs/*.md show is run by a test, or excluded for one reason of a
closed set: the table `COMMANDS` of tests/doc_commands.py (what counts as a command: its
docstring). A command with no entry, an entry no page shows any more, a test that does not
exist, is skipped or does not run the command fails here. Files only: the tests named run the
commands in their own tiers.

A test runs a command when its file (with the helpers it imports from tests/ and testkit/, and
the conftest fixtures it asks for), read as source:

- runs the command line as printed through `bash -c` or `shell=True`; or
- for `make <target>`: runs `make` (no `-n`) with the target or with one that makes it (its
  prerequisites, `$(MAKE) <target>`), reads the target's recipe from the Makefile, or runs every
  program of that recipe (a module by `-m`; a script with its subcommand, or loaded by
  `infra_module` and the method of that name called); and names each `NAME=value` the command
  sets, with its value (a path: by its file name) unless a placeholder;
- for any other command: holds each of its words in its string literals outside docstrings (a
  program also as the last part of a path; a script with its subcommand as above), or runs a
  `make` target whose recipe holds them."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from doc_commands import (
    BENCH,
    CLUSTER,
    COMMANDS,
    DESTRUCTIVE,
    HOST,
    HUMAN,
    MAINTAINER,
    NAME,
    PAGES,
    REASONS,
    TIER,
    Run,
    documented,
    is_command,
    page_commands,
    untagged_commands,
    words,
)

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()
# What an excluded command must look like for its reason.
REASON_FITS = {
    CLUSTER: r"cluster",
    TIER: r"^(\S+=\S+ )*make (test|lint)",
    BENCH: r"\b(bench|drills|profile)\b|^DEMO_",
    MAINTAINER: r"^make (report|screenshots)$",
    HUMAN: r"<pid>|^\$EDITOR |^\.venv/bin/mkdocs serve ",
    DESTRUCTIVE: r"^make clean$",
    HOST: r"apt-get|^pip install|^make setup PYTHON=",
    NAME: r"^python -c$",
}
OPERATORS = {"&&", "||", ";", "|"}
SCRIPT = re.compile(r"(?:infra|scripts|bench)/[\w./-]+\.(?:py|sh)")  # a script of the repo
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|YYYY|\$|/path/to/|^\{.*\}$")


# The Makefile: each target's prerequisites and recipe.

@cache
def rules() -> dict[str, tuple[list[str], list[str]]]:
    out: dict[str, tuple[list[str], list[str]]] = {}
    lines = MAKEFILE.replace("\\\n", " ").split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"^([a-z][\w.-]*):(?!=)(.*)$", line)
        if not m:
            continue
        recipe = []
        for body in lines[i + 1:]:
            if not body.startswith("\t"):
                break
            recipe.append(body.strip())
        prereqs = [w for w in m.group(2).split() if w != "|" and not w.startswith("$")]
        out[m.group(1)] = (prereqs, recipe)
    return out


def closure(targets: set[str]) -> set[str]:
    """The targets and every target they make: their prerequisites and `$(MAKE) <target>`."""
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        target = todo.pop()
        if target in seen or target not in rules():
            continue
        seen.add(target)
        prereqs, recipe = rules()[target]
        todo += prereqs
        for line in recipe:
            for call in re.findall(r"\$\(MAKE\)((?:\s+[-\w=.]+)+)", line):
                todo += [w for w in call.split() if w in rules()]
    return seen


@dataclass(frozen=True)
class Program:
    kind: str  # "module", "script" or "tool"
    name: str
    sub: str | None = None  # a script's subcommand (`up`, `down`)
    words: tuple[str, ...] = ()  # a tool's words (`dagster asset materialize ...`)


def recipe_programs(target: str) -> list[Program]:
    """The programs a target's own recipe runs: Python modules and scripts, `.venv/bin` tools
    (shell utilities, `make` and variables aside)."""
    out = []
    for line in rules()[target][1]:
        line = line.lstrip("@-")
        for piece in re.split(r"&&|\|\||;", line):
            ws = [w for w in piece.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
            if not ws:
                continue
            if ws[0] == "$(PY)" and len(ws) > 2 and ws[1] == "-m":
                out.append(Program("module", ws[2]))
            elif (ws[0] == "$(PY)" and len(ws) > 1) or re.fullmatch(r"infra/\S+\.(py|sh)", ws[0]):
                script = ws[1] if ws[0] == "$(PY)" else ws[0]
                rest = ws[2:] if ws[0] == "$(PY)" else ws[1:]
                sub = rest[0] if rest and re.fullmatch(r"[a-z][\w-]*", rest[0]) else None
                out.append(Program("script", script, sub))
            elif ws[0].startswith("$(VENV)/bin/"):
                tool = [ws[0].rsplit("/", 1)[1], *(w for w in ws[1:] if "$" not in w
                                                   and re.fullmatch(r"[-\w.]+", w))]
                out.append(Program("tool", tool[0], words=tuple(tool)))
    return out


def recipe_words(targets: set[str]) -> set[str]:
    return {w for t in targets for line in rules()[t][1]
            for w in re.findall(r"-{0,2}[\w.][\w./-]*", line)}


# A test's file, the helpers it imports and the conftest fixtures it asks for.

@dataclass
class Pool:
    literals: list[str] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)  # names called (functions and methods)
    makes: set[str] = field(default_factory=set)  # targets run by `make` (no dry run)
    lines: list[str] = field(default_factory=list)  # run through `bash -c` or `shell=True`
    scripts: set[tuple[str, str]] = field(default_factory=set)  # (script, argument) run
    loaded: set[str] = field(default_factory=set)  # scripts loaded by infra_module

    def record(self, make: bool, scripts: set[str], args: list[str]) -> None:
        """A command line: `make` or scripts with these arguments (none of them dry runs)."""
        if {"-n", "--dry-run", "--just-print"} & set(args):
            return
        if make:
            self.makes |= set(args) & set(rules())
        self.scripts |= {(s, a) for s in scripts for a in args}

    @property
    def tokens(self) -> set[str]:
        return {t for lit in self.literals for t in (lit, *words(lit))}

    def holds(self, word: str) -> bool:
        tokens = self.tokens
        return (word in tokens or any(t.endswith("/" + word) for t in tokens)
                or (("/" in word or "." in word) and any(word in lit for lit in self.literals)))


def docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def module_path(name: str) -> Path | None:
    """A test module (tests/, its tiers) or a testkit module, by its import name."""
    if name.startswith("testkit."):
        path = REPO / (name.replace(".", "/") + ".py")
        return path if path.exists() else None
    for folder in ("tests", "tests/unit", "tests/spark", "tests/e2e", "tests/alerts"):
        path = REPO / folder / f"{name}.py"
        if path.exists():
            return path
    return None


def definitions(tree: ast.Module) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node
    return out


def used(tree: ast.Module, names: set[str]) -> list[ast.AST]:
    """The top-level definitions `names` and those they use by name, transitively."""
    defs = definitions(tree)
    seen, todo, out = set(), list(names), []
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        out.append(defs[name])
        todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)]
    return out


def fixture_names(node: ast.AST) -> set[str]:
    return {a.arg for f in ast.walk(node) if isinstance(f, ast.FunctionDef)
            for a in f.args.args}


@cache
def pool_of(path: Path) -> Pool:
    tree = parsed(path)
    nodes: list[tuple[ast.Module, ast.AST]] = [(tree, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (src := module_path(node.module)):
            nodes += [(parsed(src), d) for d in used(parsed(src), {a.name for a in node.names})]
    conftest = parsed(REPO / "tests/conftest.py")
    fixtures = {n.name for n in conftest.body if isinstance(n, ast.FunctionDef)
                and any("fixture" in ast.unparse(d) for d in n.decorator_list)}
    asked, todo = set(), fixture_names(tree) & fixtures
    while todo:
        name = todo.pop()
        asked.add(name)
        todo |= (fixture_names(definitions(conftest)[name]) & fixtures) - asked
    nodes += [(conftest, d) for d in used(conftest, asked)]

    out = Pool()
    bound: dict[str, list[ast.expr]] = {}  # a name's assigned expressions
    enclosing: dict[int, ast.FunctionDef] = {}  # a node's innermost function
    for _, root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.FunctionDef):
                enclosing.update({id(n): node for n in ast.walk(node)})

    held: dict[str, list[str]] = {}  # the strings a name holds, once worked out

    def strings(expr: ast.AST) -> list[str]:
        """The strings an expression holds, also through the names it uses."""
        out = [n.value for n in ast.walk(expr)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        for name in {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}:
            if name not in held:
                held[name] = []  # a name used in its own value holds nothing more
                held[name] = [s for v in bound.get(name, []) for s in strings(v)]
            out += held[name]
        return out

    def parameters(node: ast.AST) -> set[str]:
        f = enclosing.get(id(node))
        return {a.arg for a in f.args.args} | ({f.args.vararg.arg} if f and f.args.vararg
                                                else set()) if f else set()

    # Functions that run make, scripts or a command line with their own arguments.
    helpers: dict[str, tuple[bool, set[str], bool]] = {}
    for module, root in nodes:
        skip = docstrings(module)
        for node in ast.walk(root):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in skip:
                out.literals.append(node.value)
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                out.calls.add(name)
                if name == "infra_module" and node.args and isinstance(node.args[0], ast.Constant):
                    out.literals.append(f"infra/{node.args[0].value}")
                    out.loaded.add(f"infra/{node.args[0].value}")
                if node.args and any(k.arg == "shell" and getattr(k.value, "value", False)
                                     for k in node.keywords):
                    out.lines += strings(node.args[0])
            elements = (node.elts if isinstance(node, (ast.List, ast.Tuple))
                        else node.args if isinstance(node, ast.Call) else None)
            if not elements:
                continue
            consts = [e.value if isinstance(e, ast.Constant) else None for e in elements]
            source = " ".join(s for e in elements for s in [ast.unparse(e), *strings(e)])
            make, scripts = any(is_make(e) for e in elements), set(SCRIPT.findall(source))
            out.record(make, scripts, [c for c in consts if isinstance(c, str)])
            shell = False
            for i in range(len(elements) - 2):  # bash -c <line>
                if consts[i] in ("bash", "sh") and consts[i + 1] == "-c":
                    out.lines += strings(elements[i + 2])
                    shell |= bool({n.id for n in ast.walk(elements[i + 2])
                                   if isinstance(n, ast.Name)} & parameters(node))
            passed_on = any(isinstance(e, ast.Starred) and not SCRIPT.search(
                " ".join(strings(e.value))) for e in elements)
            if ((make or scripts) and passed_on) or shell:
                helpers[enclosing[id(node)].name] = (make, scripts, shell)
    for _, root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in helpers:
                make, scripts, shell = helpers[node.func.id]
                out.record(make, scripts, [a.value for a in node.args
                                           if isinstance(a, ast.Constant)])
                out.lines += [s for a in node.args for s in strings(a)] if shell else []
    for line in out.lines:  # the command lines run through a shell
        ws = [w for w in words(line) if not re.fullmatch(r"[A-Z_]+=.*", w)]
        out.record(ws[:1] == ["make"], set(), ws[1:])
    return out


def is_make(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Constant) and node.value == "make")
            or (isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "make"
                                                  for a in node.args)))


def reads_recipe(pool: Pool, target: str) -> bool:
    return (("Makefile" in pool.tokens or any(lit.endswith("/Makefile") for lit in pool.literals))
            and any(re.match(rf"^\^?{re.escape(target)}:", lit) for lit in pool.literals))


def runs_recipe(pool: Pool, target: str) -> bool:
    programs = recipe_programs(target)

    def shown(p: Program) -> bool:
        if p.kind == "module":
            return p.name in pool.tokens  # `-m <module>`
        if p.kind == "script":  # run with its subcommand, or loaded and the method called
            return ((p.name, p.sub) in pool.scripts if p.sub
                    else any(p.name in lit for lit in pool.literals)) or (
                p.name in pool.loaded and (p.sub is None or p.sub in pool.calls))
        return all(pool.holds(w) for w in p.words)

    return bool(programs) and all(map(shown, programs))


def placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word))


def value_shown(pool: Pool, value: str) -> bool:
    for item in value.split(","):
        name = item.rsplit("/", 1)[-1]
        if not (any(item in lit for lit in pool.literals) or pool.holds(name)
                or pool.holds(name.rsplit(".", 1)[0])):
            return False
    return True


def unshown(command: str, entry: Run) -> list[str]:
    """What of `command` the entry's test does not show it runs (empty: it runs it)."""
    pool = pool_of(REPO / entry.test.split("::")[0])
    text = command
    for printed, used_instead in entry.instead:
        text = re.sub(rf"\b{re.escape(printed)}\b", used_instead, text)
    if any(" ".join(line.split()) == text for line in pool.lines):
        return []  # the command line as printed
    ws = [w.strip("[]") for w in words(text)]
    assignments = [w for w in ws if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]
    rest = [w for w in ws if w not in assignments and w not in OPERATORS]
    missing = []
    if rest and rest[0] == "make":
        target = next(w for w in rest[1:] if not w.startswith("-"))
        if not (target in closure(pool.makes) or reads_recipe(pool, target)
                or runs_recipe(pool, target)):
            programs = ", ".join(p.name for p in recipe_programs(target)) or "none"
            missing.append(f"runs neither `make {target}` (nor a target that makes it) nor its "
                           f"recipe's programs ({programs})")
    elif SCRIPT.fullmatch(rest[0]) and len(rest) > 1:  # a script and its subcommand
        if not ((rest[0], rest[1]) in pool.scripts
                or (rest[0] in pool.loaded and rest[1] in pool.calls)):
            missing.append(f"a run of {rest[0]} {rest[1]}")
    else:
        made = recipe_words(closure(pool.makes))
        missing += [f"the word {w!r}" for w in rest
                    if not placeholder(w) and not pool.holds(w) and w not in made]
    for assignment in assignments:
        name, value = assignment.split("=", 1)
        if not (pool.holds(name) or any(t.startswith(f"{name}=") for t in pool.tokens)):
            missing.append(f"the variable {name}")
        elif value and not placeholder(value) and not value_shown(pool, value):
            missing.append(f"{name}'s value {value!r}")
    return missing


# The tests.

def test_the_rule_takes_commands_and_leaves_names():
    assert is_command("make demo") and is_command("make materialize SELECT=a PARTITION=<date>")
    assert is_command("PIPELINES=examples/orders.yaml make observe-up")
    assert is_command(".venv/bin/mkdocs serve -a 127.0.0.1:8000")
    assert is_command("infra/spark/connect.py up")
    assert not is_command("make") and not is_command("dagster") and not is_command("SPARK_REMOTE")
    assert not is_command("PIPELINES=examples/orders.yaml")  # a setting, not a command
    assert not is_command("reconciled_aggregates") and not is_command("lakehouse_x > 0")


def test_fenced_blocks_give_a_command_a_line_and_python_examples(tmp_path, monkeypatch):
    import doc_commands

    page = tmp_path / "page.md"
    page.write_text("Run `make demo` or `make`.\n\n```bash\n$ make kafka-down   # the broker\n"
                    "make materialize SELECT=a \\\n  PARTITION=b\n# a comment\n```\n\n"
                    "```\nmake not-a-command  # an untagged block is output\n```\n\n"
                    "```python\nprint(1)\n```\n")
    monkeypatch.setattr(doc_commands, "REPO", tmp_path)
    found = [(c.line, c.text, c.kind) for c in page_commands(page)]
    assert found == [(1, "make demo", "shell"), (4, "make kafka-down", "shell"),
                     (6, "make materialize SELECT=a PARTITION=b", "shell"),
                     (14, "page.md python 1", "python")]
    assert untagged_commands(page) == [(11, "make not-a-command  # an untagged block is output")]


def test_every_documented_command_has_an_entry_and_every_entry_a_command():
    shown = documented()
    assert len({c.text for c in shown}) >= 90
    missing = [f"{c.page}:{c.line}: `{c.text}`" for c in shown if c.text not in COMMANDS]
    assert not missing, (
        "commands the docs show that tests/doc_commands.py's COMMANDS does not hold: add each "
        "with Run('<the test that runs it as printed>') or one of its REASONS:\n"
        + "\n".join(missing))
    stale = sorted(set(COMMANDS) - {c.text for c in shown})
    assert not stale, f"COMMANDS holds commands no page shows any more: remove them: {stale}"


def test_no_untagged_block_holds_commands():
    found = [f"{path.relative_to(REPO)}:{n}: {line}" for path in PAGES
             for n, line in untagged_commands(path)]
    assert not found, "fenced blocks without a tag holding commands: tag them bash\n" + \
        "\n".join(found)


def test_every_exclusion_is_a_reason_of_the_closed_set_that_fits_its_command():
    wrong = {cmd: why for cmd, why in COMMANDS.items() if not isinstance(why, Run)
             and (why not in REASONS or not re.search(REASON_FITS[why], cmd))}
    assert not wrong, f"exclusions that are not a reason of REASONS or do not fit: {wrong}"


@cache
def function_of(node_id: str) -> ast.FunctionDef | None:
    path, _, name = node_id.partition("::")
    if not (REPO / path).is_file():
        return None
    tree = parsed(REPO / path)
    for part in name.split("::")[:-1]:  # a class
        tree = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == part),
                    ast.Module(body=[], type_ignores=[]))
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef)
                 and n.name == name.split("::")[-1]), None)


def skips(function: ast.FunctionDef) -> bool:
    """A skip or xfail mark, or a call of pytest.skip, pytest.xfail or pytest.importorskip."""
    marks = " ".join(ast.unparse(d) for d in function.decorator_list)
    calls = {ast.unparse(n.func) for n in ast.walk(function) if isinstance(n, ast.Call)}
    return bool(re.search(r"\bmark\.(skip|skipif|xfail)\b", marks)
                or calls & {"pytest.skip", "pytest.xfail", "pytest.importorskip"})


def test_every_test_named_exists_and_is_never_skipped():
    tests = {e.test for e in COMMANDS.values() if isinstance(e, Run)}
    assert all(t.startswith("tests/") and "::test_" in t for t in tests), tests
    absent = sorted(t for t in tests if function_of(t) is None)
    assert not absent, f"COMMANDS names tests that do not exist: {absent}"
    skipped = sorted(t for t in tests if skips(function_of(t)))
    assert not skipped, f"tests named in COMMANDS that skip: {skipped}"


@pytest.mark.parametrize("command", [c for c, e in COMMANDS.items() if isinstance(e, Run)])
def test_the_test_named_runs_the_command(command):
    entry = COMMANDS[command]
    if " python " in command and not command.startswith(("python", "make")):  # an example
        pool = pool_of(REPO / entry.test.split("::")[0])
        page = command.rsplit(" python ", 1)[0]
        assert page in pool.literals and "python_blocks" in pool.calls, (
            f"{entry.test} does not run the examples of {page} (doc_commands.python_blocks)")
        return
    missing = unshown(command, entry)
    assert not missing, f"`{command}`: {entry.test} shows no sign of " + "; ".join(missing)


SAMPLE = """
import subprocess
import sys

from conftest import REPO

SCRIPT = str(REPO / "infra/prometheus/observe.py")
CATCH_UP = "make materialize SELECT=raw_events PARTITION=<date>"


def observe(*args):
    return subprocess.run([sys.executable, SCRIPT, *args])


def make(*args):
    return subprocess.run(["make", "--no-print-directory", *args], env={"PIPELINES": "x"})


def test_x():
    \"\"\"Runs `make stream` (a docstring runs nothing).\"\"\"
    observe("up")
    make("scorecard")
    make("-n", "down")
    subprocess.run(["bash", "-c", CATCH_UP.replace("<date>", "2026-12-01")])
    subprocess.run([str(REPO / ".venv/bin/dg"), "list", "defs"])
    recipe = open(REPO / "Makefile").read().split("\\nui:")[1]
    assert "make kafka-down" in recipe  # text it reads, not a command it runs
    assert "^ui:" and "examples/orders.yaml"
"""


def test_the_check_tells_a_test_that_runs_a_command_from_one_that_does_not(tmp_path):
    """The rules above on a sample test: a make target run directly or through a dependent
    target, a recipe's script with its subcommand, a command line run through bash, a tool's
    words, a recipe read from the Makefile; and what it does not run."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    ran = Run(f"{sample}::test_x")
    for command in ("make scorecard", "make setup", "make kafka-up", "make observe-up",
                    "make materialize SELECT=raw_events PARTITION=<date>",
                    "make materialize SELECT=... PARTITION=...", "dg list defs",
                    ".venv/bin/dg list defs", "make ui", "make ui PIPELINES=examples/orders.yaml"):
        assert unshown(command, ran) == [], command
    assert unshown("make observe-down", ran)[0].startswith("runs neither `make observe-down`")
    assert unshown("make down", ran) != []  # a dry run
    assert unshown("make kafka-down", ran) != []  # only in text it compares
    assert unshown("make stream", ran) != []  # only in a docstring
    assert unshown("dg list component-tree", ran) == ["the word 'component-tree'"]
    assert unshown("make materialize SELECT=bronze_events", ran) == [
        "SELECT's value 'bronze_events'"]
    assert unshown("make scorecard SCORECARD=orders/readiness_scorecard", ran) == [
        "the variable SCORECARD"]
    assert unshown("infra/prometheus/observe.py up", ran) == []
    assert unshown("infra/prometheus/observe.py down", ran) == [
        "a run of infra/prometheus/observe.py down"]
    assert unshown(".venv/bin/dg scaffold defs parcels shipments",
                   Run(ran.test, instead=(("shipments", "defs"),))) == [
        "the word 'scaffold'", "the word 'parcels'"]
    assert {"kafka-down", "registry-down"} <= closure({"clean"})
    assert {"setup", "kafka-up", "class-archive"} <= closure({"materialize"})


def test_the_suite_timings_command_prints_each_tiers_newest_file():
    """docs/testing.md's command, as printed: a line per tier naming its newest file."""
    command = ".venv/bin/python -m testkit.suite_timings"
    assert command in {c.text for c in page_commands(REPO / "docs/testing.md")}
    done = subprocess.run(words(command), cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    tiers = re.findall(r"^(\w+): \d+ s wall, .*\((bench/results/suite-\1-[\dT-]+\.json)\)$",
                       done.stdout, re.MULTILINE)
    assert {"test", "unit"} <= {t for t, _ in tiers}, done.stdout
    assert all((REPO / f).is_file() for _, f in tiers)
