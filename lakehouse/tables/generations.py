"""A pipeline's spec generations: which spec version its tables hold, what an edit of the spec
changes, and where a new generation is built until it is switched in. Delta-log reads only; the
writes (records, in-place evolution, the switch) are `spark_jobs.generations`'.

Every pipeline's folder holds a registry table, `spec_generations` (one row per event: a spec
version's `results_inputs` and its status: `active`, `building`, `switching`, `retired`). An
edit of the spec is one of:

- no change of results (another topic, Spark settings): the same generation;
- in place: every table can evolve and bronze still holds every column the new spec reads (a
  new measure aggregate of a field bronze keeps, another watermark delay or correction
  horizon, a wider size or skew limit: MAX_EVENT_BYTES, FUTURE_SKEW, whose quarantined records
  the redrive can then land). The tables gain the new columns (old rows keep their values,
  the new columns are null in them) at the stream's next start, under its writer lock; until
  then other writers of the new spec refuse (`SpecChangePending`), so a running `make stream`
  under the old spec is never mixed with the new one. The dates computed before are stale
  until reprocessed;
- a rebuild: anything else (window size, dimensions, the id or time rules, a field bronze never
  kept, another type, a removed column, a narrower limit). The new generation is built apart, in
  `<folder>/_generations/<version>`, from the Kafka log (its stream starts at the earliest
  retained offset), while the current generation stays where it is, readable and proven.

Generations are switched by reference, never by moving folders (an object store has no rename):
the registry's newest `active` row names the current generation's `location` (`.`: the
pipeline's folder itself, as before any switch and after a switch of the old rename scheme;
else `_generations/<version>`), and every reader and writer resolves it here (`resolve`,
`current`, `current_root`: delta-rs, no Spark). The switch (`spark_jobs.generations.switch`) is
one Delta commit of the registry (the new generation `active`, the old one `retired`), made
under both generations' stream locks and the registry's lock: a reader sees the registry before
it or after it. A retired generation stays readable where it is until `retire` deletes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pydantic import TypeAdapter

from lakehouse.config import storage
from lakehouse.config.settings import Settings
from lakehouse.events.shape import EventShape
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import GENERATIONS_DIR, GENERATIONS_REGISTRY

REGISTRY = GENERATIONS_REGISTRY
REGISTRY_DDL = """spec_version STRING NOT NULL, status STRING NOT NULL, spec STRING NOT NULL,
    location STRING NOT NULL, note STRING, not_rebuildable STRING, run_id STRING,
    replaces STRING, recorded_at TIMESTAMP NOT NULL, seq BIGINT NOT NULL"""
# Bronze is created with the spec it holds (no commit of its own; the registry has rows only
# once the spec changes).
SPEC_PROPERTY, VERSION_PROPERTY = "lakehouse.spec", "lakehouse.specVersion"
ACTIVE, BUILDING, SWITCHING, RETIRED = "active", "building", "switching", "retired"
# A retired generation whose folder `retire` deleted.
DELETED = "deleted"
HERE = "."  # the location of the generation in the pipeline's folder itself
IN_PLACE = "in place from"  # how the note of an in-place edit's row starts
# A generation is built in `<folder>/GENERATIONS_DIR/<version>` (named in the catalog with the
# root's other folders): every table, the checkpoints, the reports and (local root) the locks.
# It stays there once switched in: the registry's row names it.


class SpecChangePending(RuntimeError):
    """The tables hold another spec version than these settings; only the stream's next start
    (under its writer lock) applies the change."""


@dataclass(frozen=True)
class SpecChange:
    kind: Literal["none", "in_place", "rebuild"]
    why: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.kind}: {'; '.join(self.why)}" if self.why else self.kind


def _seconds(text: str) -> float:
    """A `results_inputs` duration (`str(timedelta)`: '0:05:00', '2 days, 1:00:00.5'), in
    seconds (pydantic reads that form back)."""
    return _DURATION.validate_python(text).total_seconds()


_DURATION = TypeAdapter(timedelta)


# The limits whose widening only lets more records pass (each one the reason it quarantines):
# everything the tables hold passes under the wider limit as well, so the edit is in place, and
# the records quarantined for that reason can be given their second chance by the redrive. A
# narrower limit would refuse records the tables hold: a rebuild.
_WIDENED = {"max_event_bytes": (int, "payload_too_large"),
            "future_skew": (_seconds, "event_time_in_future")}


def _columns(shape: EventShape) -> dict[str, str]:
    return dict(shape.measure_columns_typed())


def _read_rules(shape: EventShape, name: str) -> tuple:
    """How a field is read: its type and its path."""
    return shape.fields.get(name), shape.paths.get(name)


def change_between(old: dict, new: dict) -> SpecChange:
    """What going from results inputs `old` to `new` (`Settings.results_inputs`) takes."""
    if old == new:
        return SpecChange("none")
    a, b = EventShape.model_validate(old["shape"]), EventShape.model_validate(new["shape"])
    rebuild: list[str] = []
    widened: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key in ("shape", "watermark_delay", "correction_horizon") or old.get(key) == new.get(key):
            continue
        if key in _WIDENED and _WIDENED[key][0](new[key]) > _WIDENED[key][0](old[key]):
            widened.append(f"{key} {old[key]} -> {new[key]} (records quarantined as "
                           f"{_WIDENED[key][1]} may pass now: redrive them)")
        else:
            rebuild.append(f"{key} {old.get(key)} -> {new.get(key)}")
    for what, x, y in (("event id", a.event_id, b.event_id),
                       ("event time", a.event_time, b.event_time),
                       ("dimensions", a.dimensions, b.dimensions),
                       ("format", (a.format, a.avro), (b.format, b.avro))):
        if x != y:
            rebuild.append(f"{what} changed")
    used = {a.event_id, a.event_time.field, *(d.source for d in a.dimensions), *a.measure_fields}
    for name in sorted(used):
        if _read_rules(a, name) != _read_rules(b, name):
            rebuild.append(f"field {name!r} read as {_read_rules(b, name)} "
                           f"(was {_read_rules(a, name)})")
    if new_fields := set(b.measure_fields) - set(a.measure_fields):
        rebuild.append(f"bronze never kept {', '.join(sorted(new_fields))}: rebuilt from the log")
    if gone := set(a.measure_fields) - set(b.measure_fields):
        rebuild.append(f"measure field {', '.join(sorted(gone))} removed")
    before, after = _columns(a), _columns(b)
    if gone := [c for c in before if c not in after]:
        rebuild.append(f"columns {', '.join(gone)} removed")
    if rebuild:
        return SpecChange("rebuild", tuple(rebuild))
    in_place = [f"new columns {', '.join(c for c in after if c not in before)}"] if len(
        after) > len(before) else []
    in_place += [f"{k} {old[k]} -> {new[k]}" for k in ("watermark_delay", "correction_horizon")
                 if old[k] != new[k]]
    in_place += widened
    return SpecChange("in_place", tuple(in_place or ["spec edited"]))


# ---- the registry ------------------------------------------------------------------------------
def home(settings: Settings) -> Settings:
    """The settings of the pipeline's folder (where the registry lives, and the generation
    written before any switch)."""
    if settings.home is None:
        return settings
    return settings.model_copy(update={"lakehouse_root": settings.home, "home": None})


def building_dir(settings: Settings, version: str) -> str:
    return storage.join(settings.pipeline_root, GENERATIONS_DIR, version)


def location_of(settings: Settings) -> str:
    """Where `settings` write, relative to the pipeline's folder: `HERE` or
    `_generations/<version>`."""
    if settings.home is None:
        return HERE
    return settings.root[len(storage.normalize_root(settings.home)):].strip("/") or HERE


def at(settings: Settings, location: str) -> Settings:
    """`settings` writing the generation at `location` (relative to the pipeline's folder)."""
    folder = home(settings)
    if location in (HERE, ""):
        return folder
    return folder.model_copy(update={"lakehouse_root": storage.join(folder.root, location),
                                     "home": folder.root})


def records(settings: Settings) -> list[dict]:
    """The registry's rows, oldest first (empty before the pipeline's first stream start)."""
    table = delta_log.open_table(home(settings), REGISTRY)
    if table is None:
        return []
    rows = table.to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["recorded_at"], r["seq"]))


