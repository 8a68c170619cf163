"""Pipeline specs: a topic's events and what to aggregate, declared in YAML, not coded.

A spec declares the topic and its client options, the event's fields (`lakehouse.shape`: the id,
the event time and the forms it accepts, the group-by dimensions, the decimal measures) and the
window, watermark delay and correction horizon. It is validated before anything runs: an error
names the file and the field (`orders.yaml: measures[0].field: 'amout' is not a declared
field`), and a deployment's pipelines are checked side by side (names, table folders and asset
prefixes are each their own). Pure Python (pydantic + YAML): no Spark, no Dagster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from lakehouse.catalog import ALL_TABLES
from lakehouse.settings import Settings, SettingsError, parse_duration
from lakehouse.shape import DEFAULT_SHAPE, IDENT, STRICT, EventShape, Identifier


class SpecError(SettingsError):
    """A pipeline spec the pipeline cannot run; the message names the file and the field."""


# Folders the default pipeline keeps at the root (its tables, checkpoints, reports and local
# locks): no other pipeline's folder may take them.
ROOT_FOLDERS = frozenset({*(t.name for t in ALL_TABLES), "_checkpoints", "reports", "_locks"})
_SECRET_OPTION = re.compile(r"password|jaas|secret|token|key\.pem|\.key$", re.I)


def _duration(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except SettingsError:
            raise ValueError(f"{value!r} is not a duration ('30 seconds', '1 minute', "
                             "'7 days')") from None
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class KafkaSource(BaseModel):
    """The topic and its client options. Credentials never sit in a spec: `secret_env` maps an
    option to the environment variable that holds it (`sasl.password: ORDERS_SASL_PASSWORD`)."""

    model_config = STRICT
    topic: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
    options: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")]] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _no_secrets_inline(self) -> KafkaSource:
        for name in self.options:
            if _SECRET_OPTION.search(name):
                raise ValueError(f"options[{name!r}] holds a credential: name the environment "
                                 f"variable that holds it in secret_env instead")
        return self


class Windows(BaseModel):
    model_config = STRICT
    size: Duration = timedelta(minutes=1)
    watermark_delay: Duration = timedelta(seconds=30)
    correction_horizon: Duration = timedelta(days=7)

    @model_validator(mode="after")
    def _consistent(self) -> Windows:
        ms = int(self.size.total_seconds() * 1000)
        if ms <= 0 or (86_400_000 % ms):
            raise ValueError(f"size {self.size}: a window must be positive and divide a day "
                             "evenly (windows never straddle midnight)")
        if self.watermark_delay < timedelta(0):
            raise ValueError("watermark_delay: must not be negative")
        if self.correction_horizon < self.watermark_delay:
            raise ValueError(f"correction_horizon ({self.correction_horizon}) must be at least "
                             f"watermark_delay ({self.watermark_delay})")
        return self


class PipelineSpec(BaseModel):
    """One pipeline: a topic in, its aggregates out, in `<root>/<tables>/` under asset keys
    prefixed with `asset_prefix` (the default pipeline: the root itself, no prefix)."""

    model_config = STRICT
    name: Identifier
    source: KafkaSource
    shape: EventShape = DEFAULT_SHAPE
    windows: Windows = Windows()
    tables: str | None = None  # folder under LAKEHOUSE_ROOT; default: the name
    asset_prefix: str | None = None  # default: the name

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """YAML reads flat: `topic`, `event_id`, `dimensions`... at the top level."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        source = {k: data.pop(k) for k in ("topic", "kafka_options", "secret_env") if k in data}
        if source:
            data["source"] = {("options" if k == "kafka_options" else k): v
                              for k, v in source.items()}
        shape = {k: data.pop(k) for k in ("fields", "event_id", "event_time", "dimensions",
                                          "measures") if k in data}
        if shape:
            data["shape"] = shape
        if "window" in data:
            data["windows"] = data.pop("window")
        return data

    @model_validator(mode="after")
    def _folder(self) -> PipelineSpec:
        for label, value in (("tables", self.tables), ("asset_prefix", self.asset_prefix)):
            if value is not None and not IDENT.match(value):
                raise ValueError(f"{label} {value!r}: lower-case letters, digits and _")
        if self.folder in ROOT_FOLDERS:
            raise ValueError(f"tables {self.folder!r} is a folder the default pipeline uses")
        return self

    @property
    def folder(self) -> str:
        return self.tables or self.name

    @property
    def prefix(self) -> str:
        return self.asset_prefix or self.name

    def settings(self, base: Settings, env: Mapping[str, str]) -> Settings:
        """The pipeline's settings: the deployment's (brokers, root, Spark) with its topic,
        windows, folder and client options. A missing secret variable is a SpecError."""
        missing = [v for v in self.source.secret_env.values() if not env.get(v)]
        if missing:
            raise SpecError(f"pipeline {self.name!r}: secret_env names {missing}, not set in "
                            "the environment")
        options = {**base.kafka_options,
                   **{k: SecretStr(v) for k, v in self.source.options.items()},
                   **{k: SecretStr(env[v]) for k, v in self.source.secret_env.items()}}
        return base.model_copy(update={
            "events_topic": self.source.topic,
            "lakehouse_root": base.path(self.folder),
            "window_size": self.windows.size,
            "watermark_delay": self.windows.watermark_delay,
            "correction_horizon": self.windows.correction_horizon,
            "kafka_options": options,
            "pipeline": self.name,
            "shape": self.shape,
        })


