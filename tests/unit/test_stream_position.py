"""The stream's position is found however far back bronze's newest stream commit is: 150 other
commits after it (maintenance, repairs) do not send a new checkpoint back to the earliest
offsets."""

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from lakehouse.config.settings import Settings
from lakehouse.tables.commit_tags import StreamCommit, newest_stream_commit


def test_a_stream_commit_150_commits_back_is_found(tmp_path):
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    uri, options = settings.delta_rs("bronze_events")
    data = pa.table({"x": [1]})
    stamped = StreamCommit(version=-1, end_offsets={0: 41, 1: 7}, query="q", batch_id=3,
                           watermark_ms=1_000, next_watermark_ms=2_000, topic_id="t-1")
    write_deltalake(uri, data, storage_options=options, commit_properties=CommitProperties(
        custom_metadata={"userMetadata": stamped.metadata()}))
    for _ in range(150):
        write_deltalake(uri, data, mode="append", storage_options=options,
                        commit_properties=CommitProperties(
                            custom_metadata={"userMetadata": "maintenance"}))
    found = newest_stream_commit(settings)
    assert found is not None and found.version == 0
    assert found.end_offsets == {0: 41, 1: 7} and found.topic_id == "t-1"
    assert found.next_watermark_ms == 2_000
    assert newest_stream_commit(settings, version=0).version == 0
