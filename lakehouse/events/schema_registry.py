"""Writer schemas from a Kafka schema registry (its Confluent-compatible REST API), for an Avro
spec with `avro.registry` (`lakehouse.events.avro.Registry`). Plain Python (urllib): no Spark.

When a run starts (the stream's query, a replay) `with_registry_schemas` fetches every version
of the subject (`GET {url}/subjects/{subject}/versions`, then `.../versions/{v}`: its id and
schema), checks them exactly as schema files are checked (each a record schema, each readable as
the reader schema, the spec's fields in the reader schema), and returns the settings with those
schemas: the decode path (`spark_jobs.transforms.avro`) uses them as it uses files. An unreachable registry
is a `RegistryError` naming the URL (never its credentials) and the subject: nothing runs.

Ids registered later: a stream batch with `unknown_schema_id` records asks `registered` whether
the subject holds any of those ids now; if so it raises `SchemasChanged` before writing anything,
and the runner restarts the query with the registry's schemas (the batch re-runs from its
checkpoint).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from pydantic import ValidationError

from lakehouse.config.settings import Settings
from lakehouse.events.avro import AvroInput, AvroSchema, Registry, record_problem
from lakehouse.events.shape import EventShape

TIMEOUT_S = 10.0
ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"
# Unknown ids a batch looks up one by one (`GET /schemas/ids/{id}`); beyond, the subject's list.
MAX_ID_LOOKUPS = 20


class RegistryError(RuntimeError):
    """The registry cannot give the writer schemas (unreachable, refused, no such subject, a
    schema the pipeline cannot read): the message names the URL (without credentials) and the
    subject."""


class SchemasChanged(RuntimeError):
    """Raised inside a stream batch, before it writes anything: ids its records carry, unknown
    when the query started, are now registered under the subject. The runners restart the query
    (`spark_jobs.stream.schemas_changed`), which fetches them."""


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _auth(registry: Registry, env: Mapping[str, str]) -> str | None:
    """The Basic-auth header for the registry's credentials, None without `auth_env`. Sent only
    over https or to a registry on this host (loopback): over plain http elsewhere, anyone on
    the path reads it."""
    if registry.auth_env is None:
        return None
    where = f"schema registry {registry.url} (subject {registry.subject})"
    url = urlsplit(registry.url)
    if url.scheme != "https" and url.hostname not in LOOPBACK:
        raise RegistryError(f"{where}: auth_env's credentials go only over https or to a "
                            f"registry on this host, not over {url.scheme} to {url.hostname}: "
                            "use the registry's https URL")
    secret = env.get(registry.auth_env)
    if not secret or ":" not in secret:
        raise RegistryError(f"{where}: auth_env names {registry.auth_env}, which is not set to "
                            "user:password in the environment")
    return "Basic " + base64.b64encode(secret.encode()).decode()


class _NoCredentialsOnRedirect(urllib.request.HTTPRedirectHandler):
    """Follows a redirect without the Authorization header (urllib's own handler copies it to
    whichever host the redirect names)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            for table in (new.headers, new.unredirected_hdrs):
                table.pop("Authorization", None)
        return new


_OPENER = urllib.request.build_opener(_NoCredentialsOnRedirect)


