"""Topic creation and offset look-ups with confluent-kafka's AdminClient (`create_topics`,
`list_offsets` with `OffsetSpec`: one batched request per spec for all partitions)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from lakehouse.config.settings import Settings
from lakehouse.kafka.topic_checks import created_retention, require_log_append_time

TOPIC_CONFIG = {
    # The broker stamps each record with its append time: monotonic per partition, so a replay
    # can find "everything ingested between T1 and T2" with offsets-for-times (docs/design.md §3).
    "message.timestamp.type": "LogAppendTime",
}


def topic_config(settings: Settings) -> dict[str, str]:
    """A new topic's configuration: LogAppendTime, and a retention above the correction
    horizon (`topic_checks.created_retention`)."""
    retention = created_retention(settings)
    return {**TOPIC_CONFIG, "retention.ms": str(int(retention.total_seconds() * 1000))}


_ADMINS: dict[tuple, AdminClient] = {}
_ADMINS_LOCK = threading.Lock()


def admin(settings: Settings) -> AdminClient:
    """The process's admin client for these settings, kept for reuse. Kept alive on purpose:
    a client that is garbage-collected fails its pending futures with `_DESTROY`, which is what
    `admin(settings).describe_configs(...)[r].result()` did with a throwaway client. Keyed by
    process id too: a librdkafka handle does not survive a fork."""
    conf = {**settings.client_config, "log_level": 3}
    key = (os.getpid(), tuple(sorted(conf.items())))
    with _ADMINS_LOCK:
        client = _ADMINS.get(key)
        if client is None:
            client = _authenticated(conf, settings)
            _ADMINS[key] = client
        return client


def forget_admins(bootstrap_servers: str) -> int:
    """Drop the kept admin clients of a cluster that is going away (a test's or a drill's own
    broker), so they stop reconnecting to it and logging about it. Returns how many."""
    with _ADMINS_LOCK:
        keys = [k for k in _ADMINS if ("bootstrap.servers", bootstrap_servers) in k[1]]
        for key in keys:
            del _ADMINS[key]
    return len(keys)


class KafkaAuthenticationFailed(RuntimeError):
    """The broker rejected the client's credentials (SASL) or TLS handshake."""


_AUTH_ERRORS = {KafkaError._AUTHENTICATION, KafkaError._SSL,
                KafkaError.SASL_AUTHENTICATION_FAILED}


def _authenticated(conf: dict, settings: Settings, timeout: float = 10.0) -> AdminClient:
    """A new admin client; with a secured protocol (SASL/SSL), first a metadata request that
    fails at once, naming authentication, when the broker rejects the credentials. librdkafka
    reports that only through `error_cb` and keeps reconnecting (a blocking call just times
    out as a "transport failure"), so such a client is closed instead of kept (no retry storm).
    The message names the user and mechanism, never the password."""
    if conf.get("security.protocol", "plaintext").lower() == "plaintext":
        return AdminClient(conf)
    rejected: list[str] = []

    def on_error(err) -> None:
        if err.code() in _AUTH_ERRORS and not rejected:
            rejected.append(err.str())

    client = AdminClient({**conf, "error_cb": on_error})
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.list_topics(timeout=1.0)
            return client
        except KafkaException:
            client.poll(0)  # serves error_cb
            if rejected or time.monotonic() > deadline:
                break
    if not rejected:  # not an authentication problem (a broker down?): the calls report it
        return client
    del client  # destroys the handle: no more reconnects with bad credentials
    raise KafkaAuthenticationFailed(
        f"Kafka authentication failed at {settings.kafka_bootstrap_servers} "
        f"(security.protocol={conf.get('security.protocol')}, "
        f"sasl.mechanism={conf.get('sasl.mechanism', '-')}, "
        f"user {conf.get('sasl.username', '-')!r}): {rejected[0]}. Check KAFKA_SASL_USERNAME "
        "and KAFKA_SASL_PASSWORD (KAFKA_SASL_JAAS_CONFIG for Spark) or the KAFKA_SSL_* settings.")


