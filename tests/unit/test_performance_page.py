"""docs/performance.md's generated regions are what `make report` (bench/report.py) writes from
the newest files in bench/results/ (testkit/perf_report.py), and the plots the page shows exist.
Files only."""

from __future__ import annotations

import re

import pytest

from testkit import perf_report as report


@pytest.mark.parametrize("path", list(report.PAGES), ids=lambda p: p.name)
def test_the_page_is_what_make_report_writes(path):
    assert report.page(path) == path.read_text(), (
        f"{path.relative_to(report.REPO)} differs from what bench/report.py writes from "
        "bench/results/: run `make report` (and do not edit between its <!-- generated --> "
        "markers)")
    regions = set(re.findall(r"<!-- generated: ([\w-]+) -->", path.read_text()))
    assert regions == set(report.PAGES[path]), regions


def test_the_page_has_generated_regions_and_shows_the_plots():
    text = report.PAGE.read_text()
    regions = set(re.findall(r"<!-- generated: ([\w-]+) -->", text))
    assert regions == set(report.REGIONS)
    images = re.findall(r"!\[[^\]]*\]\((images/[^)]+)\)", text)
    assert {f"images/{p.name}" for p in report.plots()} <= set(images)
    for path in report.plots():
        assert path.is_file() and path.stat().st_size > 0, f"{path}: run `make report`"


def test_the_newest_file_of_a_kind_is_the_latest_timestamp_in_its_name():
    names = [p.name for p in report.files("service-20000")]
    assert "service-20000-2026-11-25.json" in names
    assert not any("replay" in n or "before" in n for n in names)
    assert report.newest("suite-test") == report.files("suite-test")[-1]
    assert report.stamp(report.RESULTS / "bench-2026-11-24.json") < report.stamp(
        report.RESULTS / "bench-2026-11-29T121315.json")
