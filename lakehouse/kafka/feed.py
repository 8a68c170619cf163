"""The downstream feed: every revision of a reconciled window, published once to Kafka.

Gold (`reconciled_aggregates`) keeps its Change Data Feed; `publish` reads the commits the topic
does not carry yet (delta-rs, no Spark) and sends each gold version as one Kafka transaction on
the feed topic (`Settings.feed_topic`, compacted, keyed by the window's identity), with a
progress record (the gold version) on the progress topic in the same transaction. A stable
transactional id per feed topic means a second publisher fences the first, and a publisher that
died between its produce and its commit leaves an open transaction the next one aborts: a
`read_committed` consumer sees every version once, or not yet.

What a message is (docs/design.md §5b): key `{"window_start": ..., "<dimension>": ...}`; value
the window's measures (decimals as strings), `revision`, `status`, `gold_version` and `before`
(the measures of the revision it replaces, null for the first); a removed window is a tombstone
(null value). A window is published once it is closed (`final` or `corrected`): while it is
`open` its measures still change at the same revision, which a consumer applying only higher
revisions could not follow, so its first message is its first closed state.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin, ensure_topic
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import RECONCILED

# Not a measure a consumer reads: the proof's fingerprint of the window's event ids.
INTERNAL_MEASURES = ("event_fingerprint",)
COMPACTED = {"cleanup.policy": "compact"}
OPEN = "open"


class FeedFenced(RuntimeError):
    """Another publisher of the same feed topic started (its transactional id fenced this one)."""


class FeedChangesGone(RuntimeError):
    """Gold's change data for versions the topic does not carry yet is gone (a VACUUM)."""


@dataclass(frozen=True)
class FeedResult:
    """What one `publish` did: gold versions `first`..`last` sent (None: nothing new), the
    version the topic carries up to, its transactions, messages and tombstones, the changes of
    open windows it held back and the changes without a new revision it did not send."""

    topic: str
    first: int | None
    last: int | None
    published_version: int
    transactions: int
    messages: int
    tombstones: int
    withheld_open: int
    unrevised: int
    seconds: float

    def as_metadata(self) -> dict:
        return asdict(self)


def progress_topic(settings: Settings) -> str:
    return f"{settings.feed_topic}.progress"


def transactional_id(settings: Settings) -> str:
    """Stable per feed topic: one publisher at a time, whichever process runs it."""
    return f"lakehouse-feed-{settings.feed_topic}"


def ensure_feed_topics(settings: Settings) -> None:
    """The feed topic (compacted, the events topic's partition count) and its progress topic
    (compacted, one partition)."""
    ensure_topic(settings, settings.feed_topic, config=COMPACTED)
    ensure_topic(settings, progress_topic(settings), partitions=1, config=COMPACTED)


def published_version(settings: Settings, timeout: float = 30.0) -> int:
    """The newest gold version the feed carries (committed), -1 when none: the last progress
    record, read with `read_committed`."""
    topic = progress_topic(settings)
    if topic not in admin(settings).list_topics(timeout=timeout).topics:  # none sent yet
        return -1
    consumer = Consumer({**settings.client_config, "group.id": "lakehouse-feed-progress",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "log_level": 3})
    try:
        consumer.assign([TopicPartition(progress_topic(settings), 0, 0)])
        version, deadline = -1, time.monotonic() + timeout
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the feed's progress topic {progress_topic(settings)!r} "
                                       f"was not read to its end within {timeout:.0f} s")
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return version
                raise KafkaException(msg.error())
            if msg.value() is not None:
                version = int(json.loads(msg.value())["gold_version"])
    finally:
        consumer.close()


def unsent(settings: Settings) -> str | None:
    """Why gold's change data must stay (a VACUUM would delete change data the feed has not sent
    yet), or None when the feed carries gold's newest version."""
    if not delta_log.exists(settings, RECONCILED.name):
        return None
    gold = delta_log.version(settings, RECONCILED.name)
    try:
        sent = published_version(settings)
    except Exception as exc:  # noqa: BLE001 - the broker down, say so: keep the files
        return f"the downstream feed's progress could not be read ({exc}): gold's change data kept"
    if sent >= gold:
        return None
    return (f"the downstream feed {settings.feed_topic!r} carries gold up to version {sent} of "
            f"{gold}: a VACUUM could delete change data it has not sent; run reconcile_dates "
            "(its feed step) first")


