"""Avro input of a pipeline spec (`format: avro`): the writer schemas by id, the wire format, and
the checks that make a schema usable before anything runs. Pure Python (JSON): no Spark, no Avro
library; Spark's `from_avro` decodes (`spark_jobs.transforms.avro`).

    format: avro
    avro:
      wire_format: confluent    # magic byte 0, 4-byte big-endian schema id, Avro binary
      schemas: {1: orders_v1.avsc, 2: orders_v2.avsc}   # writer schemas by id, beside the spec
      reader: 2                 # the id whose schema every record is read as (default: highest)

`wire_format: plain` is Avro binary alone, in one writer schema: `schema: orders.avsc`. A schema
is a file name (relative to the spec's folder) or the schema itself, inline. Every writer schema
is read as the reader schema (Avro's schema resolution): a field the writer lacks takes the
reader's default, so versions that add defaulted fields decode into one shape.

Or the writer schemas come from a Kafka schema registry (Confluent-compatible API), fetched when
a run starts (`lakehouse.events.schema_registry`), instead of `schemas`:

    avro:
      wire_format: confluent
      registry: {url: "http://127.0.0.1:8081/apis/ccompat/v7", subject: orders-value}

`subject` defaults to `<topic>-value` (the spec fills it in); `auth_env` names the variable
holding `user:password` for HTTP basic authentication (never in the spec, never printed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

STRICT = ConfigDict(extra="forbid", frozen=True)
# A field the reader schema gets (with default true) so a record that did not decode (Spark's
# PERMISSIVE mode yields all-null fields then) is told from one whose fields are all null.
DECODED_FIELD = "__lakehouse_decoded"
MAX_SCHEMA_ID = 2**31 - 1  # Confluent ids are 4-byte signed integers
PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
# Avro's promotions: a writer's type the reader's reads.
PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
              ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string")}


class AvroSchema(BaseModel):
    """One writer schema: where it came from (a file name, or `inline schema`) and its JSON text."""

    model_config = STRICT
    source: str
    text: str

    @property
    def parsed(self) -> dict:
        return json.loads(self.text)

    @property
    def fields(self) -> dict[str, Any]:
        """Field name -> Avro type, in the schema's order."""
        return {f["name"]: f["type"] for f in self.parsed["fields"]}


class Registry(BaseModel):
    """Where the writer schemas are registered: the Confluent-compatible API's base URL, the
    subject whose versions they are, the variable holding `user:password` (if any)."""

    model_config = STRICT
    url: str
    subject: str
    auth_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        url = data.get("url")
        if not isinstance(url, str):
            raise ValueError("url: the registry's API base URL "
                             "(http://127.0.0.1:8081/apis/ccompat/v7)")
        parts = urlsplit(url.strip())
        if parts.username is not None or parts.password is not None:
            # Said without the URL: it holds the credentials.
            raise ValueError("url: holds credentials (user:password@): credentials never sit "
                             "in a spec; name the variable that holds user:password in auth_env")
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
                or parts.fragment:
            # Not echoed: a malformed URL may still hold credentials.
            raise ValueError("url: not an http(s) URL of the registry's API, without query or "
                             "fragment (http://127.0.0.1:8081/apis/ccompat/v7)")
        data["url"] = url.strip().rstrip("/")
        subject = data.get("subject")
        if not isinstance(subject, str) or not subject.strip():
            raise ValueError("subject: the registry subject of the writer schemas "
                             "(default: <topic>-value)")
        env = data.get("auth_env")
        if env is not None and not (isinstance(env, str) and _VARIABLE.match(env)):
            raise ValueError(f"auth_env: {env!r} is not an environment variable's name: "
                             "upper-case letters, digits and _ (ORDERS_REGISTRY_AUTH)")
        return data


_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _load(value: Any, key: Any, folder: Path | None) -> dict:
    """A schema entry (a file name, or the schema inline) as an AvroSchema's fields."""
    if isinstance(value, Mapping):
        source, schema = "inline schema", dict(value)
    elif isinstance(value, str):
        source = value
        if folder is None:
            raise ValueError(f"{key}: {value!r}: a schema file is read beside its spec file; "
                             "give the schema inline here")
        path = folder / value
        if Path(value).is_absolute() or ".." in Path(value).parts or \
                not path.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"{key}: {value!r}: a schema file is named by its name beside the "
                             "spec (no absolute path, no `..`, no link out of its folder)")
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{key}: cannot read {value} beside the spec ({path}: "
                             f"{exc.strerror})") from None
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key}: {value} is not JSON ({exc})") from None
    else:
        raise ValueError(f"{key}: {value!r}: give a .avsc file name or the schema inline")
    problem = record_problem(schema)
    if problem:
        raise ValueError(f"{key}: {source} is not an Avro record schema: {problem}")
    return {"source": source, "text": json.dumps(schema, sort_keys=True)}


