"""The one typed configuration object, fed by environment variables (DESIGN §7).

Everything else receives a `Settings`; nothing reads `os.environ` for pipeline settings.
Bad values fail at load time with one message naming the variable and what it accepts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from lakehouse import storage

_UNITS = {
    "millisecond": 0.001, "ms": 0.001,
    "second": 1, "sec": 1, "s": 1,
    "minute": 60, "min": 60, "m": 60,
    "hour": 3600, "h": 3600,
    "day": 86400, "d": 86400,
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")

# Kafka client options passed through to Spark's reader and to confluent-kafka, e.g.
# KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol, KAFKA_SASL_MECHANISM -> sasl.mechanism.
_KAFKA_PASSTHROUGH = re.compile(r"^KAFKA_((?:SECURITY|SASL|SSL)_[A-Z0-9_]+|ISOLATION_LEVEL)$")
# librdkafka spells a few options differently from the Java client.
_JAVA_ONLY = {"sasl.jaas.config"}
_RDKAFKA_ONLY = {"sasl.username", "sasl.password"}
# Read by Spark's consumer only (the project's own offset reads ask for committed offsets).
_SPARK_ONLY = {"isolation.level"}


class SettingsError(ValueError):
    """A setting has a value the pipeline cannot use."""


def parse_duration(text: str, name: str = "duration") -> timedelta:
    """Parse Spark-style durations: '30 seconds', '1 minute', '7 days', '500 ms'."""
    m = _DURATION.match(str(text).lower())
    word = m.group(2) if m else ""
    unit = _UNITS.get(word) or (_UNITS.get(word[:-1]) if word.endswith("s") else None)
    if not m or unit is None:
        raise SettingsError(
            f"{name}={text!r} is not a duration: use '<integer> <unit>' with unit one of "
            "ms, seconds, minutes, hours, days (e.g. '30 seconds')"
        )
    return timedelta(seconds=int(m.group(1)) * unit)


def day_bounds(d: date) -> tuple[datetime, datetime]:
    """[start, end) of a UTC event date."""
    start = datetime.combine(d, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def spark_conf_key(suffix: str) -> str:
    """`SPARK_CONF_<suffix>` -> a Spark key: a suffix with a dot is taken as it is
    (`SPARK_CONF_spark.executor.extraJavaOptions`, set with `env`), else lower-cased with `_`
    as `.` (`SPARK_CONF_SPARK_EXECUTOR_MEMORY` -> `spark.executor.memory`)."""
    return suffix if "." in suffix else suffix.lower().replace("_", ".")


def utc(t: datetime | None) -> datetime | None:
    """A timestamp as Spark's `collect()` returns it (naive, in this Python process's local time
    zone, with `fold` set for a repeated hour) as an aware UTC datetime; aware ones are
    converted. Send only aware datetimes back to Spark: a naive one goes through `mktime`,
    which cannot tell the two occurrences of a repeated hour apart."""
    return None if t is None else t.astimezone(UTC)


def from_micros(us: int) -> datetime:
    """Epoch microseconds (Spark's `unix_micros`) as an aware UTC datetime, exactly."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def spark_interval(td: timedelta) -> str:
    """A timedelta as a Spark interval string ('90 seconds'), exact to the millisecond."""
    ms = int(td.total_seconds() * 1000)
    return f"{ms // 1000} seconds" if ms % 1000 == 0 else f"{ms} milliseconds"


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap_servers: str = "localhost:9092"
    events_topic: str = "events"
    # A local path or a URI (file://, s3a://bucket/prefix, abfss://, gs://): lakehouse.storage.
    lakehouse_root: str = "./.lakehouse"
    window_size: timedelta = timedelta(minutes=1)
    watermark_delay: timedelta = timedelta(seconds=30)
    correction_horizon: timedelta = timedelta(days=7)
    timestamp_policy: str = "event_time"
    spark_master: str = "local[*]"
    future_skew: timedelta = timedelta(minutes=5)
    max_event_bytes: int = 65536
    shuffle_partitions: int = 4
    max_offsets_per_trigger: int = 2_000_000
    # Records retention deleted before the stream read them: "fail" (refuse to start, naming the
    # ranges) or "skip_and_record" (record the ranges in `skipped_offsets`, go on from the
    # earliest retained offset; the dates they may belong to are never proven).
    on_data_loss: str = "fail"
    topic_partitions: int = 4
    topic_replication_factor: int = 0  # 0: 3 on a cluster of >= 3 brokers, else 1
    stream_trigger_interval: timedelta = timedelta(seconds=10)
    partitions_start_date: date = date(2025, 1, 1)  # LAKEHOUSE_START_DATE: no event before it
    # PARTITIONS_START: the first daily partition; None: the instance's first event date
    # (`assets.partitions.first_partition`).
    partitions_start: date | None = None
    spark_ui: bool = False
    # Set when SPARK_SHUFFLE_PARTITIONS is given; otherwise a cluster session sizes them from
    # its executors' cores.
    shuffle_partitions_explicit: bool = False
    spark_driver_host: str = "127.0.0.1"
    # Never in the repr: they may hold credentials (SASL password, JAAS line, keys).
    spark_conf_extra: Mapping[str, str] = field(default_factory=dict, repr=False)
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    # PostgreSQL URL of the writer locks on an object-store root (lakehouse.locks); may hold a
    # password.
    lock_url: str | None = field(default=None, repr=False)
    # Operations (Dagster schedules and freshness checks; cron in UTC).
    catch_up_cron: str = "*/5 * * * *"
    corrections_cron: str = "15 * * * *"
    verification_cron: str = "30 2 * * *"
    timeline_cron: str = "45 * * * *"
    maintenance_cron: str = "0 4 * * *"
    stream_freshness: timedelta = timedelta(minutes=15)
    reconciled_deadline_cron: str = "0 3 * * *"
    # `make stream` serves Prometheus metrics on 127.0.0.1:<metrics_port>/metrics.
    metrics_port: int = 9108
    # `make demo`: Dagster's event stream and Spark's output on the console (DEMO_VERBOSE=1).
    demo_verbose: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        d = cls()

        def get(name: str, default: str) -> str:
            value = env.get(name)
            return default if value is None or value.strip() == "" else value.strip()

        def positive_int(name: str, default: int) -> int:
            raw = get(name, str(default))
            if not raw.isdigit() or int(raw) <= 0:
                raise SettingsError(f"{name}={raw!r} must be a positive integer")
            return int(raw)

        def port(name: str, default: int) -> int:
            value = positive_int(name, default)
            if value > 65535:
                raise SettingsError(f"{name}='{value}' must be a TCP port (1-65535)")
            return value

        def cron(name: str, default: str) -> str:
            raw = get(name, default)
            if len(raw.split()) != 5:
                raise SettingsError(f"{name}={raw!r} must be a 5-field cron expression (UTC)")
            return raw

        on_data_loss = get("ON_DATA_LOSS", d.on_data_loss)
        if on_data_loss not in ("fail", "skip_and_record"):
            raise SettingsError(
                f"ON_DATA_LOSS={on_data_loss!r} must be 'fail' or 'skip_and_record'")
        policy = get("TIMESTAMP_POLICY", d.timestamp_policy)
        if policy not in ("event_time", "kafka_timestamp"):
            raise SettingsError(
                f"TIMESTAMP_POLICY={policy!r} must be 'event_time' or 'kafka_timestamp'"
            )
        window = parse_duration(get("WINDOW_SIZE", "1 minute"), "WINDOW_SIZE")
        if window.total_seconds() <= 0 or (86400 * 1000) % int(window.total_seconds() * 1000):
            raise SettingsError(
                f"WINDOW_SIZE={get('WINDOW_SIZE', '')!r} must be positive and divide a day "
                "evenly (windows never straddle midnight, so every window has one event_date)"
            )
        delay = parse_duration(get("WATERMARK_DELAY", "30 seconds"), "WATERMARK_DELAY")
        horizon = parse_duration(get("CORRECTION_HORIZON", "7 days"), "CORRECTION_HORIZON")
        if horizon < delay:
            raise SettingsError(
                f"CORRECTION_HORIZON ({horizon}) must be at least WATERMARK_DELAY ({delay})"
            )
        servers = get("KAFKA_BOOTSTRAP_SERVERS", d.kafka_bootstrap_servers)
        if not all(re.match(r"^[\w.\-\[\]:]+:\d+$", s.strip()) for s in servers.split(",")):
            raise SettingsError(
                f"KAFKA_BOOTSTRAP_SERVERS={servers!r} must be host:port[,host:port...]"
            )
        topic = get("EVENTS_TOPIC", d.events_topic)
        if not re.match(r"^[A-Za-z0-9._-]{1,249}$", topic):
            raise SettingsError(f"EVENTS_TOPIC={topic!r} is not a valid Kafka topic name")
        start = get("LAKEHOUSE_START_DATE", d.partitions_start_date.isoformat())
        try:
            start_date = date.fromisoformat(start)
        except ValueError as exc:
            raise SettingsError(f"LAKEHOUSE_START_DATE={start!r} must be YYYY-MM-DD") from exc
        first = get("PARTITIONS_START", "")
        try:
            partitions_start = date.fromisoformat(first) if first else None
        except ValueError as exc:
            raise SettingsError(f"PARTITIONS_START={first!r} must be YYYY-MM-DD (or unset: the "
                                "first event date)") from exc
        if partitions_start is not None and partitions_start < start_date:
            raise SettingsError(f"PARTITIONS_START={first} is before LAKEHOUSE_START_DATE="
                                f"{start_date}: no event before that date is accepted")
        kafka_options = {
            m.group(1).lower().replace("_", "."): value
            for name, value in env.items()
            if (m := _KAFKA_PASSTHROUGH.match(name))
        }
        return cls(
            kafka_bootstrap_servers=servers,
            events_topic=topic,
            lakehouse_root=get("LAKEHOUSE_ROOT", d.lakehouse_root),
            window_size=window,
            watermark_delay=delay,
            correction_horizon=horizon,
            timestamp_policy=policy,
            spark_master=get("SPARK_MASTER", d.spark_master),
            future_skew=parse_duration(get("FUTURE_SKEW", "5 minutes"), "FUTURE_SKEW"),
            max_event_bytes=positive_int("MAX_EVENT_BYTES", d.max_event_bytes),
            shuffle_partitions=positive_int(
                "SPARK_SHUFFLE_PARTITIONS", max(2, 2 * (os.cpu_count() or 2))
            ),
            topic_partitions=positive_int("TOPIC_PARTITIONS", d.topic_partitions),
            topic_replication_factor=(positive_int("TOPIC_REPLICATION_FACTOR", 1)
                                      if get("TOPIC_REPLICATION_FACTOR", "") else 0),
            max_offsets_per_trigger=positive_int(
                "MAX_OFFSETS_PER_TRIGGER", d.max_offsets_per_trigger
            ),
            on_data_loss=on_data_loss,
            stream_trigger_interval=parse_duration(
                get("STREAM_TRIGGER_INTERVAL", "10 seconds"), "STREAM_TRIGGER_INTERVAL"
            ),
            partitions_start_date=start_date,
            partitions_start=partitions_start,
            spark_ui=get("SPARK_UI", "false").lower() in ("1", "true", "yes"),
            shuffle_partitions_explicit=bool(get("SPARK_SHUFFLE_PARTITIONS", "")),
            spark_driver_host=get("SPARK_DRIVER_HOST", d.spark_driver_host),
            spark_conf_extra={
                spark_conf_key(name[len("SPARK_CONF_"):]): value
                for name, value in env.items() if name.startswith("SPARK_CONF_")
            },
            kafka_options=kafka_options,
            lock_url=get("LAKEHOUSE_LOCK_URL", "") or None,
            catch_up_cron=cron("CATCH_UP_CRON", d.catch_up_cron),
            corrections_cron=cron("CORRECTIONS_CRON", d.corrections_cron),
            verification_cron=cron("VERIFICATION_CRON", d.verification_cron),
            timeline_cron=cron("TIMELINE_CRON", d.timeline_cron),
            maintenance_cron=cron("MAINTENANCE_CRON", d.maintenance_cron),
            stream_freshness=parse_duration(get("STREAM_FRESHNESS", "15 minutes"), "STREAM_FRESHNESS"),
            reconciled_deadline_cron=cron("RECONCILED_DEADLINE_CRON", d.reconciled_deadline_cron),
            metrics_port=port("METRICS_PORT", d.metrics_port),
            demo_verbose=get("DEMO_VERBOSE", "false").lower() in ("1", "true", "yes"),
        )

    # ---- derived -------------------------------------------------------------------------
    def applicable_cutoff(self, d: date) -> datetime:
        """Latest broker append time at which an event of date `d` is still applied: the end
        of the date plus the correction horizon (corrections, replay and sensors share it)."""
        return day_bounds(d)[1] + self.correction_horizon

    def recent_dates(self, today: date) -> list[date]:
        """The dates the corrections schedule revisits on `today`: today and every date still
        within the correction horizon, newest first."""
        days = 1 + -(-self.correction_horizon // timedelta(days=1))
        return [today - timedelta(days=n) for n in range(days)]

    @property
    def root(self) -> str:
        """LAKEHOUSE_ROOT as a URI (absolute path for local disk); never a `Path`."""
        return storage.normalize_root(self.lakehouse_root)

    def path(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    def table_path(self, name: str) -> str:
        return self.path(name)

    def checkpoint_path(self, query: str) -> str:
        return self.path("_checkpoints", query)

    @property
    def local_root(self) -> Path | None:
        """The root on this machine's disk, None on an object store."""
        return storage.local_path(self.root)

    def delta_rs(self, name: str) -> tuple[str, dict[str, str]]:
        """(uri, storage_options) to open table `name` with delta-rs (no Spark)."""
        path = self.table_path(name)
        return storage.delta_rs_uri(path), storage.delta_rs_options(path)

    @property
    def spark_kafka_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source (`kafka.`-prefixed client configs)."""
        opts = {
            "kafka.bootstrap.servers": self.kafka_bootstrap_servers,
            # Spark's consumer asks for records past the end of the range it reads; the broker
            # holds such a fetch for fetch.max.wait.ms (500 ms by default) each time, most of a
            # small micro-batch's read.
            "kafka.fetch.max.wait.ms": "20",
            # Records of aborted transactions are never events (KAFKA_ISOLATION_LEVEL to change).
            "kafka.isolation.level": "read_committed",
        }
        opts.update(
            {f"kafka.{k}": v for k, v in self.kafka_options.items() if k not in _RDKAFKA_ONLY}
        )
        return opts

    @property
    def client_config(self) -> dict[str, str]:
        """Config for confluent-kafka producers, consumers and admin clients."""
        conf = {"bootstrap.servers": self.kafka_bootstrap_servers}
        conf.update({k: v for k, v in self.kafka_options.items()
                     if k not in _JAVA_ONLY and k not in _SPARK_ONLY})
        return conf
