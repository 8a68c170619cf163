"""The stream's processed offsets are the end offsets stamped on bronze's newest stream commit:
current to the newest batch (not the every-30-s `stream_progress` rows), a commit made outside
the stream (maintenance) moving nothing."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.kafka.topic_status import processed_offsets
from lakehouse.tables.commit_tags import StreamCommit


def commit(settings, meta: str) -> None:
    uri, options = settings.delta_rs("bronze_events")
    write_deltalake(uri, pa.table({"x": [1]}), mode="append", storage_options=options,
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))


def test_the_newest_stamped_batch_is_the_position(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path))
    settings = Settings.from_env()
    assert processed_offsets(settings) == ({}, None)  # no bronze yet
    before = datetime.now(UTC) - timedelta(seconds=1)
    for batch, ends in enumerate(({0: 5, 1: 7}, {0: 9, 1: 7})):
        commit(settings, StreamCommit(-1, ends, query="q", batch_id=batch).metadata())
    commit(settings, "maintenance")
    offsets, at = processed_offsets(settings)
    assert offsets == {0: 9, 1: 7}
    assert at is not None and before <= at <= datetime.now(UTC)