def _text(value) -> object:
    """A value of a message: decimals as strings, times in ISO-8601 UTC, dates ISO."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _encode(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def messages(settings: Settings, rows: list[dict], version: int) -> tuple[list, int, int]:
    """The (key, value) messages of gold version `version`'s change rows (`load_cdf`'s), how
    many changes of open windows were held back, and how many changes of published windows
    came without a new revision (written outside the pipeline) and were not sent. A window
    updated to equal measures, revision and status (a rewrite) is no message."""
    shape = settings.shape
    identity = shape.window_id
    measures = [m for m in shape.measure_columns if m not in INTERNAL_MEASURES]
    compared = (*measures, "revision", "status")
    pre = {tuple(r[c] for c in identity): r for r in rows
           if r["_change_type"] == "update_preimage"}
    out, withheld, unrevised = [], 0, 0
    for r in rows:
        kind = r["_change_type"]
        if kind == "update_preimage":
            continue
        key = _encode({c: _text(r[c]) for c in identity})
        if kind == "delete":
            out.append((key, None))
            continue
        before = pre.get(tuple(r[c] for c in identity))
        if before is not None and all(before[c] == r[c] for c in compared):
            continue
        if r["status"] == OPEN:
            withheld += 1
            continue
        published_before = before is not None and before["status"] != OPEN
        if published_before and r["revision"] <= before["revision"]:
            # A change at the same revision (a write outside the pipeline): no consumer would
            # apply it, and the correction that repairs it comes with the next revision.
            unrevised += 1
            continue
        out.append((key, _encode({
            **{c: _text(r[c]) for c in identity if c != "window_start"},
            "window_start": _text(r["window_start"]),
            "window_end": _text(r["window_end"]),
            **{m: _text(r[m]) for m in measures},
            "revision": r["revision"],
            "status": r["status"],
            "gold_version": version,
            "before": ({m: _text(before[m]) for m in measures} if published_before else None),
        })))
    return out, withheld, unrevised


def _changes(settings: Settings, first: int, last: int) -> dict[int, list[dict]]:
    """Gold's change rows of versions `first`..`last`, by version."""
    table = delta_log.open_table(settings, RECONCILED.name)
    try:
        rows = pa.table(table.load_cdf(starting_version=first, ending_version=last).read_all()
                        ).to_pylist()
    except Exception as exc:  # delta-rs raises its own errors for missing change files
        raise FeedChangesGone(
            f"gold's change data for versions {first}..{last} could not be read ({exc}); the "
            f"feed topic {settings.feed_topic!r} carries gold up to version {first - 1}") from exc
    by_version: dict[int, list[dict]] = {}
    for r in rows:
        by_version.setdefault(int(r["_commit_version"]), []).append(r)
    return by_version


def _produce(producer, topic: str, key: bytes, value: bytes | None) -> None:
    """One message of a transaction; a full local queue (a large version: a reprocess of a big
    date) is drained to the broker first, inside the same transaction."""
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.5)


def publish(settings: Settings, producer_factory=Producer) -> FeedResult:
    """Send every gold version the feed does not carry yet, one transaction each (its messages
    and its progress record). Raises FeedFenced when another publisher took over meanwhile."""
    t0 = time.monotonic()
    topic = settings.feed_topic
    current = delta_log.version(settings, RECONCILED.name) if delta_log.exists(
        settings, RECONCILED.name) else -1
    ensure_feed_topics(settings)
    producer = producer_factory({**settings.client_config, "log_level": 3,
                                 "transactional.id": transactional_id(settings),
                                 "enable.idempotence": True, "linger.ms": 5})
    # Fences an older publisher of this topic and aborts a transaction it left open, so the
    # progress read next is the last one that committed.
    producer.init_transactions(60)
    done = published_version(settings)
    result = dict(topic=topic, first=None, last=None, published_version=done, transactions=0,
                  messages=0, tombstones=0, withheld_open=0, unrevised=0)
    if current <= done:
        return FeedResult(**result, seconds=round(time.monotonic() - t0, 3))
    by_version = _changes(settings, done + 1, current)
    # Versions without data changes (OPTIMIZE, VACUUM, a schema change) move the progress with
    # the next version that has some, or alone at the end.
    pending = sorted(by_version)
    if not pending or pending[-1] != current:
        pending.append(current)
    progress_key = _encode({"table": RECONCILED.name, "topic": topic})
    try:
        for v in pending:
            out, withheld, unrevised = messages(settings, by_version.get(v, []), v)
            producer.begin_transaction()
            for key, value in out:
                _produce(producer, topic, key, value)
            _produce(producer, progress_topic(settings), progress_key, _encode({
                "gold_version": v, "published_at": _text(datetime.now(UTC))}))
            producer.commit_transaction(60)
            result["first"] = v if result["first"] is None else result["first"]
            result.update(last=v, published_version=v,
                          transactions=result["transactions"] + 1,
                          messages=result["messages"] + len(out),
                          tombstones=result["tombstones"] + sum(1 for _, x in out if x is None),
                          withheld_open=result["withheld_open"] + withheld,
                          unrevised=result["unrevised"] + unrevised)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and (
                err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
                or (err.fatal() and "fenc" in err.str().lower())):
            raise FeedFenced(f"another publisher of {topic!r} (transactional id "
                             f"{transactional_id(settings)!r}) started: this one stopped after "
                             f"gold version {result['published_version']}") from exc
        raise
    finally:
        producer.flush(10)
    return FeedResult(**result, seconds=round(time.monotonic() - t0, 3))
