"""A reference consumer of the downstream feed (docs/feed.md): every committed message of a
topic, read with `read_committed`, and the fold of them by the consumer's rule."""

from __future__ import annotations

import json

from confluent_kafka import Consumer, KafkaError, TopicPartition

from lakehouse.config.settings import Settings
from lakehouse.kafka.admin import admin


def committed_messages(settings: Settings, topic: str, timeout: float = 10.0) -> list:
    """Every committed message of `topic` as (key, value or None), partition by partition in
    offset order (a window's messages are ordered: one key, one partition)."""
    consumer = Consumer({**settings.client_config, "group.id": "testkit-feed",
                         "enable.partition.eof": True, "isolation.level": "read_committed",
                         "log_level": 3})
    parts = admin(settings).list_topics(topic, timeout=timeout).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out, ends = [], set()
    try:
        while len(ends) < len(parts):
            msg = consumer.poll(timeout)
            assert msg is not None, f"{topic} not read to its end within {timeout} s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                ends.add(msg.partition())
                continue
            out.append((json.loads(msg.key()),
                        json.loads(msg.value()) if msg.value() is not None else None))
    finally:
        consumer.close()
    return out


def window_of(key: dict) -> str:
    """A window's identity as one value (the key's fields, sorted)."""
    return json.dumps(key, sort_keys=True)


def closed_windows(rows: list[dict]) -> dict[str, dict]:
    """Gold's rows (the default pipeline's, as `read(...).to_pylist()` gives them) that the feed
    carries, the closed ones, by the feed's record key (`window_of`)."""
    from datetime import UTC

    return {window_of({"window_start": r["window_start"].astimezone(UTC).isoformat()
                       .replace("+00:00", "Z"), "key": r["key"]}): r
            for r in rows if r["status"] != "open"}


def fold(messages: list) -> dict[str, dict]:
    """The consumer's rule: per window, a value only if its revision is higher than the last
    applied; a tombstone withdraws the window. Returns the windows held, by `window_of`."""
    state: dict[str, dict] = {}
    last: dict[str, int] = {}
    for key, value in messages:
        k = window_of(key)
        if value is None:
            state.pop(k, None)
        elif value["revision"] > last.get(k, -1):
            state[k], last[k] = value, value["revision"]
    return state
