"""The writes of a pipeline's spec generations (`lakehouse.tables.generations` says what they are):
the registry's records, the in-place evolution of the tables at the stream's start, the switch
to a rebuilt generation (one registry commit: no folder moves) and the retirement of an old one
(its folder deleted)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import SparkSession

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.config.storage import local_path
from lakehouse.kafka.admin import topic_offsets
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import (
    ALL_TABLES,
    CHECKPOINTS_DIR,
    CORRECTIONS_STATE,
    LOCKS_DIR,
    REPLAY_STATE,
    REPORTS_DIR,
)
from lakehouse.tables.generations import (
    ACTIVE,
    BUILDING,
    DELETED,
    GENERATIONS_DIR,
    HERE,
    IN_PLACE,
    REGISTRY,
    REGISTRY_DDL,
    RETIRED,
    SWITCHING,
    active,
    at,
    change_between,
    home,
    is_current,
    latest_by_version,
    location_of,
    records,
)
from lakehouse.tables.locks import checkpoint_lock, registry_lock
from lakehouse.tables.reads import bronze_dates, compare_tables, read
from spark_jobs.replay import missing_offsets
from spark_jobs.writer import Writer, add_missing_columns

# What a generation is made of, besides its tables (deleted with them when it is retired).
GENERATION_DIRS = (CHECKPOINTS_DIR, REPORTS_DIR)


def record(spark: SparkSession, settings: Settings, status: str, note: str | None = None,
           not_rebuildable: dict | None = None, run_id: str | None = None,
           replaces: str | None = None) -> None:
    """Append a row for the spec version of `settings` (at their location) to the registry."""
    _append(spark, home(settings), [_row(settings, status, note, not_rebuildable, run_id,
                                         replaces)])


def _row(settings: Settings, status: str, note: str | None = None,
         not_rebuildable: dict | None = None, run_id: str | None = None,
         replaces: str | None = None) -> tuple:
    return (settings.results_version, status, json.dumps(settings.results_inputs, sort_keys=True),
            location_of(settings), note, json.dumps(not_rebuildable) if not_rebuildable else None,
            run_id, replaces)


def _append(spark: SparkSession, folder: Settings, rows: list[tuple], check=None) -> None:
    """Registry rows in one commit, stamped with the time and their sequence numbers, under the
    registry's lock; `check(rows)` first sees the registry as it is under the lock (and may
    refuse)."""
    with registry_lock(folder) as fence:
        have = records(folder)
        if check is not None:
            check(have)
        now = datetime.now(UTC)
        stamped = [(*row, now, len(have) + i) for i, row in enumerate(rows)]
        Writer(spark, folder, fence).append(spark.createDataFrame(stamped, REGISTRY_DDL),
                                            REGISTRY)


def apply_spec(writer: Writer) -> str | None:
    """At the stream's start, by its writer (under its lock): record the generation it writes
    and apply an in-place change of the spec (`evolve`). Returns what it did, None when
    nothing."""
    spark, settings = writer.spark, writer.settings
    rows = records(settings)
    mine = latest_by_version(rows).get(settings.results_version)
    if not is_current(settings, rows):  # a generation being built
        if mine is None or mine["status"] in (RETIRED, DELETED):
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
    added = evolve(writer)
    record(spark, settings, ACTIVE, note=f"{IN_PLACE} {current['spec_version']}: "
                                         f"{change.describe()}")
    return (f"spec version {current['spec_version']} -> {settings.results_version} in place "
            f"({change.describe()}); columns added: {added or 'none'}")


def evolve(writer: Writer) -> dict[str, list[str]]:
    """Add the columns the spec's tables have and the existing ones lack (Delta schema
    evolution, one ALTER TABLE commit per table; old rows read null in them)."""
    return {t.name: added for t in ALL_TABLES if (added := add_missing_columns(writer, t))}


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
    old = at(folder, HERE if current is None else current.get("location") or HERE)
    for d in sorted(bronze_dates(old) | bronze_dates(settings)):
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
    """Switch to the generation `settings` build, once every date is proven in it (or, with
    `accept_not_rebuildable`, reported as not rebuildable): under both generations' stream locks
    and the registry's lock, one registry commit names it current (`active`, its location) and
    retires the old one, which stays readable where it is until `retire` deletes it. Nothing
    moves, so it is the same on a local root and an object store. A switch of the old rename
    scheme that died midway (`switching`) is finished the old way (local roots)."""
    folder = home(settings)
    rows = records(folder)
    current = active(folder, rows)
    if current is not None and current["status"] == SWITCHING:
        return _finish_renaming(spark, settings, current, run_id)
    if is_current(settings, rows):
        raise SwitchRefused(f"pipeline {settings.pipeline!r}: no generation is being built "
                            f"(spec version {settings.results_version} is the current one)",
                            SwitchReport(settings.results_version, settings.results_version))
    report = verdicts(spark, settings)
    if report.unproven or (report.not_rebuildable and not accept_not_rebuildable):
        raise SwitchRefused(
            f"pipeline {settings.pipeline!r}: spec version {report.new_version} is not "
            f"switched in: {len(report.unproven)} dates not proven "
            f"({_listed(report.unproven)}), {len(report.not_rebuildable)} not rebuildable "
            f"from the log ({_listed(report.not_rebuildable)}"
            + ("; accept them with accept_not_rebuildable" if report.not_rebuildable else "")
            + ")", report)
    old, where = report.old_version, HERE if current is None else current.get("location") or HERE
    new_row = _row(settings, ACTIVE, note=f"switched in, replacing {old} (at {where})",
                   not_rebuildable=report.not_rebuildable or None, run_id=run_id, replaces=old)

    def unchanged(now: list[dict]) -> None:
        again = active(folder, now)
        if (again and (again["spec_version"], again.get("location"))) != \
                (current and (current["spec_version"], current.get("location"))):
            raise SwitchRefused(f"pipeline {settings.pipeline!r}: the current generation changed "
                                "while the switch was proving dates: run it again", report)

    with ExitStack() as locks:
        locks.enter_context(checkpoint_lock(at(folder, where)))
        locks.enter_context(checkpoint_lock(settings))
        # Every version whose rows name the old location is retired with it (an in-place edit
        # of a generation leaves its earlier versions' rows there too).
        retiring = [r for r in latest_by_version(rows).values()
                    if r["status"] == ACTIVE and (r.get("location") or HERE) == where]
        if current is not None and not any(r["spec_version"] == old for r in retiring):
            retiring.append(current)
        retired = [(r["spec_version"], RETIRED, r["spec"], where,
                    f"switched out for {report.new_version}", None, run_id, None)
                   for r in retiring]
        _append(spark, folder, [*retired, new_row], check=unchanged)
    report.switched = True
    return report


def retire(spark: SparkSession, settings: Settings, version: str,
           run_id: str | None = None) -> str:
    """Delete the folder of the retired generation of spec version `version` (its tables,
    checkpoints and reports; in the pipeline's folder itself, for the generation a first switch
    left there: only those), under its stream lock, and record it `deleted`. Refused for the
    current generation and one being built. Returns its location."""
    folder = home(settings)
    rows = records(folder)
    latest = latest_by_version(rows).get(version)
    if latest is None:
        raise ValueError(f"pipeline {settings.pipeline!r}: no generation of spec version "
                         f"{version!r} (the registry has {sorted(latest_by_version(rows))})")
    where = latest.get("location") or HERE
    if latest["status"] != RETIRED:
        raise ValueError(f"pipeline {settings.pipeline!r}: spec version {version} is "
                         f"{latest['status']}, not retired: only a generation a switch "
                         "replaced can be retired")
    users = [r["spec_version"] for r in latest_by_version(rows).values()
             if r["status"] in (ACTIVE, BUILDING, SWITCHING)
             and (r.get("location") or HERE) == where]
    if users:
        raise ValueError(f"pipeline {settings.pipeline!r}: the folder {where} of spec version "
                         f"{version} is in use by {', '.join(users)}")
    gen = at(folder, where)
    with checkpoint_lock(gen):  # no runner of the old spec is still writing it
        if where == HERE:
            for name in [t.name for t in ALL_TABLES] + list(GENERATION_DIRS):
                storage.delete_tree(gen.path(name))
        else:
            for name in storage.list_names(gen.root):  # the held lock's file last (local)
                if name != LOCKS_DIR:
                    storage.delete_tree(gen.path(name))
        gone = [r for r in latest_by_version(rows).values()
                if r["status"] == RETIRED and (r.get("location") or HERE) == where]
        _append(spark, folder, [(r["spec_version"], DELETED, r["spec"], where,
                                 f"folder deleted (retired: {r['note']})", None, run_id, None)
                                for r in gone])
    if where != HERE:
        storage.delete_tree(gen.root)
    return where


def _finish_renaming(spark: SparkSession, settings: Settings, current: dict,
                     run_id: str | None) -> SwitchReport:
    """Finish a switch of the old rename scheme that died between its moves (local roots: the
    only ones it ran on); it was proven before it began."""
    folder = home(settings)
    report = SwitchReport(current["replaces"], current["spec_version"],
                          not_rebuildable=json.loads(current["not_rebuildable"] or "{}"))
    root = local_path(folder.root)
    if root is None:
        raise SwitchRefused("a switch of the old rename scheme ran on local roots only", report)
    building = root / GENERATIONS_DIR / report.new_version
    with ExitStack() as locks:
        locks.enter_context(checkpoint_lock(folder))
        locks.enter_context(checkpoint_lock(at(folder, f"{GENERATIONS_DIR}/"
                                                       f"{report.new_version}")))
        _trade_places(root, building, root / GENERATIONS_DIR / (report.old_version
                                                                or "unversioned"))
        # The switched-in spec, in the pipeline's folder (the row's own spec, not `settings`').
        _append(spark, folder, [(report.new_version, ACTIVE, current["spec"], HERE,
                                 f"switched in from {GENERATIONS_DIR}/{report.new_version}, "
                                 f"replacing {report.old_version}", current["not_rebuildable"],
                                 run_id, report.old_version)])
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