def latest_by_version(rows: list[dict]) -> dict[str, dict]:
    """Each spec version's latest row."""
    return {r["spec_version"]: r for r in rows}


def active(settings: Settings, rows: list[dict] | None = None) -> dict | None:
    """The current generation: the registry's latest `active` row (or `switching`: a switch of
    the old rename scheme that did not finish), whose `location` says where its tables are;
    before any change, the spec its bronze table in the pipeline's folder was created under
    (`SPEC_PROPERTY`); None for a folder without tables (or created before 2026-11-26 without
    the property: its stream's next start records it)."""
    rows = records(settings) if rows is None else rows
    current = [r for r in latest_by_version(rows).values() if r["status"] in (ACTIVE, SWITCHING)]
    if current:
        return max(current, key=lambda r: (r["recorded_at"], r["seq"]))
    bronze = delta_log.open_table(home(settings), "bronze_events")
    spec = None if bronze is None else bronze.metadata().configuration.get(SPEC_PROPERTY)
    if spec is None:
        return None
    version = bronze.metadata().configuration.get(VERSION_PROPERTY)
    return {"spec_version": version, "spec": spec, "status": ACTIVE, "location": HERE}


def current(settings: Settings, rows: list[dict] | None = None) -> Settings:
    """`settings` in the folder of the current generation, whatever spec they hold: what a
    reader of the pipeline's tables opens."""
    found = active(settings, rows)
    return at(settings, HERE if found is None else found.get("location") or HERE)


