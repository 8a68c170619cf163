"""A Writer on an s3a:// root commits only through a session whose Delta log store for s3a is the
fenced one (spark_jobs.writer): a session started otherwise (a Connect server of another root,
a hand-made session) is refused before its first commit, naming the store it has and the one
it needs. Checked on the session's settings alone (no JVM)."""

import pytest

from lakehouse.tables import commit_log
from lakehouse.tables.locks import LockUnavailable
from spark_jobs import writer


class Session:
    """What the check reads of a SparkSession: its settings."""

    def __init__(self, conf: dict):
        self.conf = self
        self._conf = conf

    def get(self, key, default=None):
        return self._conf.get(key, default)


@pytest.mark.parametrize("store", [None, "io.delta.storage.S3SingleDriverLogStore"])
def test_a_session_without_the_fenced_store_is_refused_naming_both(store):
    session = Session({commit_log.SCHEME_KEY: store} if store else {})
    with pytest.raises(LockUnavailable) as refused:
        writer._require_fenced_store(session)
    assert commit_log.LOG_STORE_CLASS in str(refused.value)
    assert (store or "Delta default log store") in str(refused.value)


def test_a_session_with_the_fenced_store_passes_and_is_remembered():
    session = Session({commit_log.SCHEME_KEY: commit_log.LOG_STORE_CLASS})
    writer._require_fenced_store(session)
    session._conf.clear()  # checked once per session: not read again
    writer._require_fenced_store(session)
