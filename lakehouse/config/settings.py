"""The one typed configuration object, fed by environment variables (docs/design.md §9).

Everything else receives a `Settings`; nothing reads `os.environ` for pipeline settings. It is a
pydantic-settings model: each field names its variable (its alias), bad values fail at load time
with one message naming the variable and what it accepts, and values that may hold credentials
(`LAKEHOUSE_LOCK_URL`, the `KAFKA_SASL_*`/`KAFKA_SSL_*` and `SPARK_CONF_*` pass-throughs) are
`SecretStr`: masked in every repr, unwrapped only where a client is configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from lakehouse.config import connect_token, cron, storage
from lakehouse.events.shape import DEFAULT_SHAPE, EventShape
from lakehouse.tables.catalog import CHECKPOINTS_DIR

_UNITS = {
    "millisecond": 0.001, "ms": 0.001,
    "second": 1, "sec": 1, "s": 1,
    "minute": 60, "min": 60, "m": 60,
    "hour": 3600, "h": 3600,
    "day": 86400, "d": 86400,
}
_NOT_A_DURATION = ("is not a duration: use '<integer> <unit>' with unit one of ms, seconds, "
                   "minutes, hours, days (e.g. '30 seconds')")
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")

# Kafka client options passed through to Spark's reader and to confluent-kafka, e.g.
# KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol, KAFKA_SASL_MECHANISM -> sasl.mechanism.
_KAFKA_PASSTHROUGH = re.compile(r"^KAFKA_((?:SECURITY|SASL|SSL)_[A-Z0-9_]+|ISOLATION_LEVEL)$")
# librdkafka spells a few options differently from the Java client.
_JAVA_ONLY = {"sasl.jaas.config"}
_RDKAFKA_ONLY = {"sasl.username", "sasl.password"}
# Read by Spark's consumer only (the project's own offset reads ask for committed offsets).
_SPARK_ONLY = {"isolation.level"}
# The Kafka client options that hold credentials (a password, a JAAS line, a private key, an
# OAuth secret, token or config): the one list. A spec may not hold them inline (its secret_env
# names their variables), and a run may not send them to other brokers (assets.resources).
_CREDENTIAL_OPTION = re.compile(r"password|jaas|secret|token|oauthbearer\.config|key\.pem|\.key$",
                                re.I)


def is_credential(option: str) -> bool:
    """Whether Kafka client option `option` (`sasl.password`, `ssl.key.pem`...) holds a credential."""
    return bool(_CREDENTIAL_OPTION.search(option))


class SettingsError(ValueError):
    """A setting has a value the pipeline cannot use."""


def parse_duration(text: str, name: str = "duration") -> timedelta:
    """Parse Spark-style durations: '30 seconds', '1 minute', '7 days', '500 ms'."""
    m = _DURATION.match(str(text).lower())
    word = m.group(2) if m else ""
    unit = _UNITS.get(word) or (_UNITS.get(word[:-1]) if word.endswith("s") else None)
    if not m or unit is None:
        raise SettingsError(f"{name}={text!r} {_NOT_A_DURATION}")
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


class _Env(EnvSettingsSource):
    """The environment a `from_env` call was given (a mapping), not necessarily `os.environ`."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._env, self.case_sensitive, self.env_ignore_empty,
                              self.env_parse_none_str)


