"""The bronze query's processed offsets, read from `stream_progress` with delta-rs: the newest
progress day that has a bronze batch, not the whole history."""

from datetime import UTC, date, datetime

import pyarrow as pa
from deltalake import write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.kafka.topic_status import processed_offsets


def progress(settings, day, query, batch, ends):
    write_deltalake(settings.table_path("stream_progress"), pa.table({
        "query": [query], "batch_id": pa.array([batch], pa.int64()),
        "batch_timestamp": pa.array([datetime(2026, 11, day, 8, tzinfo=UTC)],
                                    pa.timestamp("us", tz="UTC")),
        "end_offsets": [ends], "progress_date": pa.array([date(2026, 11, day)], pa.date32()),
    }), partition_by=["progress_date"], mode="append")


def test_newest_bronze_batch_wins_even_when_the_newest_day_has_none(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path))
    settings = Settings.from_env()
    assert processed_offsets(settings) == ({}, None)  # no table yet
    topic = settings.events_topic
    progress(settings, 20, "bronze", 1, f'{{"{topic}": {{"0": 5, "1": 7}}}}')
    progress(settings, 21, "bronze", 2, f'{{"{topic}": {{"0": 9, "1": 7}}}}')
    progress(settings, 22, "aggregates", 3, '{"logOffset": 4}')
    offsets, at = processed_offsets(settings)
    assert offsets == {0: 9, 1: 7}
    assert at == datetime(2026, 11, 21, 8, tzinfo=UTC)
