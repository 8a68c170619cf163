"""The writes of a pipeline's spec generations (`lakehouse.tables.generations` says what they are):
the registry's records, the in-place evolution of the tables at the stream's start, and the
switch of a rebuilt generation into the pipeline's folder."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from lakehouse.config.settings import Settings
from lakehouse.config.storage import local_path
from lakehouse.kafka.admin import topic_offsets
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import (
    ALL_TABLES,
    CHECKPOINTS_DIR,
    CORRECTIONS_STATE,
    REPLAY_STATE,
    REPORTS_DIR,
)
from lakehouse.tables.generations import (
    ACTIVE,
    BUILDING,
    GENERATIONS_DIR,
    IN_PLACE,
    REGISTRY,
    REGISTRY_DDL,
    RETIRED,
    SWITCHING,
    active,
    building_dir,
    change_between,
    home,
    latest_by_version,
    records,
)
from lakehouse.tables.locks import checkpoint_lock
from lakehouse.tables.reads import bronze_dates, compare_tables, read
from spark_jobs.replay import missing_offsets

# What a generation is made of, besides its tables: moved with them by a switch.
GENERATION_DIRS = (CHECKPOINTS_DIR, REPORTS_DIR)


def record(spark: SparkSession, settings: Settings, status: str, note: str | None = None,
           not_rebuildable: dict | None = None, run_id: str | None = None,
           replaces: str | None = None) -> None:
    """Append a row for the spec version of `settings` to the registry."""
    folder = home(settings)
    location = "." if settings.home is None else f"{GENERATIONS_DIR}/{settings.results_version}"
    _append(spark, folder, (settings.results_version, status,
                            json.dumps(settings.results_inputs, sort_keys=True), location, note,
                            json.dumps(not_rebuildable) if not_rebuildable else None, run_id,
                            replaces))


def _append(spark: SparkSession, folder: Settings, row: tuple) -> None:
    """One registry row, stamped with the time and its sequence number."""
    stamped = (*row, datetime.now(UTC), len(records(folder)))
    (spark.createDataFrame([stamped], REGISTRY_DDL).write.format("delta").mode("append")
     .save(folder.table_path(REGISTRY)))


def apply_spec(spark: SparkSession, settings: Settings) -> str | None:
    """At the stream's start, under its writer lock: record the generation it writes and apply
    an in-place change of the spec (`evolve`). Returns what it did, None when nothing."""
    rows = records(settings)
    mine = latest_by_version(rows).get(settings.results_version)
    if settings.home is not None:  # a generation being built
        if mine is None or mine["status"] == RETIRED:
            record(spark, settings, BUILDING, note="rebuilt from the Kafka log")
            return f"building spec version {settings.results_version} apart"
        return None
    current = active(settings, rows)
    if current is not None and current["status"] == SWITCHING:
        raise RuntimeError(f"pipeline {settings.pipeline!r}: the switch to spec version "
                           f"{current['spec_version']} did not finish: run switch_generation")
    if current is None:  # tables created before spec versions were stamped on bronze
        if not delta_log.exists(settings, "bronze_events"):
            return None
        record(spark, settings, ACTIVE, note="assumed: the tables predate spec versions")
        return f"spec version {settings.results_version} recorded"
    if current["spec_version"] == settings.results_version:
        return None
    change = change_between(json.loads(current["spec"]), settings.results_inputs)
    if change.kind == "rebuild":  # resolve() sends such settings to a building generation
        raise RuntimeError(f"pipeline {settings.pipeline!r}: spec version "
                           f"{settings.results_version} needs a rebuild ({change.describe()})")
    added = evolve(spark, settings)
    record(spark, settings, ACTIVE, note=f"{IN_PLACE} {current['spec_version']}: "
                                         f"{change.describe()}")
    return (f"spec version {current['spec_version']} -> {settings.results_version} in place "
            f"({change.describe()}); columns added: {added or 'none'}")


def evolve(spark: SparkSession, settings: Settings) -> dict[str, list[str]]:
    """Add the columns the spec's tables have and the existing ones lack (Delta schema
    evolution, one ALTER TABLE commit per table; old rows read null in them)."""
    added: dict[str, list[str]] = {}
    for table in ALL_TABLES:
        found = delta_log.open_table(settings, table.name, without_files=True)
        if found is None:
            continue
        have = {f.name for f in found.schema().fields}
        target: StructType = spark.createDataFrame([], table.ddl_for(settings.shape)).schema
        missing = [f for f in target.fields if f.name not in have]
        if missing:
            columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            spark.sql(f"ALTER TABLE delta.`{settings.table_path(table.name)}` "
                      f"ADD COLUMNS ({columns})")
            added[table.name] = [f.name for f in missing]
    return added


# ---- the switch --------------------------------------------------------------------------------
@dataclass
class SwitchReport:
    old_version: str | None
    new_version: str
    proven: list[date] = field(default_factory=list)
    not_rebuildable: dict[str, str] = field(default_factory=dict)  # date -> why
    unproven: dict[str, str] = field(default_factory=dict)  # date -> what is missing
    switched: bool = False

    def as_metadata(self) -> dict:
        return {"old_version": self.old_version, "new_version": self.new_version,
                "dates_proven": len(self.proven), "not_rebuildable": self.not_rebuildable,
                "unproven": self.unproven, "switched": self.switched}


class SwitchRefused(RuntimeError):
    def __init__(self, message: str, report: SwitchReport):
        super().__init__(message)
        self.report = report


def verdicts(spark: SparkSession, settings: Settings) -> SwitchReport:
    """Every date of either generation, judged in the building one: proven (its replay from the
    log exists and gold equals it), not rebuildable (the retained log no longer holds every
    record of the date), or not proven yet (what is missing)."""
    folder = home(settings)
    current = active(folder)
    report = SwitchReport(current and current["spec_version"], settings.results_version)
    replayed = _dates_of(settings, REPLAY_STATE.name)
    corrected = _dates_of(settings, CORRECTIONS_STATE.name)
    offsets = topic_offsets(settings)  # one broker round trip for every date
    for d in sorted(bronze_dates(folder) | bronze_dates(settings)):
        if (gap := missing_offsets(spark, settings, d, offsets)) is not None:
            report.not_rebuildable[d.isoformat()] = str(gap)
        elif d not in replayed or d not in corrected:
            report.unproven[d.isoformat()] = "not rebuilt yet: reprocess the date"
        elif (diff := compare_tables(settings, d)) != 0:
            report.unproven[d.isoformat()] = f"{diff} windows differ between gold and the replay"
        else:
            report.proven.append(d)
    return report


def _dates_of(settings: Settings, table: str) -> set[date]:
    if not delta_log.exists(settings, table):
        return set()
    return set(read(settings, table).column("event_date").to_pylist())


def switch(spark: SparkSession, settings: Settings, run_id: str | None = None,
           accept_not_rebuildable: bool = False) -> SwitchReport:
    """Switch the building generation of `settings` in: once every date is proven in it (or, with
    `accept_not_rebuildable`, reported as not rebuildable), under both generations' stream locks,
    the folder's tables, checkpoints and reports move to `_generations/<old version>` and the
    new generation's into the folder. The registry records the switch (`switching`) and the old
    generation's retirement before the moves and the new one `active` after: a switch that died
    between is finished by the next one (each move is done once). Local roots only: an object
    store has no rename."""
    folder = home(settings)
    current = active(folder)
    if settings.home is None and not (current is not None and current["status"] == SWITCHING
                                      and current["spec_version"] == settings.results_version):
        raise SwitchRefused(f"pipeline {settings.pipeline!r}: no generation is being built "
                            f"(the folder holds spec version {settings.results_version})",
                            SwitchReport(settings.results_version, settings.results_version))
    building_settings = settings.model_copy(update={
        "lakehouse_root": building_dir(settings, settings.results_version),
        "home": folder.root})
    if settings.home is None:  # finishing a switch that died: it was proven before it began
        report = SwitchReport(current["replaces"], settings.results_version,
                              not_rebuildable=json.loads(current["not_rebuildable"] or "{}"))
    else:
        report = verdicts(spark, settings)
        if report.unproven or (report.not_rebuildable and not accept_not_rebuildable):
            raise SwitchRefused(
                f"pipeline {settings.pipeline!r}: spec version {report.new_version} is not "
                f"switched in: {len(report.unproven)} dates not proven "
                f"({_listed(report.unproven)}), {len(report.not_rebuildable)} not rebuildable "
                f"from the log ({_listed(report.not_rebuildable)}"
                + ("; accept them with accept_not_rebuildable" if report.not_rebuildable else "")
                + ")", report)
    root, building = local_path(folder.root), local_path(building_settings.root)
    if root is None or building is None:
        raise SwitchRefused("a generation switch renames folders: local roots only (on an "
                            "object store, point the spec's `tables` at a new folder)", report)
    old = report.old_version
    with ExitStack() as locks:
        locks.enter_context(checkpoint_lock(folder))
        locks.enter_context(checkpoint_lock(building_settings))
        if settings.home is not None:
            current = active(folder)  # read again under the locks, before the switch records
            record(spark, settings, SWITCHING, note=f"from {old}", run_id=run_id,
                   not_rebuildable=report.not_rebuildable or None, replaces=old)
            if current is not None:
                _append(spark, folder, (old, RETIRED, current["spec"],
                                        f"{GENERATIONS_DIR}/{old}",
                                        f"switched out for {report.new_version}", None, run_id,
                                        None))
        _trade_places(root, building, root / GENERATIONS_DIR / (old or "unversioned"))
        # `folder` holds the new spec (it is `settings` in the pipeline's folder).
        record(spark, folder, ACTIVE, note=f"switched in from {GENERATIONS_DIR}/"
               f"{report.new_version}, replacing {old}", run_id=run_id,
               not_rebuildable=report.not_rebuildable or None, replaces=old)
    report.switched = True
    return report


def _trade_places(root, building, retired) -> None:
    """The old generation out of the folder, then the new one in; each move once (what a
    switch that died had moved stays where it went)."""
    names = [t.name for t in ALL_TABLES] + list(GENERATION_DIRS)
    for name in names:
        if (root / name).exists() and not (retired / name).exists():
            retired.mkdir(parents=True, exist_ok=True)
            (root / name).rename(retired / name)
    for name in names:
        if (building / name).exists() and not (root / name).exists():
            (building / name).rename(root / name)


def _listed(dates: dict[str, str]) -> str:
    return ", ".join(sorted(dates)) or "none"

