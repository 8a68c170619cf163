"""The docs speak of the product, not of how it was made: no page of the site (docs/*.md) nor
README.md names an issue number, a done-when label or a numbered work period of its authors.
A user sees none of those; what changed for them is in docs/changelog.md. Files only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
# What a page may not say, each with why. "session" alone stays: a Spark, Connect or PostgreSQL
# session is the product's.
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s+#?\d+\b|(?<![\w&/#])#\d+\b", re.IGNORECASE),
    "a done-when label": re.compile(r"\bDW\d+\b|\bdone[- ]when\b", re.IGNORECASE),
    "a numbered work period": re.compile(
        rf"\b(?:{ORDINALS}|\d+(?:st|nd|rd|th))\s+(?:work\s+)?(?:session|round of work)s?\b"
        r"|\b(?:this|that|last|previous|next)\s+session\b|\bsessions?\s+\d+\b", re.IGNORECASE),
    "a diary phrase": re.compile(r"\bnothing beside (?:it|them)\b|\bthis round\b|\bby the hour\b",
                                 re.IGNORECASE),
}


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the words) for each forbidden mention in a page, outside fenced code."""
    out = []
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for what, pattern in FORBIDDEN.items():
            out += [(number, what, m.group(0)) for m in pattern.finditer(line)]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_names_issues_done_when_labels_or_work_periods(page):
    found = findings(page.read_text())
    assert not found, "\n".join(f"{page.relative_to(REPO)}:{n}: {what}: {words!r}"
                                for n, what, words in found)


def test_the_check_catches_the_diary_and_spares_the_product():
    caught = [
        "Issue 43 is blocked on the engine.",
        "as measured in issues #12 and #13",
        "See #63 for the plan.",
        "This meets DW2.",
        "the done-when of the knee target",
        "Done when: the test passes.",
        "measured in the eighth session",
        "the 13th session's log",
        "what this session changed",
        "a clean clone (nothing beside it)",
        "two runs, nothing beside them",
        "what was cut this round",
        "the machine's speed by the hour",
    ]
    for text in caught:
        assert findings(text), text
    spared = [
        "a session-held PostgreSQL advisory lock",
        "the SparkSession starts in 4 s; a Spark Connect session",
        "`SPARK_UI` serves the Spark UI of every session",
        "the tests' sessions keep C2",
        "an issue a restart can mend (say so in the issue that changes it)",
        "the [Known limits](limits.md#avro) section; the colour `#1f77b4`",
        "a first round of three, the third round's p95",
        "```\ngit log --grep 'issue 5'\n```",
    ]
    for text in spared:
        assert not findings(text), text
