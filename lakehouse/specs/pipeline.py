"""Pipeline specs: a topic's events and what to aggregate, declared in YAML, not coded.

A spec declares the topic and its client options, the event's fields (`lakehouse.events.shape`: the id,
the event time and the forms it accepts, the group-by dimensions, the decimal measures) and the
window, watermark delay and correction horizon. It is validated before anything runs: an error
names the file and the field (`orders.yaml: measures[0].field: 'amout' is not a declared
field`), and a deployment's pipelines are checked side by side (names, table folders and asset
prefixes are each their own), by one function for every entry point (`deployment_specs`: the
code location's PIPELINES, `make demo` and `make stream` with PIPELINE). Its durations follow the
settings' rules. Pure Python (pydantic + YAML): no Spark, no Dagster.
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
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from lakehouse.config.settings import (
    TOPIC_NAME,
    Duration,
    Settings,
    SettingsError,
    WindowSize,
    check_horizon,
    is_credential,
    is_owner,
    parse_duration,
)
from lakehouse.events.shape import DEFAULT_SHAPE, IDENT, STRICT, EventShape, Identifier
from lakehouse.tables.catalog import ROOT_FOLDERS
from lakehouse.tables.generations import resolve


class SpecError(SettingsError):
    """A pipeline spec the pipeline cannot run; the message names the file and the field."""


# Client options that choose where and how a client connects: a spec setting one of them talks
# to brokers of its own, so the deployment's credentials (KAFKA_SASL_*/KAFKA_SSL_*) never go with
# it; it brings its own (secret_env) or, where the deployment has credentials, is refused.
ROUTING_OPTIONS = ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.mechanisms")


def _deployment_auth(option: str) -> bool:
    """Whether a deployment option belongs to its brokers' authentication (and so stays with
    them): the security protocol and every SASL and SSL option."""
    return option == "security.protocol" or option.startswith(("sasl.", "ssl."))


def _duration(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except SettingsError:
            raise ValueError(f"{value!r} is not a duration ('30 seconds', '1 minute', "
                             "'7 days')") from None
    return value


# A spec's durations follow the settings' rules (`lakehouse.config.settings`: positive; a window size
# divides a day), read from the spec's text with a message that quotes it.
SpecDuration = Annotated[Duration, BeforeValidator(_duration)]
SpecWindowSize = Annotated[WindowSize, BeforeValidator(_duration)]


def _topic(value: Any) -> Any:
    if isinstance(value, str) and not TOPIC_NAME.match(value):
        raise ValueError(f"{value!r} is not a Kafka topic name: 1-249 letters, digits, '.', '_' "
                         "or '-'")
    return value


def _owner(value: Any) -> Any:
    if isinstance(value, str) and not is_owner(value.strip()):
        raise ValueError(f"{value!r} is not an owner: an e-mail address (billing@example.com) or "
                         "a team (team:billing)")
    return value.strip() if isinstance(value, str) else value


def _variable(value: Any) -> Any:
    if isinstance(value, str) and not re.match(r"^[A-Z_][A-Z0-9_]*$", value):
        raise ValueError(f"{value!r} is not an environment variable's name: upper-case letters, "
                         "digits and _ (ORDERS_SASL_PASSWORD)")
    return value


class KafkaSource(BaseModel):
    """The topic and its client options. Credentials never sit in a spec: `secret_env` maps an
    option to the environment variable that holds it (`sasl.password: ORDERS_SASL_PASSWORD`)."""

    model_config = STRICT
    topic: Annotated[str, AfterValidator(_topic)]
    options: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, Annotated[str, AfterValidator(_variable)]] = Field(
        default_factory=dict)

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        """Options as the clients take them, text: YAML's unquoted numbers and booleans are
        theirs (`fetch.min.bytes: 1024`, `enable.auto.commit: false`). Credentials are refused."""
        if not isinstance(value, Mapping):
            return value
        out = {}
        for name, v in value.items():
            if is_credential(str(name)):
                raise ValueError(f"{name!r} holds a credential: name the environment variable "
                                 f"that holds it in secret_env instead ({name}: ORDERS_SECRET)")
            if isinstance(v, bool):
                v = str(v).lower()
            elif isinstance(v, int | float):
                v = str(v)
            elif not isinstance(v, str):
                raise ValueError(f"{name!r}: {v!r} is not an option value: write a string, a "
                                 "number or true/false")
            out[name] = v
        return out


class Windows(BaseModel):
    model_config = STRICT
    size: SpecWindowSize = timedelta(minutes=1)
    watermark_delay: SpecDuration = timedelta(seconds=30)
    correction_horizon: SpecDuration = timedelta(days=7)

    @model_validator(mode="after")
    def _consistent(self) -> Windows:
        check_horizon(self.watermark_delay, self.correction_horizon, "watermark_delay",
                      "correction_horizon")
        return self


_CUT_DECIMAL = re.compile(r"^\s*decimal\s*\(\s*\d+\s*$", re.I)


def _split_decimals(fields: Any) -> None:
    """`{amount: decimal(10,2)}` is a YAML flow mapping, whose comma separates entries: YAML
    reads `amount: decimal(10` and a field `2)`. Said as such, with the fix."""
    if not isinstance(fields, Mapping):
        return
    for name, kind in fields.items():
        if isinstance(kind, str) and _CUT_DECIMAL.match(kind):
            raise ValueError(
                f"fields.{name}: {kind!r} is a decimal type cut at its comma: in a YAML flow "
                f"mapping ({{...}}) a comma separates entries; quote the type "
                f"({name}: 'decimal(p,s)') or declare the fields one per line")


# A spec's YAML is flat: these keys go to its source and its event shape (`PipelineSpec._flat`).
_SOURCE_KEYS = ("topic", "kafka_options", "secret_env")
_SHAPE_KEYS = ("fields", "event_id", "event_time", "dimensions", "measures", "format", "avro")


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
    # Who answers for it (e-mail addresses, `team:<name>`): its assets' Dagster owners and the
    # scorecard's governance; default: PIPELINE_OWNER's.
    owners: list[Annotated[str, AfterValidator(_owner)]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """YAML reads flat: `topic`, `event_id`, `dimensions`... at the top level."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        source = {k: data.pop(k) for k in _SOURCE_KEYS if k in data}
        if source:
            data["source"] = {("options" if k == "kafka_options" else k): v
                              for k, v in source.items()}
        shape = {k: data.pop(k) for k in _SHAPE_KEYS if k in data}
        _split_decimals(shape.get("fields"))
        avro, topic = shape.get("avro"), source.get("topic")
        if isinstance(avro, Mapping) and isinstance(avro.get("registry"), Mapping) and \
                "subject" not in avro["registry"] and isinstance(topic, str):
            # The Confluent serializers' default subject (TopicNameStrategy).
            shape["avro"] = {**avro, "registry": {**avro["registry"], "subject": f"{topic}-value"}}
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
        # The folders the default pipeline writes at the root (lakehouse.tables.catalog): no
        # other pipeline's folder, nor its name, may be one of them.
        for label, value in (("name", self.name), ("tables", self.tables)):
            if value in ROOT_FOLDERS:
                raise ValueError(f"{label} {value!r} is a folder the default pipeline uses "
                                 f"($LAKEHOUSE_ROOT/{value}): choose another {label}")
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
        inherited = dict(base.kafka_options)
        if routed := [k for k in ROUTING_OPTIONS if k in self.source.options]:
            own = any(is_credential(k) for k in self.source.secret_env)
            if not own and any(is_credential(k) for k in base.kafka_options):
                raise SpecError(
                    f"pipeline {self.name!r}: kafka_options.{routed[0]} sends the client to "
                    "brokers of the spec's own while the deployment's Kafka credentials are set "
                    "(KAFKA_SASL_*/KAFKA_SSL_*), which go only to KAFKA_BOOTSTRAP_SERVERS: give "
                    "the spec credentials of its own in secret_env (sasl.password: "
                    f"ORDERS_SASL_PASSWORD) or remove kafka_options.{routed[0]}")
            inherited = {k: v for k, v in inherited.items() if not _deployment_auth(k)}
        options = {**inherited,
                   **{k: SecretStr(v) for k, v in self.source.options.items()},
                   **{k: SecretStr(env[v]) for k, v in self.source.secret_env.items()}}
        return base.model_copy(update={
            "events_topic": self.source.topic,
            # Its own feed, whatever RECONCILED_TOPIC names for the default pipeline.
            "reconciled_topic": f"{self.source.topic}.reconciled",
            "lakehouse_root": base.path(self.folder),
            "window_size": self.windows.size,
            "watermark_delay": self.windows.watermark_delay,
            "correction_horizon": self.windows.correction_horizon,
            "kafka_options": options,
            "pipeline": self.name,
            "shape": self.shape,
            "pipeline_owner": ", ".join(self.owners) if self.owners else base.pipeline_owner,
        })


