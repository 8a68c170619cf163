"""Several pipelines in one code location (PIPELINES): each spec's pipeline gets the default's
definitions under its prefix, the default pipeline keeps the contract's names, and a bad spec
fails the load naming the file and the field. Fast: the definitions load in subprocesses (as a
code server loads them), no Kafka and no Spark."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from assets.resources import LakehouseResource
from lakehouse.config.settings import SettingsError
from lakehouse.specs.pipeline import SpecError, pipeline_specs

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "snapshots" / "asset_graph.txt"
SPECS = "examples/orders.yaml,examples/app_events.yaml"
ORDERS = (REPO / "examples" / "orders.yaml").read_text()
# The deployment's owner: a team Dagster takes, and free text only the scorecard shows.
OWNER = "team:platform, the #lakehouse channel"

# Loads the code location, then reports what it holds, the orders pipeline's settings as the
# `lakehouse` resource resolves them, and whether loading started a JVM.
LOAD = """
import json, os, sys
sys.path.insert(0, "tests/unit")
from orchestration.definitions import defs
from test_graph_snapshot import describe

repo = defs.get_repository_def()
graph = repo.asset_graph
lakehouse = defs.resources["lakehouse"]
orders = lakehouse.settings_for("orders")
reprocess = defs.resolve_job_def("orders__reprocess_dates")
from dagster import validate_run_config
children = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/stat")
            and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