def _get(registry: Registry, path: str, auth: str | None) -> Any | None:
    """The JSON at `path` under the registry's URL; None when it answers 404 (no such subject,
    version or id)."""
    request = urllib.request.Request(registry.url + path, headers={
        "Accept": ACCEPT, **({"Authorization": auth} if auth else {})})
    where = f"schema registry {registry.url} (subject {registry.subject})"
    try:
        with _OPENER.open(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        try:
            said = str(json.loads(exc.read()).get("message", ""))[:200]
        except (ValueError, AttributeError, OSError):
            said = ""
        hint = (": set user:password in the variable auth_env names" if exc.code in (401, 403)
                else "")
        raise RegistryError(f"{where}: GET {path} answered HTTP {exc.code}"
                            f"{' (' + said + ')' if said else ''}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RegistryError(f"{where} unreachable: {reason}") from None
    except ValueError:
        raise RegistryError(f"{where}: GET {path} did not answer JSON: is the URL the "
                            "Confluent-compatible API's base (…/apis/ccompat/v7)?") from None


def _schema(registry: Registry, doc: Any, what: str) -> tuple[int, AvroSchema]:
    """(id, schema) of a registry answer holding `id` and `schema` (Avro only)."""
    where = f"schema registry {registry.url}: {what}"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("id"), int) or not isinstance(
            doc.get("schema"), str):
        raise RegistryError(f"{where}: the answer holds no id and schema")
    if doc.get("schemaType", "AVRO") != "AVRO":
        raise RegistryError(f"{where}: a {doc['schemaType']} schema, not Avro")
    if doc.get("references"):
        raise RegistryError(f"{where}: references other schemas, which the pipeline does not "
                            "resolve: register the schema self-contained")
    try:
        parsed = json.loads(doc["schema"])
    except ValueError:
        raise RegistryError(f"{where}: the schema is not JSON") from None
    if problem := record_problem(parsed):
        raise RegistryError(f"{where}: not an Avro record schema: {problem}")
    return doc["id"], AvroSchema(source=f"{what} (id {doc['id']})",
                                 text=json.dumps(parsed, sort_keys=True))


def fetch(registry: Registry, env: Mapping[str, str] | None = None) -> dict[int, AvroSchema]:
    """Every version of the subject, by schema id, oldest version first (ids are the registry's,
    shared by its subjects: a newer version may have a lower id)."""
    auth = _auth(registry, os.environ if env is None else env)
    versions = _get(registry, f"/subjects/{quote(registry.subject, safe='')}/versions", auth)
    if not versions:
        raise RegistryError(f"schema registry {registry.url}: subject {registry.subject} has no "
                            "schema registered: register the writer schema first")
    out: dict[int, AvroSchema] = {}
    for v in sorted(versions):
        what = f"subject {registry.subject} version {v}"
        doc = _get(registry, f"/subjects/{quote(registry.subject, safe='')}/versions/{v}", auth)
        if doc is None:
            continue  # deleted between the two requests
        sid, schema = _schema(registry, doc, what)
        out[sid] = schema
    return out


def resolved(shape: EventShape, env: Mapping[str, str] | None = None) -> EventShape:
    """The shape with its registry's writer schemas, checked as schema files are (a
    RegistryError says what does not hold); the shape itself when it has no registry."""
    avro = shape.avro
    if avro is None or avro.registry is None:
        return shape
    schemas = fetch(avro.registry, env)
    try:
        checked = AvroInput.model_validate({"wire_format": avro.wire_format, "reader": avro.reader,
                                            "registry": avro.registry, "schemas": schemas})
        return EventShape.model_validate({**shape.model_dump(exclude={"avro"}), "avro": checked})
    except ValidationError as exc:
        problems = "; ".join(str(e.get("ctx", {}).get("error") or e["msg"])
                             for e in exc.errors(include_url=False))
        raise RegistryError(f"schema registry {avro.registry.url} (subject "
                            f"{avro.registry.subject}): {problems}") from None


def with_registry_schemas(settings: Settings) -> Settings:
    """`settings` whose shape holds its registry's writer schemas, fetched now (unchanged
    without a registry). Their digest (`results_version`) is the same: the registry's URL and
    subject are the spec's version, not what is registered under it."""
    shape = resolved(settings.shape)
    if shape is settings.shape:
        return settings
    print(f"{settings.pipeline}: writer schemas from {shape.avro.registry.url} subject "
          f"{shape.avro.registry.subject}: ids {sorted(shape.avro.schemas)}, reader "
          f"{shape.avro.reader_id}", flush=True)
    return settings.model_copy(update={"shape": shape})


def registered(avro: AvroInput, ids: Iterable[int],
               env: Mapping[str, str] | None = None) -> list[int]:
    """Which of `ids` (unknown when the query started) are registered under the subject now.
    A few ids are looked up by id first (an id nobody registered answers 404 at once)."""
    registry, ids = avro.registry, sorted(set(ids) - set(avro.schemas))
    if registry is None or not ids:
        return []
    if len(ids) <= MAX_ID_LOOKUPS:
        auth = _auth(registry, os.environ if env is None else env)
        if all(_get(registry, f"/schemas/ids/{i}", auth) is None for i in ids):
            return []
    return sorted(set(ids) & set(fetch(registry, env)))