class _PassThrough(PydanticBaseSettingsSource):
    """`KAFKA_SECURITY_*`/`KAFKA_SASL_*`/`KAFKA_SSL_*`/`KAFKA_ISOLATION_LEVEL` and `SPARK_CONF_*`:
    families of variables, one option each, handed on to the clients as they are."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        kafka = {m.group(1).lower().replace("_", "."): v for k, v in self._env.items()
                 if (m := _KAFKA_PASSTHROUGH.match(k)) and v.strip()}
        spark = {spark_conf_key(k[len("SPARK_CONF_"):]): v for k, v in self._env.items()
                 if k.startswith("SPARK_CONF_") and v.strip()}
        return {"kafka_options": kafka, "spark_conf_extra": spark}


_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("settings_env", default=None)


def _duration(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse_duration(value)
    except SettingsError:
        raise ValueError(_NOT_A_DURATION) from None


def _positive(td: timedelta) -> timedelta:
    if td <= timedelta(0):
        raise ValueError("must be a positive duration")
    return td


def _divides_a_day(td: timedelta) -> timedelta:
    ms = int(td.total_seconds() * 1000)
    if ms <= 0 or (86400 * 1000) % ms:
        raise ValueError("must be positive and divide a day evenly (windows never straddle "
                         "midnight, so every window has one event_date)")
    return td


def check_horizon(watermark_delay: timedelta, correction_horizon: timedelta,
                  delay_name: str = "WATERMARK_DELAY",
                  horizon_name: str = "CORRECTION_HORIZON") -> None:
    """The correction horizon is at least the watermark delay (a late event is one the stream
    left to the corrections, which must still take it)."""
    if correction_horizon < watermark_delay:
        raise ValueError(f"{horizon_name} ({correction_horizon}) must be at least {delay_name} "
                         f"({watermark_delay})")


def _cron(text: str) -> str:
    cron.parse(text)  # a ValueError naming the bad field
    return text


def _servers(text: str) -> str:
    if not all(re.match(r"^[\w.\-\[\]:]+:\d+$", s.strip()) for s in text.split(",")):
        raise ValueError("must be host:port[,host:port...]")
    return text


TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's rule (also a spec's `topic`)


def _topic(text: str) -> str:
    if not TOPIC_NAME.match(text):
        raise ValueError("is not a valid Kafka topic name")
    return text


# An owner as Dagster takes one for an asset: an e-mail address or `team:<name>`.
_OWNER = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,7}|team:\S.*")


def is_owner(text: str) -> bool:
    """True for an owner Dagster's assets take: an e-mail address or `team:<name>`."""
    return bool(_OWNER.fullmatch(text))


_URL_TOKEN = re.compile(r"(;token=)[^;]*", re.I)


def remote_shown(url: str | None) -> str | None:
    """A Spark Connect URL as it may be printed: its `token` parameter masked."""
    return None if url is None else _URL_TOKEN.sub(r"\1***", url)


def _connect_url(text: str | None) -> str | None:
    if text is not None and not text.startswith("sc://"):
        raise ValueError("must be a Spark Connect URL: sc://host:port (e.g. sc://127.0.0.1:15002)")
    return text


