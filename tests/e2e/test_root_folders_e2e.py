"""What a real default pipeline wrote at its root (the end-to-end scenario: stream catch-ups,
corrections, replays, the checks, the timeline, through Dagster) is in the one list of root
folders that spec names are checked against."""

from lakehouse.tables import catalog


def test_every_folder_the_scenario_wrote_at_its_root_is_a_reserved_name(scenario):
    settings = scenario[0]
    written = {p.name for p in settings.local_root.iterdir()}
    assert written <= catalog.ROOT_FOLDERS, written - catalog.ROOT_FOLDERS
    # It wrote tables and the special folders a run writes (not a listing of nothing).
    assert {catalog.BRONZE.name, catalog.RECONCILED.name, catalog.CHECKPOINTS_DIR,
            catalog.LOCKS_DIR} <= written
