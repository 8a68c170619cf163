"""The docs' python examples, run as printed on the end-to-end scenario's published instance
(conftest `scenario`: a date corrected by late events after its publication): docs/reading.md's
reads of the tables with delta-rs and polars, and docs/feed.md's reference consumer folding the
downstream feed beside its read of gold. The only substitutions are the settings' defaults the
examples print (LAKEHOUSE_ROOT `.lakehouse`, KAFKA_BOOTSTRAP_SERVERS `localhost:9092`, the feed
topic `events.reconciled` of EVENTS_TOPIC `events`), replaced by the instance's, and the
reading example's date, replaced by one of the instance's dates."""

from __future__ import annotations

import json

import polars as pl
from doc_commands import python_blocks

from lakehouse.tables.reads import read
from testkit.feed import closed_windows, window_of


def substituted(block: str, replacements: dict[str, str]) -> str:
    for printed, instead in replacements.items():
        assert printed in block, f"the example no longer shows {printed!r}:\n{block}"
        block = block.replace(printed, instead)
    return block


def run_examples(page: str, replacements: dict[str, dict[str, str]]) -> dict:
    """Every python block of `page`, in order, in one namespace; `replacements[i]`: the
    substitutions of block i (0-based). Returns the namespace."""
    blocks = python_blocks(page)
    assert blocks and len(blocks) == len(replacements), (page, len(blocks))
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(substituted(block, replacements[i]), f"{page} python {i + 1}", "exec"),
             namespace)
    return namespace


def test_the_python_examples_run_on_a_published_instance(scenario):
    settings, _, dates, _, _ = scenario
    root = str(settings.root)
    gold = read(settings, "reconciled_aggregates").to_pylist()
    changelog = read(settings, "late_corrections").num_rows
    d = dates[0]

    shown = run_examples("docs/reading.md", {0: {
        'root = ".lakehouse"': f"root = {root!r}",
        "date(2026, 11, 21)": f"date({d.year}, {d.month}, {d.day})"}})
    assert shown["day"].height == sum(1 for r in gold if r["event_date"] == d) > 0
    assert shown["day"].schema["value_sum"] == pl.Decimal(38, 6)
    assert shown["changelog"].height == changelog > 0  # the first date was corrected
    corrected = shown["corrections"]  # the change feed's corrected postimages
    assert corrected.height and min(corrected["revision"]) >= 1
    assert shown["next_start"] == shown["gold"].version() + 1
    assert shown["live"].num_rows == read(settings, "streaming_aggregates").num_rows > 0
    assert set(shown["filling"]["status"]) <= {"open"}

    fed = run_examples("docs/feed.md", {
        0: {'"localhost:9092"': repr(settings.kafka_bootstrap_servers),
            '"events.reconciled"': repr(settings.feed_topic)},
        1: {'".lakehouse': f'"{root}'}})
    fed["consumer"].close()
    closed = {k: r["revision"] for k, r in closed_windows(fed["gold"].to_pylist()).items()}
    held = {window_of(json.loads(k)): v["revision"] for k, v in fed["held"].items()}
    assert closed and held == closed  # the fold is gold's closed windows at their revisions
    assert len(fed["ends"]) == len(fed["parts"])  # every partition read to its end