def _iso_date(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise ValueError("must be YYYY-MM-DD") from None
    return value


IsoDate = Annotated[date, BeforeValidator(_iso_date)]
# The rules of a duration and of a window size, for the environment's settings and a pipeline
# spec's `window` alike.
Duration = Annotated[timedelta, BeforeValidator(_duration), AfterValidator(_positive)]
WindowSize = Annotated[Duration, AfterValidator(_divides_a_day)]
Cron = Annotated[str, AfterValidator(_cron)]
PositiveInt = Annotated[int, Field(gt=0)]


# The settings besides the event shape that change what the tables hold.
RESULTS_SETTINGS = ("window_size", "watermark_delay", "correction_horizon", "timestamp_policy",
                    "future_skew", "max_event_bytes", "partitions_start_date")


def _env(name: str, default: Any = None, **kw: Any) -> Any:
    """A field read from variable `name` (pydantic-settings matches the alias exactly)."""
    return Field(default, validation_alias=AliasChoices(name), **kw)


class Settings(BaseSettings):
    """The pipeline's settings. Build with `Settings.from_env()`; derive a variant in code with
    `settings.model_copy(update={...})` (tests) or, validated, `Settings.from_env({...})`."""

    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, env_ignore_empty=True,
                                      str_strip_whitespace=True, extra="ignore",
                                      populate_by_name=True)

    kafka_bootstrap_servers: Annotated[str, AfterValidator(_servers)] = _env(
        "KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    events_topic: Annotated[str, AfterValidator(_topic)] = _env("EVENTS_TOPIC", "events")
    # The downstream feed of gold's revisions (lakehouse.kafka.feed); unset: `feed_topic`'s
    # default, `<EVENTS_TOPIC>.reconciled` (a spec pipeline's: `<its topic>.reconciled`).
    reconciled_topic: Annotated[str, AfterValidator(_topic)] | None = _env("RECONCILED_TOPIC")
    # Who answers for the pipeline (a team or an address; several comma-separated): the readiness
    # scorecard's governance; those that are an e-mail address or `team:<name>` are its assets'
    # Dagster owners (`asset_owners`). A spec's `owners` replace it for its pipeline.
    pipeline_owner: str | None = _env("PIPELINE_OWNER")
    # A local path or a URI (file://, s3a://bucket/prefix, abfss://, gs://): lakehouse.config.storage.
    lakehouse_root: str = _env("LAKEHOUSE_ROOT", "./.lakehouse")
    window_size: WindowSize = _env(
        "WINDOW_SIZE", timedelta(minutes=1))
    watermark_delay: Duration = _env("WATERMARK_DELAY", timedelta(seconds=30))
    correction_horizon: Duration = _env("CORRECTION_HORIZON", timedelta(days=7))
    timestamp_policy: Literal["event_time", "kafka_timestamp"] = _env(
        "TIMESTAMP_POLICY", "event_time")
    spark_master: str = _env("SPARK_MASTER", "local[*]")
    future_skew: Duration = _env("FUTURE_SKEW", timedelta(minutes=5))
    max_event_bytes: PositiveInt = _env("MAX_EVENT_BYTES", 65536)
    # Sized for the machine (never Spark's 200). When SPARK_SHUFFLE_PARTITIONS is not given, a
    # cluster session sizes them from its executors' cores (`shuffle_partitions_explicit`).
    shuffle_partitions: PositiveInt = Field(
        default_factory=lambda: max(2, 2 * (os.cpu_count() or 2)),
        validation_alias=AliasChoices("SPARK_SHUFFLE_PARTITIONS"))
    max_offsets_per_trigger: PositiveInt = _env("MAX_OFFSETS_PER_TRIGGER", 2_000_000)
    # Records retention deleted before the stream read them: "fail" (refuse to start, naming the
    # ranges) or "skip_and_record" (record the ranges in `skipped_offsets`, go on from the
    # earliest retained offset; the dates they may belong to are never proven).
    on_data_loss: Literal["fail", "skip_and_record"] = _env("ON_DATA_LOSS", "fail")
    topic_partitions: PositiveInt = _env("TOPIC_PARTITIONS", 4)
    # Unset (0): 3 on a cluster of >= 3 brokers, else 1.
    topic_replication_factor: Annotated[int, Field(ge=0)] = _env("TOPIC_REPLICATION_FACTOR", 0)
    stream_trigger_interval: Duration = _env("STREAM_TRIGGER_INTERVAL", timedelta(seconds=10))
    # LAKEHOUSE_START_DATE: no event before it is accepted.
    partitions_start_date: IsoDate = _env("LAKEHOUSE_START_DATE", date(2025, 1, 1))
    # PARTITIONS_START: the first daily partition; None: the instance's first event date
    # (`assets.partitions.first_partition`).
    partitions_start: IsoDate | None = _env("PARTITIONS_START")
    spark_ui: bool = _env("SPARK_UI", False)
    # A Dagster run in a process of its own whose input is at most this many records starts its
    # driver JVM compiling with C1 only (`spark_jobs.session.SHORT_RUN_JAVA_OPTIONS`): it halves
    # a 3,000-event reconcile, and costs ~40% on a 2M-event catch-up, where C2's code pays off.
    short_run_max_records: PositiveInt = _env("SHORT_RUN_MAX_RECORDS", 250_000)
    spark_driver_host: str = _env("SPARK_DRIVER_HOST", "127.0.0.1")
    # SPARK_REMOTE (Spark's own name): a Spark Connect endpoint (`sc://127.0.0.1:15002`, `make
    # spark-up`) that the daily runs use instead of a driver of their own; unset: classic. It
    # may carry `;token=...`: never in the repr (`remote_shown` masks the token).
    spark_remote: Annotated[str | None, AfterValidator(_connect_url)] = _env("SPARK_REMOTE",
                                                                               repr=False)
    # The state folder of the local Connect server (`make spark-up`, infra/spark/connect.py):
    # where its clients find its token (`spark_remote_url`); unset: the repo's .spark-connect.
    spark_connect_state_dir: str | None = _env("SPARK_CONNECT_STATE_DIR")
    # Pass-through families (`_PassThrough`); secret: SASL password, JAAS line, keys.
    spark_conf_extra: dict[str, SecretStr] = Field(default_factory=dict)
    kafka_options: dict[str, SecretStr] = Field(default_factory=dict)
    # PostgreSQL URL of the writer locks on an object-store root (lakehouse.tables.locks).
    lock_url: SecretStr | None = _env("LAKEHOUSE_LOCK_URL")
    # Operations (Dagster schedules and freshness checks; cron in UTC).
    catch_up_cron: Cron = _env("CATCH_UP_CRON", "*/5 * * * *")
    corrections_cron: Cron = _env("CORRECTIONS_CRON", "15 * * * *")
    verification_cron: Cron = _env("VERIFICATION_CRON", "30 2 * * *")
    timeline_cron: Cron = _env("TIMELINE_CRON", "45 * * * *")
    maintenance_cron: Cron = _env("MAINTENANCE_CRON", "0 4 * * *")
    stream_freshness: Duration = _env("STREAM_FRESHNESS", timedelta(minutes=15))
    reconciled_deadline_cron: Cron = _env("RECONCILED_DEADLINE_CRON", "0 3 * * *")
    # The service's SLO budgets (exported as `lakehouse_slo_budget_seconds`, compared against by
    # the alert rules of infra/prometheus/rules): a stream with lag and no batch for longer than
    # stall_after is stalled; lag and end-to-end latency over their budgets alert.
    stall_after: Duration = _env("STALL_AFTER", timedelta(minutes=5))
    lag_budget: Duration = _env("LAG_BUDGET", timedelta(minutes=5))
    latency_budget: Duration = _env("LATENCY_BUDGET", timedelta(minutes=2))
    # `make stream` serves Prometheus metrics on 127.0.0.1:<metrics_port>/metrics.
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = _env("METRICS_PORT", 9108)
    # `make daily-metrics` (and `make observe-up`'s exporter) serves the daily side's metrics on
    # 127.0.0.1:<daily_metrics_port>/metrics.
    daily_metrics_port: Annotated[int, Field(ge=1, le=65535)] = _env("DAILY_METRICS_PORT", 9109)
    # `make demo`: Dagster's event stream and Spark's output on the console (DEMO_VERBOSE=1).
    demo_verbose: bool = _env("DEMO_VERBOSE", False)
    # Which pipeline these settings run (never from a variable: `lakehouse.specs.pipeline` sets them for
    # a spec's pipeline); the default is the contract's.
    pipeline: str = Field("default", validation_alias=AliasChoices("_pipeline"))
    shape: EventShape = Field(DEFAULT_SHAPE, validation_alias=AliasChoices("_shape"))
    # Set while a new generation of the pipeline's tables is built under another spec version
    # (`lakehouse.tables.generations`): the pipeline's own folder; `lakehouse_root` is then
    # `<home>/_generations/<spec version>`, where that generation's tables, checkpoints and
    # locks live until it is switched in.
    home: str | None = Field(None, validation_alias=AliasChoices("_home"))

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        check_horizon(self.watermark_delay, self.correction_horizon)
        if self.partitions_start is not None and self.partitions_start < self.partitions_start_date:
            raise ValueError(f"PARTITIONS_START={self.partitions_start} is before "
                             f"LAKEHOUSE_START_DATE={self.partitions_start_date}: no event "
                             "before that date is accepted")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   **_: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _ENV.get()
        env = os.environ if env is None else env
        # No .env file and no secrets directory: the environment is the one source.
        return init_settings, _Env(settings_cls, env), _PassThrough(settings_cls, env)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from `env` (default: `os.environ`); a bad value raises `SettingsError`
        naming the variable, its value (never a secret's) and what it accepts."""
        token = _ENV.set(dict(os.environ if env is None else env))
        try:
            return cls()
        except ValidationError as exc:
            raise SettingsError(_explain(exc)) from None
        finally:
            _ENV.reset(token)

    @property
    def results_inputs(self) -> dict:
        """Every setting that changes what the tables hold (the event shape: fields, types, id
        and time rules, dimensions, measures; the window, delay and horizon; the timestamp
        policy, the skew and size limits, the start date), as JSON values: what
        `results_version` digests and the spec generations record."""
        # A JSON shape's digest leaves the input format out: as it was before Avro existed.
        # What no shape had before (the input format, nested paths) is left out where unused:
        # a flat JSON shape's digest is as it was.
        # A registry's spec version is its URL and subject, not what is registered under it
        # (fetched at each run); a file-based Avro spec's digest has no registry.
        unused: dict[str, Any] = {"format": True, "avro": True} if self.shape.format == "json" \
            else {}
        if self.shape.avro is not None:
            unused["avro"] = {"schemas": True} if self.shape.avro.registry else {"registry": True}
        if not self.shape.paths:
            unused["paths"] = True
        return {"shape": self.shape.model_dump(mode="json", exclude=unused),
                **{k: str(getattr(self, k)) for k in RESULTS_SETTINGS}}

    @property
    def results_version(self) -> str:
        """A digest of `results_inputs`: the pipeline's spec version. The assets'
        `code_version`: a date materialized under another one is stale."""
        return hashlib.sha256(json.dumps(self.results_inputs, sort_keys=True).encode()
                              ).hexdigest()[:12]

    @property
    def pipeline_root(self) -> str:
        """The pipeline's folder (its generations' registry lives there), whichever generation
        these settings write."""
        return storage.normalize_root(self.home or self.lakehouse_root)

    @property
    def shuffle_partitions_explicit(self) -> bool:
        """SPARK_SHUFFLE_PARTITIONS was given (else a cluster session sizes them itself)."""
        return "shuffle_partitions" in self.model_fields_set

    @property
    def spark_conf_overrides(self) -> dict[str, str]:
        """SPARK_CONF_* as Spark keys and plain values (for the session builder only)."""
        return {k: v.get_secret_value() for k, v in self.spark_conf_extra.items()}

    @property
    def spark_remote_url(self) -> str | None:
        """SPARK_REMOTE as the clients connect with it (for the session builder only: it may
        hold a token): naming the local Connect server (`sc://127.0.0.1:<port>`, no token of
        its own), host `localhost` and the token that server was started with, read from its
        state folder at each call; any other URL as given (`connect_token.with_local_token`)."""
        state = self.spark_connect_state_dir
        return connect_token.with_local_token(self.spark_remote, Path(state) if state else None)

    @property
    def lock_dsn(self) -> str | None:
        """LAKEHOUSE_LOCK_URL in clear (for the lock's database connection only)."""
        return None if self.lock_url is None else self.lock_url.get_secret_value()

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

    @property
    def asset_owners(self) -> list[str]:
        """PIPELINE_OWNER's entries (comma-separated) that Dagster takes as asset owners: an
        e-mail address or `team:<name>`; free text (a name, a channel) stays the scorecard's."""
        entries = [e.strip() for e in (self.pipeline_owner or "").split(",")]
        return [e for e in entries if e and is_owner(e)]

    @property
    def feed_topic(self) -> str:
        """The topic gold's revisions are published to (RECONCILED_TOPIC)."""
        return self.reconciled_topic or f"{self.events_topic}.reconciled"

    def checkpoint_path(self, query: str) -> str:
        return self.path(CHECKPOINTS_DIR, query)

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
            {f"kafka.{k}": v.get_secret_value() for k, v in self.kafka_options.items()
             if k not in _RDKAFKA_ONLY}
        )
        return opts

    @property
    def client_config(self) -> dict[str, str]:
        """Config for confluent-kafka producers, consumers and admin clients."""
        conf = {"bootstrap.servers": self.kafka_bootstrap_servers}
        conf.update({k: v.get_secret_value() for k, v in self.kafka_options.items()
                     if k not in _JAVA_ONLY and k not in _SPARK_ONLY})
        return conf


_SECRET_FIELDS = {"LAKEHOUSE_LOCK_URL", "kafka_options", "spark_conf_extra", "SPARK_REMOTE"}


def _explain(exc: ValidationError) -> str:
    """One line per bad variable: `NAME='value' <what it accepts>`."""
    lines = []
    for err in exc.errors(include_url=False):
        name = ".".join(str(p) for p in err["loc"])
        cause = err.get("ctx", {}).get("error")
        # Our validators' messages read on from the value; pydantic's own are sentences.
        reason = str(cause) if isinstance(cause, Exception) else f": {err['msg'][:1].lower()}{err['msg'][1:]}"
        if not name:
            lines.append(reason)
        elif name in _SECRET_FIELDS or name.startswith(tuple(_SECRET_FIELDS)):
            lines.append(f"{name} {reason}")
        else:
            lines.append(f"{name}={err['input']!r} {reason}".replace(" :", ":"))
    return "; ".join(lines)
