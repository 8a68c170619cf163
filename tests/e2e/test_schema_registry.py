"""Avro writer schemas from a schema registry (`avro.registry`), against a real Apicurio Registry
(the `schema_registry` fixture): the spec as loaded (subject default, digest), the schemas
fetched and checked like files, and the errors (no such subject, unreachable, a schema the
reader cannot read, credentials) clear and never holding a secret."""

import json
import uuid
from pathlib import Path

import pytest
import yaml

from lakehouse.config.settings import Settings
from lakehouse.events.schema_registry import RegistryError, registered, with_registry_schemas
from lakehouse.specs.pipeline import SpecError, load_spec, parse_spec
from testkit.avro_events import register_schema

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V1, V2 = ((EXAMPLES / f"orders_v{i}.avsc").read_text() for i in (1, 2))
BASE = Settings.from_env({})
SECRET = "s3cret-registry-pw"


def spec_data(url: str, topic: str, **registry) -> dict:
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    return {**data, "topic": topic, "avro": {"wire_format": "confluent",
                                             "registry": {"url": url, **registry}}}


def settings_of(data: dict, env: dict | None = None) -> Settings:
    return parse_spec(data).settings(BASE, env or {})


def test_the_schemas_are_the_subjects_versions_checked_like_files(schema_registry):
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    spec = parse_spec(spec_data(schema_registry + "/", topic))
    registry = spec.shape.avro.registry
    assert (registry.url, registry.subject) == (schema_registry, f"{topic}-value")
    assert spec.shape.avro.pending  # nothing fetched at load
    settings = spec.settings(BASE, {})
    with pytest.raises(RegistryError, match=f"subject {topic}-value has no schema registered"):
        with_registry_schemas(settings)
    v1 = register_schema(schema_registry, f"{topic}-value", V1)
    # Version 1 lacks the spec's currency: the spec's fields are checked against the schema.
    with pytest.raises(RegistryError, match="fields.currency: not a field of the reader schema"):
        with_registry_schemas(settings)
    v2 = register_schema(schema_registry, f"{topic}-value", V2)
    resolved = with_registry_schemas(settings)
    avro = resolved.shape.avro
    # The reader is the latest version's schema, whatever the ids (the registry's, shared).
    assert sorted(avro.schemas) == sorted({v1, v2}) and avro.reader_id == v2
    assert avro.schemas[v2].parsed == json.loads(V2)
    # The spec version is the registry's URL and subject, not what is registered under it.
    assert resolved.results_version == settings.results_version
    assert resolved.results_inputs == settings.results_inputs
    assert settings.results_inputs["shape"]["avro"] == {
        "wire_format": "confluent", "reader": None,
        "registry": {"url": schema_registry, "subject": f"{topic}-value", "auth_env": None}}
    other = settings_of(spec_data(schema_registry, topic, subject="other-value"))
    assert other.results_version != settings.results_version
    # A file-based spec's digest has no registry in it.
    assert "registry" not in load_spec(EXAMPLES / "orders_avro.yaml").settings(
        BASE, {}).results_inputs["shape"]["avro"]
    # A batch's unknown ids: registered under the subject, or not.
    assert registered(avro, [max(v1, v2) + 97]) == []
    v3 = register_schema(schema_registry, f"{topic}-value", {
        **json.loads(V2), "fields": [*json.loads(V2)["fields"],
                                     {"name": "channel", "type": "string", "default": "web"}]})
    assert registered(avro, [v3, max(v1, v2, v3) + 97]) == [v3]