def current_root(pipeline_root: str) -> str:
    """The folder of a pipeline's current generation, for a reader with only the pipeline's
    folder (a URI: local, file://, s3a://) and no spec: delta-rs reads the registry."""
    return current(Settings.from_env({**os.environ, "LAKEHOUSE_ROOT": pipeline_root})).root


def is_current(settings: Settings, rows: list[dict] | None = None) -> bool:
    """Whether `settings` write the current generation (else: one being built)."""
    found = active(settings, rows)
    return location_of(settings) == (HERE if found is None else found.get("location") or HERE)


def in_place_since(settings: Settings, rows: list[dict] | None = None):
    """When the spec version these settings write took their generation's folder by an in-place
    edit (the row `apply_spec` recorded): gold rows computed before then lack its new columns.
    None when the folder's tables were created or rebuilt under it."""
    rows = records(settings) if rows is None else rows
    where = location_of(settings)
    return next((r["recorded_at"] for r in rows
                 if r["spec_version"] == settings.results_version and r["status"] == ACTIVE
                 and (r.get("location") or HERE) == where
                 and (r["note"] or "").startswith(IN_PLACE)), None)


def resolve(settings: Settings) -> Settings:
    """The settings of the generation these settings' spec writes: the current generation's
    folder (the registry names it), unless it holds a spec version the spec cannot evolve into
    in place; then the building generation's folder, `_generations/<version>`."""
    folder = home(settings)
    found = active(folder)
    if found is None:
        return folder
    here = at(folder, found.get("location") or HERE)
    if found["spec_version"] == settings.results_version:
        return here
    change = change_between(json.loads(found["spec"]), settings.results_inputs)
    if change.kind != "rebuild":
        return here
    building = at(folder, f"{GENERATIONS_DIR}/{settings.results_version}")
    if building.root == here.root:
        raise SpecChangePending(
            f"pipeline {settings.pipeline!r}: spec version {settings.results_version} needs a "
            f"rebuild ({change.describe()}), but its folder {building.root} holds the current "
            "generation (an in-place edit of it since); point the spec's `tables` at a new "
            "folder")
    return building


def pending_change(settings: Settings, rows: list[dict] | None = None) -> SpecChange | None:
    """An in-place change these settings' spec makes and the stream has not applied yet."""
    rows = records(settings) if rows is None else rows
    found = active(settings, rows)
    if found is None or not is_current(settings, rows) or found["spec_version"] == \
            settings.results_version:
        return None
    return change_between(json.loads(found["spec"]), settings.results_inputs)


def require_applied(settings: Settings) -> None:
    """Refuse to write tables that hold another spec version, or that a switch of the old
    rename scheme left half moved (`SpecChangePending`)."""
    rows = records(settings)
    found = active(settings, rows)
    if found is not None and found["status"] == SWITCHING:
        raise SpecChangePending(
            f"pipeline {settings.pipeline!r}: the switch to spec version "
            f"{found['spec_version']} did not finish: run switch_generation to finish it")
    change = pending_change(settings, rows)
    if change is not None:
        raise SpecChangePending(
            f"pipeline {settings.pipeline!r}: the tables under {settings.root} hold another spec "
            f"version than {settings.results_version} ({change.describe()}); the stream applies "
            "the change at its next start, under its writer lock (restart make stream, or run "
            "the stream catch-up), then rerun this")