from pyspark import SparkContext
from pyspark.sql import SparkSession
print(json.dumps({
    "groups": {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()},
    "owners": {k.to_user_string(): list(graph.get(k).owners) for k in graph.get_all_asset_keys()},
    "first_partition": {k.to_user_string(): graph.get(k).partitions_def.get_first_partition_key()
                        for k in graph.get_all_asset_keys() if graph.get(k).partitions_def},
    "checks": sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in graph.asset_check_keys),
    "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
    "writes": {j.name: j.tags.get("lakehouse/writes") for j in repo.get_all_jobs()
               if not j.name.startswith("__")},
    "schedules": {s.name: s.job_name for s in repo.schedule_defs},
    "sensors": sorted(s.name for s in repo.sensor_defs),
    "resources": sorted(defs.resources),
    "reprocess_config": validate_run_config(reprocess, reprocess.partitioned_config
                                            .get_run_config_for_partition_key("2025-01-02"))["ops"]
                                            ["orders__corrections"]["config"],
    "orders": {"root": orders.root, "topic": orders.events_topic, "pipeline": orders.pipeline,
               "window_s": orders.window_size.total_seconds(),
               "dimensions": list(orders.shape.dimension_names)},
    "app_events_topic": lakehouse.settings_for("app_events").events_topic,
    "default_root": lakehouse.settings.root,
    "spark_started": SparkContext._active_spark_context is not None
                     or SparkSession.getActiveSession() is not None,
    "children": children,
    "describe": describe(defs),
}))
"""


def load(pipelines: str | None, root: Path, code: str = LOAD) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "GX_ANALYTICS_ENABLED": "false",
           "PARTITIONS_START": "2025-01-01", "PIPELINE_OWNER": OWNER}
    env.pop("PIPELINES", None)
    if pipelines is not None:
        env["PIPELINES"] = pipelines
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    done = load(SPECS, root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, json.loads(done.stdout.strip().splitlines()[-1])


def test_assets_carry_their_pipelines_owners(loaded):
    """A spec's `owners` (orders: team:orders) on its assets, the others PIPELINE_OWNER's
    entries that Dagster takes as owners (its free text left to the scorecard)."""
    _, out = loaded
    owners = out["owners"]
    assert owners and all(v == ["team:orders"] for k, v in owners.items()
                          if k.startswith("orders/")), owners
    assert all(v == ["team:platform"] for k, v in owners.items()
               if not k.startswith("orders/")), owners


def test_each_spec_gets_the_assets_under_its_prefix_in_its_groups(loaded):
    _, out = loaded
    groups = out["groups"]
    for prefix in ("orders", "app_events"):
        assert groups[f"{prefix}/raw_events"] == f"{prefix}_ingest"
        assert groups[f"{prefix}/bronze_events"] == f"{prefix}_ingest"
        assert groups[f"{prefix}/streaming_aggregates"] == f"{prefix}_ingest"
        for name in ("late_corrections", "reconciled_aggregates", "replay_aggregates",
                     "reconciled_feed"):
            assert groups[f"{prefix}/{name}"] == f"{prefix}_reconcile"
            # Its own daily partitions, from its own first event date (PARTITIONS_START here).
            assert out["first_partition"][f"{prefix}/{name}"] == "2025-01-01"
        assert groups[f"{prefix}/timeline_report"] == f"{prefix}_observe"
        assert groups[f"{prefix}/readiness_scorecard"] == f"{prefix}_observe"
        assert f"{prefix}/reconciled_aggregates:reconciled_equals_replay" in out["checks"]
        assert f"{prefix}/replay_aggregates:fast_path_vs_replay" in out["checks"]
        assert f"{prefix}/streaming_aggregates:freshness_check" in out["checks"]
        assert f"{prefix}/reconciled_aggregates:freshness_check" in out["checks"]
    # The default pipeline's keys and groups are the contract's.
    assert groups["bronze_events"] == "ingest" and groups["reconciled_aggregates"] == "reconcile"
    assert groups["timeline_report"] == "observe"
    assert len(groups) == 3 * 9


def test_jobs_schedules_and_sensors_are_named_with_the_prefix(loaded):
    _, out = loaded
    default_jobs = ["check_freshness", "correct_dates", "reconcile_dates", "redrive_quarantine",
                    "report_scorecard", "report_timeline", "reprocess_dates", "retire_generation", "stream_catch_up",
                    "switch_generation",
                    "table_maintenance", "verify_dates"]
    assert out["jobs"] == sorted([*default_jobs, *(f"{p}__{j}" for p in ("orders", "app_events")
                                                   for j in default_jobs)])
    assert out["schedules"]["orders__corrections_schedule"] == "orders__reconcile_dates"
    assert out["schedules"]["orders__stream_catch_up_schedule"] == "orders__stream_catch_up"
    assert out["schedules"]["app_events__verification_schedule"] == "app_events__verify_dates"
    assert out["schedules"]["corrections_schedule"] == "reconcile_dates"
    for p in ("orders", "app_events"):
        assert {f"{p}__late_data_sensor", f"{p}__topic_observation_sensor",
                f"{p}__prove_corrected_dates", f"{p}__freshness_checks_sensor"} <= set(out["sensors"])
    # Four a pipeline, and one of the code location (fail_dead_runs: every pipeline's runs).
    assert len(out["sensors"]) == 3 * 4 + 1 and "fail_dead_runs" in out["sensors"]
    # One set of resources, the default's keys.
    assert out["resources"] == ["kafka", "lakehouse", "log_position", "spark"]
    # The reprocess job configures the pipeline's own corrections op (a valid run config).
    assert out["reprocess_config"] == {"reprocess": True}
    # Writer runs queue per pipeline (the instance limits one run per tag value).
    assert out["writes"]["stream_catch_up"] == "stream"
    assert out["writes"]["reconcile_dates"] == out["writes"]["table_maintenance"] == "daily"
    assert out["writes"]["orders__stream_catch_up"] == "orders__stream"
    assert out["writes"]["app_events__verify_dates"] == "app_events__daily"
    assert out["writes"]["report_timeline"] is None


def test_a_pipelines_settings_are_its_folder_and_topic(loaded):
    root, out = loaded
    assert out["default_root"] == str(root)
    assert out["orders"] == {"root": str(root / "orders"), "topic": "orders", "pipeline": "orders",
                             "window_s": 60.0, "dimensions": ["region", "currency"]}
    assert out["app_events_topic"] == "app-events"


def test_loading_starts_no_spark(loaded):
    _, out = loaded
    assert not out["spark_started"]
    assert out["children"] == []  # no JVM (nor any other process) started by the load


def test_the_default_pipelines_graph_is_the_snapshot_whatever_pipelines_are_set(loaded):
    """With PIPELINES set, the default pipeline's lines of the graph are still the snapshot."""
    _, out = loaded
    default = [line for line in out["describe"].splitlines()
               if not line.startswith(("orders", "app_events"))]
    assert "\n".join(default) + "\n" == SNAPSHOT.read_text()