# Model paths as the YAML spells them (it is flat: `topic`, `measures`, `window`).
_YAML_NAMES = {"source": None, "shape": None, "windows": "window", "options": "kafka_options"}


def _explain(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc, keyed = "", False
        for part in err["loc"]:
            if isinstance(part, int):
                loc += f"[{part}]"
            elif keyed:  # a client option's name, dotted itself: kafka_options['fetch.min.bytes']
                loc += f"[{str(part)!r}]"
            elif (name := _YAML_NAMES.get(str(part), str(part))) is not None:
                loc += ("." if loc else "") + name
            keyed = part in ("options", "secret_env")
        cause = err.get("ctx", {}).get("error")
        msg = str(cause) if isinstance(cause, Exception) else err["msg"]
        if not loc and err["loc"] == ("source",):
            loc = "topic"  # the flat YAML's required key
        lines.append(f"{where}: {loc}: {msg}" if loc else f"{where}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, where: str = "spec", folder: Path | None = None) -> PipelineSpec:
    """A spec from its YAML's data; `folder`: where its files (Avro schemas) are read."""
    try:
        return PipelineSpec.model_validate(data, context={"folder": folder})
    except ValidationError as exc:
        raise SpecError(_explain(exc, where)) from None


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema of a spec's YAML (the attributes of a pipeline component: editors and
    `dg check yaml`), derived from the models: its top-level keys, each with the JSON type its
    model declares where the YAML writes that type too, `name` and `topic` required. What a key
    holds is checked by `parse_spec`, with its messages (`dg check defs`, the code location's
    load)."""
    models = {"name": PipelineSpec, "tables": PipelineSpec, "asset_prefix": PipelineSpec,
              "owners": PipelineSpec,
              "window": PipelineSpec, **dict.fromkeys(_SOURCE_KEYS, KafkaSource),
              **dict.fromkeys(_SHAPE_KEYS, EventShape)}
    model_names = {"window": "windows", "kafka_options": "options"}
    properties = {}
    for key, model in models.items():
        declared = model.model_json_schema()["properties"][model_names.get(key, key)]
        properties[key] = {k: v for k, v in declared.items() if k in ("type", "enum")}
    return {"type": "object", "properties": properties, "required": ["name", "topic"],
            "additionalProperties": False}


# A pipeline declared as a Dagster component instance (docs/specs.md): a `defs.yaml` under the code
# location's defs folder (LAKEHOUSE_DEFS_DIR, default orchestration/defs/, one folder per
# pipeline), of this type, whose attributes are a spec's fields.
PIPELINE_COMPONENT = "orchestration.components.PipelineComponent"
DEFS_DIR = Path(__file__).resolve().parents[2] / "orchestration" / "defs"


def defs_dir(env: Mapping[str, str] | None = None) -> Path:
    """The folder of the code location's component instances (LAKEHOUSE_DEFS_DIR)."""
    env = os.environ if env is None else env
    folder = Path(env.get("LAKEHOUSE_DEFS_DIR") or DEFS_DIR)
    if not folder.is_dir():
        raise SpecError(f"LAKEHOUSE_DEFS_DIR={folder}: no such folder")
    return folder


def shown(path: Path) -> str:
    """A file as errors name it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def component_spec(attributes: Any, defs_yaml: Path) -> PipelineSpec:
    """The spec of a pipeline component instance: its attributes validated as a spec file is,
    errors naming its defs.yaml and the field; its files (Avro schemas) beside the defs.yaml."""
    return parse_spec({} if attributes is None else attributes, shown(defs_yaml), defs_yaml.parent)


def _component(data: Any) -> bool:
    return isinstance(data, Mapping) and data.get("type") == PIPELINE_COMPONENT


def load_spec(path: str | Path) -> PipelineSpec:
    """A spec from a YAML file (or a pipeline component's defs.yaml); errors name the file and
    the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML ({exc})") from None
    if _component(data):
        return component_spec(data.get("attributes"), path)
    return parse_spec(data, str(path), path.parent)


def declared_specs(folder: Path) -> dict[Path, PipelineSpec]:
    """The pipelines declared as component instances under `folder`: every `defs.yaml` (or
    `defs.yml`) document of type PIPELINE_COMPONENT, by file, validated (`component_spec`)."""
    found = {}
    for path in sorted([*folder.rglob("defs.yaml"), *folder.rglob("defs.yml")]):
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if _component(d)]
        except yaml.YAMLError as exc:
            raise SpecError(f"{shown(path)}: not YAML ({exc})") from None
        if len(docs) > 1:
            raise SpecError(f"{shown(path)}: declares {len(docs)} pipelines: one folder per "
                            "pipeline")
        if docs:
            found[path] = component_spec(docs[0].get("attributes"), path)
    return found


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


# The pipeline whose tables are LAKEHOUSE_ROOT itself (`Settings.pipeline`'s default).
DEFAULT_PIPELINE = "default"


def _paths(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def deployment_specs(paths: Iterable[str], variable: str,
                     declared: Mapping[Path, PipelineSpec] | None = None) -> list[PipelineSpec]:
    """The one validation of a deployment's specs, for every entry point (the code location's
    PIPELINES and component instances, `make demo` and `make stream` with PIPELINE): each file
    loaded and validated, none named `default`, and all checked side by side with the default
    pipeline (names, folders, prefixes). `variable` (`PIPELINES=...`) heads a side-by-side error.
    `declared`: the component instances (`declared_specs`), after the files; a file that is one
    of them is read once."""
    declared = dict(declared or {})
    known = {os.path.realpath(p) for p in declared}
    paths = [p for p in paths if os.path.realpath(p) not in known]
    specs = [load_spec(path) for path in paths]
    files = {str(p): s for p, s in zip(paths, specs, strict=True)}
    named = {**files, **{shown(p): s for p, s in declared.items()}}
    firsts: dict[str, str] = {}
    for path, spec in named.items():
        if spec.name == DEFAULT_PIPELINE:
            raise SpecError(f"{path}: name: {DEFAULT_PIPELINE!r} is the pipeline of "
                            "LAKEHOUSE_ROOT itself (unprefixed assets): choose another name")
        if spec.name in firsts and path not in files:  # a component's name, taken before
            raise SpecError(f"pipeline {spec.name!r} is declared twice, by {firsts[spec.name]} and "
                            f"{path}: remove one or rename it")
        firsts.setdefault(spec.name, path)
    if declared:
        variable += " with the pipeline components (" + ", ".join(map(shown, declared)) + ")"
    try:
        check_pipelines([parse_spec({"name": DEFAULT_PIPELINE, "topic": "events"}),
                         *named.values()])
    except SpecError as exc:
        raise SpecError(f"{variable}: {exc}") from None
    return list(named.values())


def pipeline_specs(env: Mapping[str, str] | None = None) -> list[PipelineSpec]:
    """The specs PIPELINES names (comma-separated YAML paths, relative to the working directory),
    then those declared as component instances in the defs folder (`declared_specs`): the code
    location's pipelines beside the default one (`deployment_specs`)."""
    env = os.environ if env is None else env
    return deployment_specs(_paths(env.get("PIPELINES", "")),
                            f"PIPELINES={env.get('PIPELINES', '')}",
                            declared_specs(defs_dir(env)))


def selected_pipeline(env: Mapping[str, str] | None = None
                      ) -> tuple[PipelineSpec | None, Settings]:
    """The pipeline a process runs (`make stream`, `make demo`): the spec file PIPELINE names
    and its settings, or (no PIPELINE) None and the default pipeline's settings. The spec is
    validated as one of the deployment's, with those PIPELINES names (`deployment_specs`), before
    the process does anything: what the code location would refuse, it refuses at start."""
    env = os.environ if env is None else env
    base = Settings.from_env(env)
    path = env.get("PIPELINE", "").strip()
    if not path:
        return None, base
    declared = declared_specs(defs_dir(env))
    listed = [p for p in _paths(env.get("PIPELINES", ""))
              if os.path.realpath(p) not in {os.path.realpath(d) for d in declared}]
    same = [i for i, p in enumerate(listed) if os.path.realpath(p) == os.path.realpath(path)]
    in_folder = [s for p, s in declared.items() if os.path.realpath(p) == os.path.realpath(path)]
    paths = listed if same or in_folder else [*listed, path]
    specs = deployment_specs(paths, f"PIPELINE={path}" + (
        f" with PIPELINES={env['PIPELINES']}" if listed else ""), declared)
    spec = in_folder[0] if in_folder else specs[same[0] if same else len(paths) - 1]
    return spec, spec.settings(base, env)


def service_pipelines(env: Mapping[str, str] | None = None) -> list[Settings]:
    """The pipelines `make stream` runs in its one Spark application: the one PIPELINE names
    (`selected_pipeline`), else the default pipeline and every spec of PIPELINES (validated side
    by side, as the code location does)."""
    env = os.environ if env is None else env
    spec, settings = selected_pipeline(env)
    chosen = [settings] if spec is not None else [
        settings, *(s.settings(settings, env) for s in pipeline_specs(env))]
    # Each in the folder of the generation its spec writes (read at the start: an edit of a spec
    # is taken up by the next start).
    return [resolve(s) for s in chosen]