def record_problem(schema: Any) -> str | None:
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return 'its top level must be {"type": "record", ...}'
    if not isinstance(schema.get("name"), str) or not schema["name"]:
        return "the record has no name"
    fields = schema.get("fields")
    if not isinstance(fields, list) or not fields:
        return "the record declares no fields"
    names = []
    for i, f in enumerate(fields):
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) or "type" not in f:
            return f"fields[{i}] needs a name and a type"
        names.append(f["name"])
        problem = _type_problem(f["type"])
        if problem:
            return f"field {f['name']!r}: {problem}"
    if DECODED_FIELD in names:
        return f"{DECODED_FIELD!r} is the pipeline's own field name"
    if len(set(names)) != len(names):
        return "a field name is declared twice"
    return None


def _type_problem(t: Any) -> str | None:
    if isinstance(t, str):
        return None  # a primitive or a named type's reference (Spark's parser checks those)
    if isinstance(t, list):
        return next((p for p in map(_type_problem, t) if p), None) if t else "an empty union"
    if isinstance(t, Mapping) and isinstance(t.get("type"), str | Mapping | list):
        return None
    return f"{t!r} is not an Avro type"


def branches(t: Any) -> tuple[list[Any], bool]:
    """A field type's non-null branches and whether null is allowed."""
    if isinstance(t, list):
        return [b for b in t if b != "null"], "null" in t
    return [t], False


def kind(t: Any) -> str:
    """`string`, `long`, ..., `decimal`, `timestamp-millis`, `date`, `record`, or `named` (a
    reference to a type declared elsewhere): what one non-null branch holds."""
    if isinstance(t, str):
        return t if t in PRIMITIVES else "named"
    if isinstance(t, Mapping):
        logical = t.get("logicalType")
        if logical in ("decimal", "timestamp-millis", "timestamp-micros", "date",
                       "local-timestamp-millis", "local-timestamp-micros", "time-millis",
                       "time-micros", "uuid"):
            return "string" if logical == "uuid" else logical
        return kind(t["type"]) if not isinstance(t["type"], str) or t["type"] in PRIMITIVES \
            else t["type"]
    return "union"


class AvroInput(BaseModel):
    """The Avro side of a spec: wire format, writer schemas by id, the reader schema's id."""

    model_config = STRICT
    wire_format: Literal["confluent", "plain"] = "confluent"
    schemas: dict[int, AvroSchema] = Field(default_factory=dict)
    reader: int | None = None
    # Writer schemas from a registry: `schemas` is empty in the spec and holds the registry's
    # once a run fetched them (`lakehouse.events.schema_registry.with_registry_schemas`).
    registry: Registry | None = None

    @model_validator(mode="before")
    @classmethod
    def _files(cls, data: Any, info: ValidationInfo) -> Any:
        """Schema files read (beside the spec: the validation context's `folder`); `schema:`
        (plain) is the one writer schema."""
        if not isinstance(data, Mapping):
            return data
        data, folder = dict(data), (info.context or {}).get("folder")
        plain = data.get("wire_format") == "plain"
        if data.get("registry") is not None:
            if plain or "schema" in data:
                raise ValueError("registry: a registry names writer schemas by id: it is for "
                                 "wire_format: confluent (schemas by id), not plain")
            fetched = data.get("schemas")
            if fetched and not (isinstance(fetched, Mapping)
                                and all(isinstance(v, AvroSchema) for v in fetched.values())):
                raise ValueError("declare schemas (files) or registry, not both")
            return data
        if "schema" in data:
            if not plain:
                raise ValueError("schema: one writer schema is for wire_format: plain; the "
                                 "Confluent wire format names its schemas by id (schemas: "
                                 "{1: orders_v1.avsc})")
            if "schemas" in data:
                raise ValueError("declare schema (plain) or schemas (confluent), not both")
            data["schemas"] = {0: _load(data.pop("schema"), "schema", folder)}
        elif plain:
            raise ValueError("wire_format plain: declare its one writer schema (schema: "
                             "orders.avsc)")
        elif isinstance(data.get("schemas"), Mapping):
            loaded = {}
            for key, value in data["schemas"].items():
                try:
                    sid = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"schemas: {key!r} is not a schema id (an integer)") from None
                if not 0 <= sid <= MAX_SCHEMA_ID:
                    raise ValueError(f"schemas: {sid} is not a Confluent schema id "
                                     f"(0-{MAX_SCHEMA_ID})")
                loaded[sid] = _load(value, f"schemas[{sid}]", folder)
            data["schemas"] = loaded
        return data

    @model_validator(mode="after")
    def _resolvable(self) -> AvroInput:
        if self.pending:
            return self  # checked once a run fetched them
        if not self.schemas:
            raise ValueError("schemas: declare the writer schemas by id (schemas: "
                             "{1: orders_v1.avsc})")
        if self.reader is not None and self.reader not in self.schemas:
            where = (f" registered under subject {self.registry.subject}" if self.registry
                     else "")
            raise ValueError(f"reader: {self.reader} is not one of the schema ids{where} "
                             f"{sorted(self.schemas)}")
        reader = self.reader_schema.fields
        defaults = {f["name"] for f in self.reader_schema.parsed["fields"] if "default" in f}
        for sid, writer in sorted(self.schemas.items()):
            label = f"schemas[{sid}] ({writer.source})"
            for name in reader:
                if name not in writer.fields and name not in defaults:
                    raise ValueError(f"{label}: lacks field {name!r} of the reader schema "
                                     f"({self.reader_schema.source}), which has no default: "
                                     "its records could not be read")
            for name, wt in writer.fields.items():
                if name in reader and not _readable(wt, reader[name]):
                    raise ValueError(f"{label}: field {name!r} is {_show(wt)}, the reader schema "
                                     f"({self.reader_schema.source}) has {_show(reader[name])}: "
                                     "Avro cannot read one as the other")
        return self

    @property
    def pending(self) -> bool:
        """A registry's schemas not fetched yet (a spec as loaded: no run started)."""
        return self.registry is not None and not self.schemas

    @property
    def reader_id(self) -> int:
        """`reader`; by default the highest id of the spec's files, or a registry subject's
        latest version (its ids are the registry's, shared by subjects: not in version order)."""
        if self.reader is not None:
            return self.reader
        return list(self.schemas)[-1] if self.registry is not None else max(self.schemas)

    @property
    def reader_schema(self) -> AvroSchema:
        return self.schemas[self.reader_id]

    def reader_json(self) -> str:
        """The reader schema with DECODED_FIELD (default true) appended: Spark's `avroSchema`."""
        schema = self.reader_schema.parsed
        schema["fields"] = [*schema["fields"],
                            {"name": DECODED_FIELD, "type": "boolean", "default": True}]
        return json.dumps(schema)