def ensure_topic(
    settings: Settings,
    topic: str | None = None,
    partitions: int | None = None,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> bool:
    """Create the topic (LogAppendTime) if missing; an existing one must use LogAppendTime
    (`TopicMisconfigured` otherwise). Returns True when it was created. Replication: 3 with
    `min.insync.replicas=2` on a cluster of three or more brokers, else 1, unless
    TOPIC_REPLICATION_FACTOR says otherwise."""
    topic = topic or settings.events_topic
    client = admin(settings)
    cluster = client.list_topics(timeout=timeout)
    if topic in cluster.topics:
        require_log_append_time(settings, topic, timeout)
        return False
    replicas = settings.topic_replication_factor or (3 if len(cluster.brokers) >= 3 else 1)
    durability = {"min.insync.replicas": str(min(2, replicas - 1))} if replicas >= 3 else {}
    futures = client.create_topics([NewTopic(
        topic, partitions or settings.topic_partitions, replicas,
        config={**topic_config(settings), **durability, **(config or {})})])
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
        # Created meanwhile (or not yet in this client's metadata): checked like any existing one.
        require_log_append_time(settings, topic, timeout)
        return False
    _wait_for_leaders(client, topic, timeout)
    return True


def topic_id(settings: Settings, topic: str | None = None, timeout: float = 10.0) -> str | None:
    """The topic's id (a new one each time a topic of that name is created), or None when it
    does not exist."""
    from confluent_kafka import TopicCollection

    topic = topic or settings.events_topic
    try:
        found = admin(settings).describe_topics(TopicCollection([topic]))[topic].result(timeout)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC" in str(exc):
            return None
        raise
    return str(found.topic_id)


def _wait_for_leaders(client: AdminClient, topic: str, timeout: float) -> None:
    """A new topic answers offset requests only once every partition has a leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta and meta.error is None and meta.partitions and all(
            p.leader >= 0 and p.error is None for p in meta.partitions.values()
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic!r} has partitions without a leader after {timeout}s")


# A fresh topic (or broker) reports these until leadership settles.
_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
    KafkaError._NOENT,  # list_offsets: "No leaders found" (asked only for existing topics)
    # list_offsets right after a topic's creation: the broker's leader epoch is not the one
    # the client's metadata has yet ("Leader epoch is newer than broker epoch").
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
}


def _retrying(call, attempts: int = 20, pause: float = 0.25):
    """Retry broker calls that fail with a retriable error (e.g. a leader election)."""
    for attempt in range(attempts):
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            transient = getattr(err, "retriable", lambda: False)() or (
                getattr(err, "code", lambda: None)() in _TRANSIENT
            )
            if attempt == attempts - 1 or not transient:
                raise
            time.sleep(pause)


@dataclass(frozen=True)
class PartitionOffsets:
    partition: int
    earliest: int
    latest: int


def consumer_lag(offsets: Iterable[PartitionOffsets], processed: Mapping[int, int]
                 ) -> dict[int, int]:
    """The one lag formula: records behind per partition, its end offset minus the stream's
    processed position; a partition the stream has not read yet counts from its earliest
    retained offset (where a new checkpoint starts, so retention never shows as lag)."""
    return {p.partition: max(0, p.latest - processed.get(p.partition, p.earliest))
            for p in sorted(offsets, key=lambda o: o.partition)}


# What the offset look-ups see: committed records only (what a consumer with librdkafka's default
# `isolation.level=read_committed` saw before; with the project's non-transactional producers
# it is the high watermark).
_ISOLATION = IsolationLevel.READ_COMMITTED


def _partitions(client: AdminClient, topic: str, timeout: float) -> list[int]:
    """The topic's partitions, [] when it does not exist (or its metadata has an error)."""
    meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None:
        return []
    return sorted(meta.partitions)


def _list_offsets(client: AdminClient, topic: str, specs: dict[str, OffsetSpec],
                  partitions: list[int], timeout: float) -> dict[str, dict[int, int]]:
    """One batched ListOffsets request per spec (all partitions at once), sent together:
    {spec name: {partition: offset}}; offset -1 when no record matches a timestamp spec."""

    def call():
        futures = {
            name: client.list_offsets(
                {TopicPartition(topic, p): spec for p in partitions},
                isolation_level=_ISOLATION, request_timeout=timeout,
            )
            for name, spec in specs.items()
        }
        return {
            name: {tp.partition: f.result(timeout).offset for tp, f in per_partition.items()}
            for name, per_partition in futures.items()
        }

    return _retrying(call)


def topic_offsets(settings: Settings, topic: str | None = None, timeout: float = 10.0):
    """Earliest and latest offsets per partition (empty list when the topic is missing)."""
    topic = topic or settings.events_topic
    client = admin(settings)
    partitions = _partitions(client, topic, timeout)
    if not partitions:
        return []
    found = _list_offsets(client, topic, {"earliest": OffsetSpec.earliest(),
                                          "latest": OffsetSpec.latest()}, partitions, timeout)
    return [PartitionOffsets(p, found["earliest"][p], found["latest"][p]) for p in partitions]


def offsets_for_time(
    settings: Settings, ts_ms: int, topic: str | None = None, timeout: float = 10.0,
    known: list[PartitionOffsets] | None = None,
) -> dict[int, int]:
    """First offset per partition whose (append) timestamp >= ts_ms; the end offset when none.
    `known`: the topic's offsets if the caller just read them (saves a broker round trip)."""
    topic = topic or settings.events_topic
    client = admin(settings)
    specs = {"at": OffsetSpec.for_timestamp(ts_ms)}
    if known is not None:
        partitions = [p.partition for p in known]
        ends = {p.partition: p.latest for p in known}
    else:
        partitions = _partitions(client, topic, timeout)
        specs["latest"] = OffsetSpec.latest()
    if not partitions:
        return {}
    found = _list_offsets(client, topic, specs, partitions, timeout)
    if known is None:
        ends = found["latest"]
    return {p: (o if o >= 0 else ends[p]) for p, o in found["at"].items()}
