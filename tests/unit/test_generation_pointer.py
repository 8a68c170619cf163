"""Which generation a pipeline's readers and writers resolve, without Spark
(`lakehouse.tables.generations`): the registry's newest `active` row names the current
generation's location; a switch is one registry commit, so every reader (delta-rs) sees the
registry before it or after it. Roots switched by the old rename scheme (the current generation
in the pipeline's folder, `location` ".") resolve as before."""

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import write_deltalake
from test_spec_edits import BASE, spec_settings

from lakehouse.config.settings import Settings
from lakehouse.tables import generations as g

T0 = datetime(2026, 11, 27, tzinfo=UTC)


def commit(settings: Settings, *rows: tuple) -> None:
    """Registry rows (settings, status, location) in one Delta commit, as the switch makes them."""
    have = len(g.records(settings))
    write_deltalake(g.home(settings).table_path(g.REGISTRY), pa.table({
        "spec_version": [s.results_version for s, _, _ in rows],
        "status": [status for _, status, _ in rows],
        "spec": [json.dumps(s.results_inputs, sort_keys=True) for s, _, _ in rows],
        "location": [where for _, _, where in rows],
        "note": [None] * len(rows), "not_rebuildable": [None] * len(rows),
        "run_id": [None] * len(rows), "replaces": [None] * len(rows),
        "recorded_at": [T0 + timedelta(minutes=have)] * len(rows),
        "seq": [have + i for i in range(len(rows))]}), mode="append")


def test_the_registry_names_the_current_generation(tmp_path):
    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    _, v1 = spec_settings(tmp_path, base)
    _, v2 = spec_settings(tmp_path, base, dimensions=["currency"])  # a rebuild
    _, v2b = spec_settings(tmp_path, base, dimensions=["currency"],  # in place from v2
                           window={**BASE["window"], "watermark_delay": "1 minute"})
    folder = v1.root
    building = f"{folder}/_generations/{v2.results_version}"

    # No registry, no tables: the pipeline's folder.
    assert g.resolve(v1).root == folder and g.current(v2).root == folder
    commit(v1, (v1, g.ACTIVE, g.HERE))
    assert g.resolve(v1).root == folder and g.resolve(v1).home is None
    assert g.is_current(g.resolve(v1))
    # A rebuild edit writes apart; readers still resolve v1's folder.
    assert (g.resolve(v2).root, g.resolve(v2).home) == (building, folder)
    assert not g.is_current(g.resolve(v2)) and g.location_of(g.resolve(v2)) == \
        f"_generations/{v2.results_version}"
    commit(v2, (v2, g.BUILDING, f"_generations/{v2.results_version}"))
    assert g.current(v2).root == folder and g.current_root(folder) == folder

    # The switch: one commit; nothing moves, the registry names the new folder.
    commit(v1, (v1, g.RETIRED, g.HERE), (v2, g.ACTIVE, f"_generations/{v2.results_version}"))
    for spec in (v1, v2, v2b):
        assert g.current(spec).root == building
    assert g.current_root(folder) == building and g.current_root(f"file://{folder}") == building
    assert g.resolve(v2).root == building and g.is_current(g.resolve(v2))
    assert g.pending_change(g.resolve(v2)) is None
    # An in-place edit of the switched-in generation writes its folder, once the stream applies
    # it (until then other writers refuse).
    assert g.resolve(v2b).root == building
    assert g.pending_change(g.resolve(v2b)).kind == "in_place"
    commit(v2b, (v2b, g.ACTIVE, f"_generations/{v2.results_version}"))
    assert g.pending_change(g.resolve(v2b)) is None and g.current_root(folder) == building
    # Going back to v1's spec is a rebuild of its own, never the retired folder in place.
    assert g.resolve(v1).root == f"{folder}/_generations/{v1.results_version}"


def test_a_root_switched_by_renaming_resolves_as_before(tmp_path):
    """The old scheme moved the new generation into the folder (`active` at "."), the old one
    to `_generations/<old version>` (`retired`)."""
    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    _, v1 = spec_settings(tmp_path, base)
    _, v2 = spec_settings(tmp_path, base, dimensions=["currency"])
    commit(v1, (v1, g.ACTIVE, g.HERE))
    commit(v2, (v2, g.BUILDING, f"_generations/{v2.results_version}"))
    commit(v2, (v2, g.SWITCHING, f"_generations/{v2.results_version}"),
           (v1, g.RETIRED, f"_generations/{v1.results_version}"))
    commit(v2, (v2, g.ACTIVE, g.HERE))
    assert g.resolve(v2).root == v1.root and g.resolve(v2).home is None
    assert g.current_root(v1.root) == v1.root
    assert g.resolve(v1).root == f"{v1.root}/_generations/{v1.results_version}"


def test_locations_on_an_object_store_are_the_same_strings(tmp_path):
    base = Settings.from_env({"LAKEHOUSE_ROOT": "s3a://bucket/lake/"})
    _, spec = spec_settings(tmp_path, base)
    gen = g.at(spec, "_generations/0123456789ab")
    assert gen.root == f"{spec.root}/_generations/0123456789ab" and gen.home == spec.root
    assert spec.root.startswith("s3a://bucket/lake/")
    assert g.location_of(gen) == "_generations/0123456789ab" and g.location_of(spec) == g.HERE
    assert g.at(gen, g.HERE) == g.home(gen)
    assert gen.table_path("bronze_events").startswith("s3a://bucket/lake/")
