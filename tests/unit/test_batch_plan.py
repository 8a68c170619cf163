"""The ingest batch's plan (lakehouse.tables.batch_plan) on Delta logs written by delta-rs: where
a batch stands (first batch, next batch, a re-run whose bronze commit landed), the watermark it
judges by, the bronze version its dedup looks behind, and which of its commits already landed;
each table's log opened at most once."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.batch_plan import BatchPlan
from lakehouse.tables.commit_tags import StreamCommit, batch_tag, stream_commit_of


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(lakehouse_root=str(tmp_path / "lakehouse"))


def commit(settings: Settings, table: str, user_metadata: str) -> None:
    write_deltalake(settings.table_path(table), pa.table({"x": [1]}), mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": user_metadata}))


def stream_commit(settings: Settings, batch_id: int, watermark_ms: int, next_ms: int,
                  query: str = "q") -> None:
    meta = StreamCommit(version=-1, end_offsets={0: 10 * batch_id}, query=query,
                        batch_id=batch_id, watermark_ms=watermark_ms,
                        next_watermark_ms=next_ms).metadata()
    commit(settings, "bronze_events", meta)


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The tables whose logs are opened, in order."""
    seen: list[str] = []
    real = delta_log.open_table

    def counting(settings, name, *args, **kwargs):
        seen.append(name)
        return real(settings, name, *args, **kwargs)

    monkeypatch.setattr(delta_log, "open_table", counting)
    return seen


def test_the_first_batch_has_no_watermark_and_nothing_earlier(settings, opened):
    plan = BatchPlan.read(settings, "q", 0)
    assert (plan.done, plan.previous, plan.watermark_ms, plan.earlier_version, plan.published) == (
        None, None, 0, -1, False)
    assert opened == ["bronze_events"]  # a new batch published nothing: no aggregates log


def test_the_next_batch_judges_by_the_watermark_the_previous_one_left(settings, opened):
    stream_commit(settings, 0, 0, 5_000)
    commit(settings, "streaming_aggregates", batch_tag("q", 0))
    commit(settings, "bronze_events", "OPTIMIZE by maintenance")  # not a stream commit
    plan = BatchPlan.read(settings, "q", 1)
    assert plan.done is None
    assert (plan.previous.batch_id, plan.watermark_ms) == (0, 5_000)
    assert plan.earlier_version == 1  # bronze's newest version, maintenance commit included
    assert not plan.published
    assert opened == ["bronze_events"]


def test_a_rerun_batch_finds_its_own_commits_and_keeps_its_watermark(settings, opened):
    stream_commit(settings, 0, 0, 5_000)
    stream_commit(settings, 1, 5_000, 9_000)
    commit(settings, "streaming_aggregates", batch_tag("q", 1))
    commit(settings, "late_events", batch_tag("q", 1))
    plan = BatchPlan.read(settings, "q", 1)
    assert plan.done is not None and plan.previous is None
    # The watermark it used, not the one it left; dedup behind its own commit.
    assert (plan.watermark_ms, plan.earlier_version, plan.published) == (5_000, 0, True)
    assert plan.appended(settings, "late_events")
    assert not plan.appended(settings, "quarantined_events")
    # Asked twice, read once.
    assert plan.appended(settings, "late_events")
    assert sorted(opened) == ["bronze_events", "late_events", "quarantined_events",
                              "streaming_aggregates"]


def test_another_querys_batch_of_the_same_id_is_not_this_one(settings):
    stream_commit(settings, 3, 1_000, 2_000, query="old-checkpoint")
    commit(settings, "streaming_aggregates", batch_tag("old-checkpoint", 3))
    plan = BatchPlan.read(settings, "new-checkpoint", 3)
    assert plan.done is None and not plan.published
    assert plan.watermark_ms == 2_000


def test_a_batch_finds_its_bronze_commit_without_opening_the_table(settings, opened):
    """After its append, the batch's own stream commit among the commits since the plan's
    bronze version, read file by file (another writer's commits in between are skipped)."""
    stream_commit(settings, 0, 0, 5_000)
    before = delta_log.version(settings, "bronze_events")
    opened.clear()
    assert stream_commit_of(settings, "q", 1, before) is None
    commit(settings, "bronze_events", "lakehouse-redrive:2026-11-27:run-1")  # a redrive's append
    stream_commit(settings, 1, 5_000, 9_000, query="another-checkpoint")
    stream_commit(settings, 1, 5_000, 9_000)
    found = stream_commit_of(settings, "q", 1, before)
    assert (found.version, found.batch_id, found.watermark_ms, found.next_watermark_ms) == (
        before + 3, 1, 5_000, 9_000)
    assert found.end_offsets == {0: 10} and found.committed_at is not None
    assert stream_commit_of(settings, "q", 1, before + 3) is None  # only commits after `after`
    assert stream_commit_of(settings, "q", 0, before) is None
    assert opened == []
