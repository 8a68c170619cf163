"""How the service answers its ingest query's failure: restart it, when, and when to stop.

Every write of a batch is idempotent and the checkpoint holds the position, so a restart after
any failure loses and duplicates nothing; the question is only whether a restart can help.

- `transient`: the outside world is away — the broker (Kafka client timeouts, no broker
  answering), the schema registry unreachable, a Delta commit that lost a race with another
  writer, a storage or network I/O error. Restarted with exponential backoff (1 s doubling to
  BACKOFF_CAP_S) for as long as it lasts: an outage of hours is ridden out, visible all along
  (a line per attempt, `lakehouse_stream_retrying_seconds`, the LakehouseStreamRetrying alert).
- `restart`: Spark's known post-recovery error, a query thread that died silently, schema ids
  registered since the query started: restarted at once, at most MAX_RESTARTS times in a row.
- `unknown`: anything else. Restarted with backoff UNKNOWN_ATTEMPTS times in a row (a fault
  this list does not name yet gets its chance), then the pipeline stops with the error.
- `fatal`: what a human must decide — retention deleted records the stream had not read, the
  topic deleted or replaced, a spec or settings error. The pipeline stops at once, saying why.

A series of failures ends when the restarted query has run STABLE_S without failing, or
completed a batch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakehouse.config.settings import SettingsError
from spark_jobs.stream import (
    MAX_RESTARTS,
    DataLost,
    TopicReplaced,
    is_known_restart_bug,
    schemas_changed,
)

BACKOFF_START_S = 1.0
BACKOFF_CAP_S = 30.0
UNKNOWN_ATTEMPTS = 3
STABLE_S = 30.0

# Markers in an error's text (a StreamingQueryException carries its Java cause and stack) and
# their labels, fatal ones first: a fatal error's text may also hold a transient marker.
_FATAL = (
    (DataLost.__name__, "data_lost"),
    (TopicReplaced.__name__, "topic_replaced"),
    ("does not exist", "no_topic"),  # stream.check_topic: deleted under the service
    (SettingsError.__name__, "settings"),
    ("SpecError", "spec"),
)
_TRANSIENT = (
    ("unreachable", "registry"),  # schema_registry.RegistryError, a timeout or refusal
    ("answered HTTP 5", "registry"),
    ("org.apache.kafka.common.errors", "kafka"),
    ("KafkaOffsetReader", "kafka"),
    ("KafkaError", "kafka"),
    ("_TRANSPORT", "kafka"),
    ("_ALL_BROKERS_DOWN", "kafka"),
    ("_TIMED_OUT", "kafka"),
    ("TimeoutError", "timeout"),  # an admin call's future (the broker gone mid-call)
    ("TimeoutException", "timeout"),
    ("Concurrent", "delta_conflict"),  # ConcurrentAppendException and its siblings
    ("DELTA_CONCURRENT", "delta_conflict"),
    ("MetadataChangedException", "delta_conflict"),
    ("ProtocolChangedException", "delta_conflict"),
    ("No space left on device", "storage"),
    ("java.io.IOException", "storage"),
    ("SocketTimeoutException", "storage"),
    ("ConnectException", "storage"),
    ("Connection refused", "storage"),
)


@dataclass(frozen=True)
class Failure:
    kind: str  # transient, restart, unknown, fatal
    reason: str  # a short label (kafka, registry, delta_conflict, storage, data_lost, ...)
    message: str  # the error's first line, for the log


def first_line(exc: BaseException | str | None) -> str:
    text = str(exc or "").strip()
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), text)[:300]


_RAISED = re.compile(r"^\s*(?:[\w.$]+\.)?\w*(?:Error|Exception|Lost|Replaced|Changed)\b.*:")


def _message(text: str, marker: str | None) -> str:
    """The line that says what failed: the one holding the marker that classified it (an
    exception's line first: a Python traceback also quotes the source line that raised it,
    which may hold the marker too), else the last line naming an exception (a Python
    traceback's, inside Spark's wrapping), else the first."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if marker is not None:
        hits = [ln for ln in lines if marker in ln]
        hit = next((ln for ln in hits if _RAISED.match(ln)), hits[0] if hits else None)
        if hit is not None:
            return hit[:300]
    raised = [ln for ln in lines if _RAISED.match(ln)]
    return (raised[-1] if raised else first_line(text))[:300]


def classify(exc: BaseException | str | None, died_silently: bool = False) -> Failure:
    """What kind of failure `exc` is (None with `died_silently`: the query thread ended with no
    exception, a JVM error after its batch had committed)."""
    if exc is None and died_silently:
        return Failure("restart", "thread_died", "the query's thread ended with no exception")
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
    for marker, reason in _FATAL:
        if marker in text:
            return Failure("fatal", reason, _message(text, marker))
    if schemas_changed(text):
        return Failure("restart", "schemas_changed", _message(text, "SchemasChanged"))
    if is_known_restart_bug(text):
        return Failure("restart", "spark_restart_bug", _message(text, None))
    for marker, reason in _TRANSIENT:
        if marker in text:
            return Failure("transient", reason, _message(text, marker))
    return Failure("unknown", "unknown", _message(text, None))


class Retries:
    """One pipeline's series of failures: `failed` says how long to wait before the restart
    (None: stop), `due` whether that wait is over, `ran` ends the series once the query is
    stable again. `retrying_s` is how long the series has lasted (0 outside one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.since: float | None = None  # the series' first failure
        self.attempts = 0  # failures in the series
        self.in_a_row: dict[str, int] = {}  # per kind
        self.next_at = 0.0
        self.restarted_at: float | None = None

    def failed(self, failure: Failure) -> float | None:
        now = self.clock()
        if failure.kind == "fatal":
            return None
        if self.since is None:
            self.since = now
        self.attempts += 1
        count = self.in_a_row[failure.kind] = self.in_a_row.get(failure.kind, 0) + 1
        if failure.kind == "restart":
            if count > MAX_RESTARTS:
                return None
            delay = 0.0
        else:
            if failure.kind == "unknown" and count > UNKNOWN_ATTEMPTS:
                return None
            delay = min(BACKOFF_CAP_S, BACKOFF_START_S * 2 ** (count - 1))
        self.next_at = now + delay
        self.restarted_at = None
        return delay

    def due(self) -> bool:
        return self.clock() >= self.next_at

    def restarted(self) -> None:
        self.restarted_at = self.clock()

    @property
    def waiting(self) -> bool:
        """A failure is recorded and its restart not made yet."""
        return self.since is not None and self.restarted_at is None

    def ran(self, progressed: bool) -> bool:
        """The restarted query is active (`progressed`: it completed a batch since). Ends the
        series when it has run STABLE_S or progressed; True when it did."""
        if self.since is None or self.restarted_at is None:
            return False
        if progressed or self.clock() - self.restarted_at >= STABLE_S:
            self.since, self.attempts, self.in_a_row, self.restarted_at = None, 0, {}, None
            return True
        return False

    def retrying_s(self) -> float:
        return 0.0 if self.since is None else self.clock() - self.since
