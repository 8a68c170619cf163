"""The docs state the product's truth, not how its authors organised the work: no page names
an issue number, a done-when label or a numbered or "this" work session (those belong in
commit messages)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|[0-9]+(?:st|nd|rd|th)")
WORK_LABELS = re.compile(
    rf"\bissues? #?[0-9]+|\bDW ?[0-9]+\b|\bdone-when\b|\b(?:{ORDINALS}) session\b|"
    r"\b(?:this|previous|last|next) session\b", re.IGNORECASE)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_no_page_names_an_issue_a_done_when_label_or_a_work_session():
    found = [f"{page.relative_to(REPO)}:{n}: {m.group(0)!r}"
             for page in pages()
             for n, line in enumerate(page.read_text().splitlines(), 1)
             for m in WORK_LABELS.finditer(line)]
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_of_label():
    for text in ("(issue 43)", "DW2 asks", "the eleventh session's A/B", "this session",
                 "done-when 3"):
        assert WORK_LABELS.search(text), text
    for text in ("a SparkSession start", "the session 7 s", "a session-held lock"):
        assert not WORK_LABELS.search(text), text
