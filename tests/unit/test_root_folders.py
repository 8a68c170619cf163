"""The folders of the default pipeline's root are one list (`catalog.ROOT_FOLDERS`), and a spec
named after any of them is refused with the key and the folder named."""

from pathlib import Path

import pytest

from lakehouse.config.settings import Settings
from lakehouse.specs.pipeline import SpecError, parse_spec
from lakehouse.tables import catalog, generations
from lakehouse.tables.catalog import ROOT_FOLDERS
from lakehouse.tables.locks import checkpoint_lock

FIELDS = {"order_id": "string", "created_at": "timestamp", "region": "string",
          "amount": "decimal(18,2)"}
BASE = {"name": "orders", "topic": "orders", "fields": FIELDS, "event_id": "order_id",
        "event_time": {"field": "created_at"}, "dimensions": ["region"],
        "measures": [{"field": "amount"}]}


@pytest.mark.parametrize("key", ["name", "tables"])
@pytest.mark.parametrize("folder", sorted(ROOT_FOLDERS))
def test_a_spec_named_after_a_root_folder_is_refused_naming_the_key(key, folder):
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, key: folder}, "orders.yaml")
    assert str(error.value) == (
        f"orders.yaml: {key} {folder!r} is a folder the default pipeline uses "
        f"($LAKEHOUSE_ROOT/{folder}): choose another {key}")


def test_a_name_beside_the_root_folders_is_accepted():
    spec = parse_spec({**BASE, "name": "checkpoints", "tables": "spec_generations_2"})
    assert spec.folder == "spec_generations_2"


def _top(root: Path, path: str | Path) -> str:
    return Path(path).relative_to(root).parts[0]


def test_the_list_is_exactly_the_folders_the_pipeline_code_writes(tmp_path):
    """Every writer of the root that runs without a JVM is run (the lock takes its file) or asked
    for its path; together they name the list, no more, no fewer (the tables from the catalog
    the Spark jobs create them from)."""
    from expectations.reconciliation import data_docs_dir
    from spark_jobs.session import spark_conf

    root = tmp_path / "lakehouse"
    settings = Settings.from_env({"LAKEHOUSE_ROOT": str(root)})
    with checkpoint_lock(settings):
        pass
    written = {p.name for p in root.iterdir()}
    assert written == {catalog.LOCKS_DIR}  # the lock's file, really written
    paths = [
        settings.checkpoint_path(catalog.INGEST_QUERY),
        data_docs_dir(settings),
        spark_conf(settings)["spark.sql.warehouse.dir"],
        generations.building_dir(settings, "0123456789ab"),
        settings.table_path(generations.REGISTRY),
        *(settings.table_path(t.name) for t in catalog.ALL_TABLES),
    ]
    named = written | {_top(root, p) for p in paths}
    assert named == ROOT_FOLDERS
    assert {"spec_generations", "_generations", "_warehouse", "_checkpoints", "_locks",
            "reports", "bronze_events"} <= ROOT_FOLDERS