def test_a_reader_or_a_version_the_reader_cannot_read_is_refused(schema_registry):
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    register_schema(schema_registry, f"{topic}-value", V2)
    with pytest.raises(RegistryError, match=r"reader: 4242 is not one of the schema ids "
                                            rf"registered under subject {topic}-value"):
        with_registry_schemas(settings_of({**spec_data(schema_registry, topic),
                                           "avro": {"registry": {"url": schema_registry},
                                                    "reader": 4242}}))
    # A later version whose amount is a double: Avro cannot read it as the reader's decimal.
    bad = json.loads(V2)
    bad["fields"] = [f if f["name"] != "amount" else {"name": "amount", "type": "double"}
                     for f in bad["fields"]]
    bad["fields"].append({"name": "note", "type": "string", "default": ""})
    register_schema(schema_registry, f"{topic}-value", bad)
    with pytest.raises(RegistryError, match=f"{schema_registry} .subject {topic}-value.*amount"):
        with_registry_schemas(settings_of(spec_data(schema_registry, topic)))


def test_a_spec_declares_schemas_or_a_registry_and_a_url_without_credentials():
    url = "http://127.0.0.1:8081/apis/ccompat/v7"
    with pytest.raises(SpecError, match="declare schemas .files. or registry, not both"):
        parse_spec({**spec_data(url, "t"), "avro": {"registry": {"url": url},
                                                    "schemas": {1: "orders_v1.avsc"}}},
                   folder=EXAMPLES)
    with pytest.raises(SpecError, match="wire_format: confluent"):
        parse_spec({**spec_data(url, "t"), "avro": {"wire_format": "plain",
                                                    "registry": {"url": url}}})
    for bad in (f"http://orders:{SECRET}@127.0.0.1:8081/x", f"orders:{SECRET}@127.0.0.1:8081",
                f"ftp://127.0.0.1/{SECRET}"):
        with pytest.raises(SpecError) as err:
            parse_spec(spec_data(bad, "t"))
        assert SECRET not in str(err.value) and "avro.registry: url" in str(err.value)
    with pytest.raises(SpecError, match="auth_env: 'lower' is not an environment variable"):
        parse_spec(spec_data(url, "t", auth_env="lower"))


def test_an_unreachable_registry_is_named_and_credentials_never_shown(schema_registry,
                                                                     monkeypatch):
    from conftest import free_port

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    down = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    data = spec_data(down, topic, auth_env="ORDERS_REGISTRY_AUTH")
    monkeypatch.delenv("ORDERS_REGISTRY_AUTH", raising=False)
    with pytest.raises(RegistryError) as err:
        with_registry_schemas(settings_of(data))  # the variable is not set
    assert "ORDERS_REGISTRY_AUTH" in str(err.value) and down in str(err.value)
    monkeypatch.setenv("ORDERS_REGISTRY_AUTH", f"orders:{SECRET}")
    with pytest.raises(RegistryError) as err:
        with_registry_schemas(settings_of(data))
    text = str(err.value)
    assert f"{down} (subject {topic}-value) unreachable" in text and SECRET not in text
    # Credentials sent to a registry that needs none: the schemas all the same.
    register_schema(schema_registry, f"{topic}-value", V2)
    got = with_registry_schemas(settings_of(spec_data(schema_registry, topic,
                                                      auth_env="ORDERS_REGISTRY_AUTH")))
    assert SECRET not in json.dumps(got.results_inputs) and len(got.shape.avro.schemas) == 1
    # A URL that is not the Confluent API (the server's root): a clear error.
    with pytest.raises(RegistryError, match="answered HTTP|no schema registered|JSON"):
        with_registry_schemas(settings_of(spec_data(schema_registry.rsplit("/apis", 1)[0],
                                                    topic)))


def test_an_unreachable_registry_stops_a_catch_up_and_a_replay_before_anything_runs(tmp_path,
                                                                                    spark):
    from datetime import date

    from conftest import free_port

    from spark_jobs.replay import run_replay
    from spark_jobs.stream import run_available_now

    down = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    spec = parse_spec(spec_data(down, "orders-down"))
    settings = spec.settings(Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")}), {})
    for run in (lambda: run_available_now(spark, settings),
                lambda: run_replay(spark, settings, date(2026, 11, 26))):
        with pytest.raises(RegistryError, match=f"{down} .subject orders-down-value. unreachable"):
            run()
    assert not Path(settings.table_path("bronze_events")).exists()  # no table created