def _show(t: Any) -> str:
    return json.dumps(t, separators=(",", ":"))


def _readable(writer: Any, reader: Any) -> bool:
    """A conservative check of Avro's resolution for one field: same non-null kinds, or a
    promotion, or null into a nullable reader. Complex or named types are left to Spark."""
    (wb, w_null), (rb, r_null) = branches(writer), branches(reader)
    if w_null and not r_null:
        return False
    wk, rk = {kind(b) for b in wb}, {kind(b) for b in rb}
    simple = set(PRIMITIVES) | {"decimal", "timestamp-millis", "timestamp-micros", "date"}
    if not (wk <= simple and rk <= simple):
        return True
    return all(w in rk or any((w, r) in PROMOTIONS for r in rk) for w in wk)


# What a declared field may be in the reader schema (its non-null kind), by the spec's type.
_ACCEPTS = {
    "string": ("string", "enum", "int", "long"),
    "int": ("int", "long", "string"),
    "long": ("int", "long", "string"),
    "date": ("date", "string"),
    "decimal": ("decimal", "int", "long", "string"),
}
# The event time's Avro kinds and the spec's time forms each needs (one of them).
_TIME_KINDS = {"string": ("iso8601", "epoch_millis", "epoch_seconds"),
               "long": ("epoch_millis", "epoch_seconds"), "int": ("epoch_seconds",),
               "timestamp-millis": ("epoch_millis",)}


def check_fields(avro: AvroInput, fields: Mapping[str, str], time_field: str,
                 formats: tuple[str, ...]) -> None:
    """Every declared field is a field of the reader schema, of a kind its spec type reads; a
    ValueError names the field otherwise. (A registry's schemas: once a run fetched them.)"""
    if avro.pending:
        return
    reader = avro.reader_schema
    for name, spec_type in fields.items():
        if name not in reader.fields:
            raise ValueError(f"fields.{name}: not a field of the reader schema ({reader.source}; "
                             f"its fields: {', '.join(reader.fields)})")
        bs, _ = branches(reader.fields[name])
        if len(bs) != 1:
            raise ValueError(f"fields.{name}: {_show(reader.fields[name])} in {reader.source}: "
                             "a union of several types is no scalar field")
        k = kind(bs[0])
        if k == "decimal" and not 1 <= int(bs[0].get("precision", 0)) <= 38:
            raise ValueError(f"fields.{name}: {_show(bs[0])} in {reader.source}: a decimal's "
                             "precision is 1-38 (Spark's decimals)")
        if name == time_field:
            needs = _TIME_KINDS.get(k)
            if needs is None:
                raise ValueError(f"fields.{name}: the event time is {_show(bs[0])} in "
                                 f"{reader.source}: use a string, a long (epoch "
                                 "milliseconds or seconds) or a long with logicalType "
                                 "timestamp-millis")
            if not set(needs) & set(formats):
                raise ValueError(f"fields.{name}: the event time is {_show(bs[0])} in "
                                 f"{reader.source}: event_time.formats {list(formats)} must "
                                 f"include {' or '.join(needs)}")
            continue
        accepted = _ACCEPTS.get("decimal" if spec_type.startswith("decimal") else spec_type,
                                ("string", "long"))
        if k not in accepted:
            hint = (" (a float or double is not exact: use bytes or fixed with logicalType "
                    "decimal, or a string)" if k in ("float", "double") else "")
            raise ValueError(f"fields.{name}: {spec_type} cannot be read from {_show(bs[0])} "
                             f"in {reader.source}: it takes {', '.join(accepted)}{hint}")
