"""The service's answer to a failed ingest query (orchestration/service/retries.py): which
failures a restart can mend, the backoff between restarts, when a series of failures ends and
when the pipeline stops. The service riding out a real registry outage:
tests/e2e/test_schema_registry_e2e.py; a broker outage under load: `make drills` (broker)."""

import pytest

from orchestration.service.retries import (
    BACKOFF_CAP_S,
    STABLE_S,
    UNKNOWN_ATTEMPTS,
    Retries,
    classify,
)
from spark_jobs.stream import MAX_RESTARTS, DataLost, TopicReplaced

# Error texts as the service meets them (abridged from real runs).
KAFKA_SOURCE = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
                "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node "
                "assignment. Call: describeTopics\n\tat org.apache.spark.sql.kafka010."
                "KafkaOffsetReaderAdmin.fetchLatestOffsets")
RDKAFKA = "KafkaError{code=_TRANSPORT,val=-195,str=\"Failed to get metadata: Local: Broker transport failure\"}"
REGISTRY = ("schema registry http://127.0.0.1:8081 (subject orders-value) unreachable: timed out")
CONFLICT = ("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ConcurrentAppendException: Files were added "
            "to the root of the table by a concurrent update.")
DISK = "java.io.IOException: No space left on device"


@pytest.mark.parametrize(("error", "kind", "reason"), [
    (KAFKA_SOURCE, "transient", "kafka"),
    (RDKAFKA, "transient", "kafka"),
    (TimeoutError(), "transient", "timeout"),
    (REGISTRY, "transient", "registry"),
    (CONFLICT, "transient", "delta_conflict"),
    (DISK, "transient", "storage"),
    (DataLost("retention deleted offsets 0-99 of partition 0"), "fatal", "data_lost"),
    (TopicReplaced("topic events was re-created"), "fatal", "topic_replaced"),
    (RuntimeError("topic 'events' does not exist"), "fatal", "no_topic"),
    ("SchemasChanged: schema ids [3] were registered", "restart", "schemas_changed"),
    ('java.lang.NullPointerException: because the return value of "scala.Option.get()" is '
     "null", "restart", "spark_restart_bug"),
    (ZeroDivisionError("division by zero"), "unknown", "unknown"),
])
def test_each_failure_is_classified_by_what_a_restart_can_mend(error, kind, reason):
    failure = classify(error)
    assert (failure.kind, failure.reason) == (kind, reason)
    assert "\n" not in failure.message and len(failure.message) <= 300


def test_the_message_is_the_line_that_says_what_failed():
    wrapped = ("An exception was raised by the Python Proxy. Return Message: Traceback (most "
               "recent call last):\n  File \"stream.py\", line 3, in batch\n"
               f"lakehouse.events.schema_registry.RegistryError: {REGISTRY}\n")
    assert classify(wrapped).message == f"lakehouse.events.schema_registry.RegistryError: {REGISTRY}"
    # A real traceback quotes the raising source line, which holds the marker too.
    quoted = ("Traceback (most recent call last):\n  File \"schema_registry.py\", line 111, in "
              "_get\n    raise RegistryError(f\"{where} unreachable: {reason}\") from None\n"
              f"lakehouse.events.schema_registry.RegistryError: {REGISTRY}\n")
    assert classify(quoted).message == f"lakehouse.events.schema_registry.RegistryError: {REGISTRY}"
    bug = "Traceback (most recent call last):\n  File \"x.py\"\nZeroDivisionError: division by zero"
    assert classify(bug).message == "ZeroDivisionError: division by zero"


def test_a_fatal_error_wins_over_the_transient_text_it_carries():
    failure = classify(f"DataLost: records gone while {KAFKA_SOURCE}")
    assert failure.kind == "fatal"
    assert classify(None, died_silently=True).kind == "restart"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_transient_failures_back_off_to_the_cap_and_retry_without_limit():
    clock = Clock()
    retries = Retries(clock)
    delays = []
    for _ in range(12):  # an outage of several minutes
        delays.append(retries.failed(classify(KAFKA_SOURCE)))
        assert retries.waiting and not retries.due()
        clock.now += delays[-1]
        assert retries.due()
    assert delays[:6] == [1, 2, 4, 8, 16, BACKOFF_CAP_S] and set(delays[5:]) == {BACKOFF_CAP_S}
    assert retries.retrying_s() == sum(delays)
    # Back: the restarted query runs; the series ends at its first batch.
    retries.restarted()
    assert not retries.waiting and not retries.ran(progressed=False)
    assert retries.retrying_s() > 0  # still in the series: the alert's gauge goes on
    assert retries.ran(progressed=True) and retries.retrying_s() == 0
    assert retries.failed(classify(KAFKA_SOURCE)) == 1  # a new series starts from 1 s


def test_a_restarted_query_that_runs_stable_ends_the_series_without_a_batch():
    clock = Clock()
    retries = Retries(clock)
    retries.failed(classify(REGISTRY))
    retries.restarted()
    clock.now += STABLE_S - 1
    assert not retries.ran(progressed=False)
    clock.now += 1
    assert retries.ran(progressed=False) and retries.since is None


def test_an_unknown_error_gets_its_restarts_then_the_pipeline_stops():
    retries = Retries(Clock())
    failure = classify(ZeroDivisionError("division by zero"))
    assert [retries.failed(failure) for _ in range(UNKNOWN_ATTEMPTS)] == [1, 2, 4]
    assert retries.failed(failure) is None
    known = Retries(Clock())
    bug = classify(None, died_silently=True)
    assert [known.failed(bug) for _ in range(MAX_RESTARTS)] == [0] * MAX_RESTARTS
    assert known.failed(bug) is None
    assert Retries(Clock()).failed(classify(DataLost("gone"))) is None
