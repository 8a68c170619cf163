"""Every result file the docs cite exists, and holds the figures cited from it.

The convention (docs/testing.md, "Citing a result file"), in README.md and docs/*.md:

- A reference is `bench/results/<name>.json`. A `<...>` part is a placeholder
  (`bench/results/cluster-<date>.json`) that must match at least one file; any other name must
  exist.
- A figure cited from a file is a bold number, optionally with a unit: `**12.1 s**`, `**0.92x**`,
  `**4,528**`. It is checked against the files cited by its unit: its table row, or the paragraph
  or list item it is in. A table row that cites no file takes the files cited by the paragraph
  right above its table (the table's caption). The number, written with the decimals it shows,
  must be one of the cited files' JSON values rounded to those decimals (7.5 matches 7.49,
  700 does not match 694).
- A bold figure in a unit that cites no file is an error, on every page (docs/changelog.md too).

No Spark, no broker: files only.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
REFERENCE = re.compile(r"bench/results/([\w.<>-]+\.json)")
FIGURE = re.compile(r"\*\*(\d[\d,]*(?:\.\d+)?)\s*(?:x|s|ms|%|MB|GB|/s)?\*\*")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def documents() -> dict[str, str]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {str(p.relative_to(REPO)): p.read_text() for p in paths}


def units(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, text) of each table row, paragraph and list item, outside code
    blocks; kind is `row`, `caption` (the paragraph or list item right above a table, blank
    lines between allowed) or `text`."""
    out: list[tuple[int, str, str]] = []
    block: list[str] = []
    start = 0
    fenced = False
    last = ""  # what came last, blank lines aside: "text", "row" or "other" (heading, code)

    def close():
        nonlocal last
        if block:
            out.append((start, "text", "\n".join(block)))
            block.clear()
            last = "text"

    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
            last = "other"
            continue
        if fenced:
            continue
        if stripped.startswith("|"):
            close()
            if last == "text":
                out[-1] = (out[-1][0], "caption", out[-1][2])
            out.append((number, "row", stripped))
            last = "row"
        elif not stripped:
            close()
        elif stripped.startswith("#"):
            close()
            last = "other"
        else:
            if re.match(r"([-*]|\d+\.) ", stripped):
                close()
            if not block:
                start = number
            block.append(line)
    close()
    return out


def resolve(name: str) -> list[Path]:
    """The files a reference names: itself, or every match of its placeholders."""
    if "<" not in name:
        return [RESULTS / name] if (RESULTS / name).is_file() else []
    pattern = re.escape(name)
    pattern = re.sub(r"<[^>]*>", ".+", pattern.replace(r"\<", "<").replace(r"\>", ">"))
    return sorted(p for p in RESULTS.glob("*.json") if re.fullmatch(pattern, p.name))


@cache
def values(path: Path) -> tuple[float, ...]:
    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            yield float(node)

    return tuple(walk(json.loads(path.read_text())))


def holds(figure: str, numbers: tuple[float, ...]) -> bool:
    """Whether a figure as written (`4,528`, `0.80`, `7.5`) is one of the numbers, rounded to
    the decimals it shows."""
    written = figure.replace(",", "")
    decimals = len(written.split(".")[1]) if "." in written else 0
    target = float(written)
    return any(abs(v - target) <= 0.5 * 10 ** -decimals + 1e-9 for v in numbers)


def problems(name: str, text: str) -> list[str]:
    """What is wrong with the citations of one document."""
    out = []
    caption_refs: list[str] = []
    for line, kind, unit in units(text):
        refs = REFERENCE.findall(unit)
        if kind == "caption":
            caption_refs = refs
        elif kind == "text":
            caption_refs = []
        files: list[Path] = []
        for ref in refs:
            found = resolve(ref)
            if not found:
                out.append(f"{name}:{line}: bench/results/{ref} does not exist")
            files += found
        if kind == "row" and not refs:
            files = [f for ref in caption_refs for f in resolve(ref)]
        figures = FIGURE.findall(CODE_SPAN.sub("", unit))
        if not figures:
            continue
        if not files:
            if not (kind == "row" and caption_refs):
                out += [f"{name}:{line}: **{f}** cites no result file" for f in figures]
            continue
        numbers = tuple(v for f in files for v in values(f))
        out += [f"{name}:{line}: **{f}** is in none of {', '.join(p.name for p in files)}"
                for f in figures if not holds(f, numbers)]
    return out


@pytest.mark.parametrize("name", sorted(documents()))
def test_cited_result_files_exist_and_hold_the_cited_figures(name):
    assert not problems(name, documents()[name])


def test_the_docs_cite_result_files():
    cited = {ref for text in documents().values() for ref in REFERENCE.findall(text)}
    assert len(cited) >= 10
    checked = sum(len(FIGURE.findall(CODE_SPAN.sub("", u))) for text in documents().values()
                  for _, _, u in units(text) if REFERENCE.search(u))
    assert checked >= 15, "the performance table's figures are checked"


def test_the_checker_catches_overwritten_and_missing_files():
    """The cases found in the README of 2026-11-27: figures of runs a later run of the same day
    overwrote, and a file that was never written."""
    wrong = [
        "The scenario took **700 s** (`bench/results/cluster-2026-11-23.json`).",
        "On 2026-11-24: **442 s** for the scenario (`bench/results/cluster-2026-11-24.json`).",
        "| 2026-11-25 | **245 s** | `bench/results/cluster-2026-11-25.json` |",
        "Timed the run path (`bench/results/run-path-2026-11-25.json`).",  # never written
        "An empty catch-up in **5 s**, no file named.",
    ]
    for text in wrong:
        assert problems("README.md", text), text
    right = [
        "The scenario took **694 s** (`bench/results/cluster-2026-11-23.json`).",
        "Windows: **4,528** (`bench/results/cluster-<date>.json`).",
        "| p95 | **7.5 s** | `bench/results/service-5000-2026-11-25.json` |",
        "Caption citing `bench/results/bench-2026-11-24.json`:\n\n| a | b |\n| --- | --- |\n"
        "| ratio | **0.92x** |",
    ]
    for text in right:
        assert not problems("README.md", text), text