def test_with_pipelines_unset_the_graph_is_the_snapshot(tmp_path):
    code = ("import sys; sys.path.insert(0, 'tests/unit')\n"
            "from orchestration.definitions import defs\n"
            "from test_graph_snapshot import describe\n"
            "print(describe(defs), end='')\n")
    done = load(None, tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == SNAPSHOT.read_text()


def test_a_bad_spec_fails_the_load_naming_the_file_and_the_field(tmp_path):
    bad = tmp_path / "orders.yaml"
    bad.write_text(ORDERS.replace("{field: amount,", "{field: amout,"))
    done = load(f"examples/app_events.yaml, {bad}", tmp_path, "import orchestration.definitions")
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("lakehouse.specs.pipeline.SpecError: ")
    assert f"{bad}: measures[0].field: 'amout' is not a declared field" in message


def test_a_spec_naming_other_brokers_without_credentials_fails_the_load(tmp_path, monkeypatch):
    """The deployment's Kafka credentials set: the code location refuses a spec that sends its
    clients to brokers of its own without credentials of its own, naming the key."""
    for name, value in {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN",
                        "KAFKA_SASL_USERNAME": "lakehouse",
                        "KAFKA_SASL_PASSWORD": "deployment-pw-7"}.items():
        monkeypatch.setenv(name, value)
    routed = tmp_path / "orders.yaml"
    routed.write_text(ORDERS + "kafka_options: {bootstrap.servers: '127.0.0.1:1'}\n")
    done = load(str(routed), tmp_path, "import orchestration.definitions")
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("lakehouse.specs.pipeline.SpecError: pipeline 'orders': "
                              "kafka_options.bootstrap.servers sends the client to brokers"), message
    assert "deployment-pw-7" not in done.stderr + done.stdout


def spec(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_specs_are_checked_side_by_side_and_with_the_default(tmp_path):
    same_name = spec(tmp_path, "orders2.yaml", ORDERS + "tables: orders2\nasset_prefix: orders2\n")
    with pytest.raises(SpecError, match="'orders' and 'orders' have one name 'orders'") as err:
        pipeline_specs({"PIPELINES": f"examples/orders.yaml,{same_name}"})
    assert same_name in str(err.value)  # the variable, with the files
    same_folder = spec(tmp_path, "o2.yaml", ORDERS.replace("name: orders", "name: o2")
                       + "tables: orders\n")
    with pytest.raises(SpecError, match="one table folder 'orders'"):
        pipeline_specs({"PIPELINES": f"examples/orders.yaml,{same_folder}"})
    default = spec(tmp_path, "default.yaml", ORDERS.replace("name: orders", "name: default"))
    with pytest.raises(SpecError, match=f"^{default}: name: 'default' is the pipeline of"):
        pipeline_specs({"PIPELINES": default})
    missing = str(tmp_path / "nowhere.yaml")
    with pytest.raises(SpecError, match=f"^{missing}: cannot read the spec"):
        pipeline_specs({"PIPELINES": missing})
    assert pipeline_specs({}) == [] and pipeline_specs({"PIPELINES": " , "}) == []
    assert [s.name for s in pipeline_specs({"PIPELINES": SPECS})] == ["orders", "app_events"]


def test_the_resource_resolves_each_pipeline_on_the_defaults_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PIPELINES", SPECS)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "env-root"))
    resource = LakehouseResource(lakehouse_root=str(tmp_path / "run-root"))
    assert resource.settings_for("default") is resource.settings
    orders = resource.settings_for("orders")
    assert orders is resource.settings_for("orders")  # resolved once per resource object
    assert orders.root == str(tmp_path / "run-root" / "orders")  # the run's override applies
    assert orders.events_topic == "orders" and orders.pipeline == "orders"
    assert orders.kafka_bootstrap_servers == resource.settings.kafka_bootstrap_servers
    with pytest.raises(SpecError, match="'shipments' is not among PIPELINES"):
        resource.settings_for("shipments")


def test_a_run_override_never_sends_a_specs_credentials_to_other_brokers(tmp_path, monkeypatch):
    path = spec(tmp_path, "orders.yaml",
                ORDERS + "secret_env:\n  sasl.password: ORDERS_SASL_PASSWORD\n")
    monkeypatch.setenv("PIPELINES", path)
    monkeypatch.setenv("ORDERS_SASL_PASSWORD", "orders-pw-123")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-a:9092")
    assert LakehouseResource().settings_for("orders").kafka_options["sasl.password"] \
        .get_secret_value() == "orders-pw-123"
    moved = LakehouseResource(kafka_bootstrap_servers="kafka-b:9092")
    assert moved.settings.kafka_bootstrap_servers == "kafka-b:9092"  # no credentials of its own
    with pytest.raises(SettingsError, match="may not be overridden") as refused:
        moved.settings_for("orders")
    assert "orders-pw-123" not in str(refused.value)


def test_every_entry_point_refuses_default_and_collisions_before_anything_runs(
        tmp_path, monkeypatch, capsys):
    """`make demo PIPELINE=`, `make stream PIPELINE=` and the code location's PIPELINES share
    one validation: a spec named `default`, or one whose name, folder or prefix another pipeline
    of the deployment has, is refused before the demo produces or the service serves."""
    import orchestration.service.runner
    import testkit.demo
    import testkit.generator
    from lakehouse.specs.pipeline import selected_pipeline

    started = []
    monkeypatch.setattr(testkit.generator, "produce", lambda *a, **k: started.append("produce"))
    monkeypatch.setattr(orchestration.service.runner, "serve", lambda *a, **k: started.append("serve") or 0)
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("PIPELINES", raising=False)
    default = spec(tmp_path, "default.yaml", ORDERS.replace("name: orders", "name: default"))
    same_name = spec(tmp_path, "copy.yaml", ORDERS + "tables: orders2\nasset_prefix: orders2\n")
    same_folder = spec(tmp_path, "o2.yaml", ORDERS.replace("name: orders", "name: o2")
                       + "tables: orders\n")
    same_prefix = spec(tmp_path, "o3.yaml", ORDERS.replace("name: orders", "name: o3")
                       + "asset_prefix: orders\n")
    cases = [
        ({"PIPELINE": default}, f"{default}: name: 'default' is the pipeline of LAKEHOUSE_ROOT"),
        ({"PIPELINE": "examples/orders.yaml", "PIPELINES": default},
         f"{default}: name: 'default' is the pipeline of LAKEHOUSE_ROOT"),
        ({"PIPELINE": same_name, "PIPELINES": "examples/orders.yaml"},
         "pipelines 'orders' and 'orders' have one name 'orders'"),
        ({"PIPELINE": same_folder, "PIPELINES": "examples/orders.yaml"},
         "pipelines 'orders' and 'o2' have one table folder 'orders'"),
        ({"PIPELINE": same_prefix, "PIPELINES": "examples/orders.yaml"},
         "pipelines 'orders' and 'o3' have one asset prefix 'orders'"),
    ]
    for env, message in cases:
        env = {"LAKEHOUSE_ROOT": str(tmp_path / "lake"), "DAGSTER_HOME": str(tmp_path), **env}
        with pytest.raises(SpecError) as refused:
            selected_pipeline(env)
        assert message in str(refused.value)
        # The code location given the same files refuses them with the same message.
        with pytest.raises(SpecError) as loaded:
            pipeline_specs({"PIPELINES": f"{env.get('PIPELINES', '')},{env['PIPELINE']}"})
        assert message in str(loaded.value)
        # The demo: one error line, exit 2, nothing produced, PIPELINES left alone.
        assert testkit.demo.main(env) == 2
        assert capsys.readouterr().err.startswith("demo: error: ")
        assert "PIPELINES" not in os.environ
        # The stream service: exit 2 before serving.
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert orchestration.service.runner.main() == 2
        assert message in capsys.readouterr().err
        for k in env:
            monkeypatch.delenv(k)
    assert started == []
    # The same file in PIPELINE and PIPELINES is one pipeline, not a collision.
    orders, settings = selected_pipeline({"PIPELINE": "examples/orders.yaml",
                                          "PIPELINES": SPECS, "LAKEHOUSE_ROOT": str(tmp_path)})
    assert orders.name == "orders" and settings.root == str(tmp_path / "orders")


def test_the_demo_refuses_spark_remote_with_one_line(tmp_path, capsys):
    """The demo runs its catch-ups (classic) and its daily runs in one process: with SPARK_REMOTE
    set it stops before anything runs, saying what to do."""
    import testkit.demo

    env = {"LAKEHOUSE_ROOT": str(tmp_path / "lake"), "DAGSTER_HOME": str(tmp_path),
           "SPARK_REMOTE": "sc://127.0.0.1:15002"}
    assert testkit.demo.main(env) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: error: SPARK_REMOTE is set") and "unset it" in err, err
    assert not (tmp_path / "lake").exists()