# Model paths as the YAML spells them (it is flat: `topic`, `measures`, `window`).
_YAML_NAMES = {"source": None, "shape": None, "windows": "window", "options": "kafka_options"}


def _explain(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ""
        for part in err["loc"]:
            if isinstance(part, int):
                loc += f"[{part}]"
            elif (name := _YAML_NAMES.get(str(part), str(part))) is not None:
                loc += ("." if loc else "") + name
        cause = err.get("ctx", {}).get("error")
        msg = str(cause) if isinstance(cause, Exception) else err["msg"]
        if not loc and err["loc"] == ("source",):
            loc = "topic"  # the flat YAML's required key
        lines.append(f"{where}: {loc}: {msg}" if loc else f"{where}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, where: str = "spec") -> PipelineSpec:
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_explain(exc, where)) from None


def load_spec(path: str | Path) -> PipelineSpec:
    """A spec from a YAML file; errors name the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML ({exc})") from None
    return parse_spec(data, str(path))


def check_pipelines(specs: Iterable[PipelineSpec]) -> list[PipelineSpec]:
    """A deployment's pipelines side by side: names, folders and prefixes are their own."""
    specs = list(specs)
    for label, of in (("name", lambda s: s.name), ("table folder", lambda s: s.folder),
                      ("asset prefix", lambda s: s.prefix)):
        seen: dict[str, str] = {}
        for s in specs:
            if of(s) in seen:
                raise SpecError(f"pipelines {seen[of(s)]!r} and {s.name!r} have one {label} "
                                f"{of(s)!r}: each pipeline needs its own")
            seen[of(s)] = s.name
    return specs


def selected_pipeline(env: Mapping[str, str] | None = None
                      ) -> tuple[PipelineSpec | None, Settings]:
    """The pipeline a process runs (`make stream`, `make demo`): the spec file PIPELINE names
    and its settings, or (no PIPELINE) None and the default pipeline's settings."""
    env = os.environ if env is None else env
    base = Settings.from_env(env)
    path = env.get("PIPELINE", "").strip()
    if not path:
        return None, base
    spec = load_spec(path)
    return spec, spec.settings(base, env)


# The pipeline whose tables are LAKEHOUSE_ROOT itself (`Settings.pipeline`'s default).
DEFAULT_PIPELINE = "default"


def pipeline_specs(env: Mapping[str, str] | None = None) -> list[PipelineSpec]:
    """The specs PIPELINES names (comma-separated YAML paths, relative to the working directory),
    checked side by side with the default pipeline: a SpecError names the file and the field."""
    env = os.environ if env is None else env
    paths = [p.strip() for p in env.get("PIPELINES", "").split(",") if p.strip()]
    specs = [load_spec(path) for path in paths]
    for path, spec in zip(paths, specs, strict=True):
        if spec.name == DEFAULT_PIPELINE:
            raise SpecError(f"{path}: name: {DEFAULT_PIPELINE!r} is the pipeline of "
                            "LAKEHOUSE_ROOT itself (unprefixed assets): choose another name")
    try:
        check_pipelines([parse_spec({"name": DEFAULT_PIPELINE, "topic": "events"}), *specs])
    except SpecError as exc:
        raise SpecError(f"PIPELINES={env['PIPELINES']}: {exc}") from None
    return specs
