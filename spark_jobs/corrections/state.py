"""Per-date corrections state (append-only `corrections_state`) and the plan it implies:
recompute the whole date, or only the windows bronze changes touched since its last run."""

from __future__ import annotations

from datetime import UTC, date, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import CORRECTIONS_STATE, RECONCILED
from lakehouse.tables.commit_tags import PIPELINE_TAG
from lakehouse.tables.generations import in_place_since
from lakehouse.tables.state_rows import latest_row
from spark_jobs.tables import read_changes
from spark_jobs.writer import Writer


def latest_state(settings: Settings, d: date):
    """The date's newest state row (the table is append-only: one row per run). Ordered by the
    gold version each run started from (runs of one date are serialized, so it only grows),
    then by time: a run that started earlier but finished later cannot pass for the newest."""
    return latest_row(settings, CORRECTIONS_STATE.name, d, ("reconciled_version", "updated_at"))


def gold_bronze_version(settings: Settings, d: date) -> int | None:
    """The bronze version the date's gold rows were last computed from (None: never)."""
    state = latest_state(settings, d)
    return state.bronze_version if state is not None else None


def save_state(writer: Writer, d: date, bronze_version: int, reconciled_version: int, mode: str,
               run_id: str) -> None:
    writer.append_rows(CORRECTIONS_STATE, [{
        "event_date": d, "bronze_version": bronze_version,
        "reconciled_version": reconciled_version, "mode": mode, "run_id": run_id,
        "updated_at": datetime.now(UTC)}])


def foreign_gold_commits(spark: SparkSession, settings: Settings, d: date, since: int,
                         current: int) -> list[int]:
    """Commits in (since, current] that changed gold rows of `d` without the pipeline's tag."""
    if current <= since:
        return []
    # The commit infos from the Delta log (delta-rs: no Spark job), newest first down to `since`.
    log = delta_log.open_table(settings, RECONCILED.name)
    foreign = [
        c["version"] for c in (log.history(log.version() - since) if log is not None else [])
        if since < c["version"] <= current
        and not (c.get("userMetadata") or "").startswith(PIPELINE_TAG)
    ]
    if not foreign:
        return []
    touched = (
        read_changes(spark, settings, RECONCILED, min(foreign), current)
        .where((F.col("event_date") == F.lit(d)) & F.col("_commit_version").isin(foreign))
        .select("_commit_version").distinct().collect()
    )
    return sorted(r._commit_version for r in touched)


def plan(spark: SparkSession, settings: Settings, d: date, state, gold_version: int,
          bronze_version: int) -> tuple[str, str]:
    """`incremental` or `full`, with the reason."""
    if state is None:
        return "full", "first run for the date"
    since = in_place_since(settings)
    if since is not None and state.updated_at < since:
        return "full", (f"gold was computed before spec version {settings.results_version} "
                        f"took the folder in place ({since:%Y-%m-%d %H:%M:%S} UTC): every "
                        "window gains the new columns")
    if state.bronze_version > bronze_version:  # asked for an older input than gold's
        return "full", (f"gold was computed from bronze version {state.bronze_version}, newer "
                        f"than this run's version {bronze_version}")
    foreign = foreign_gold_commits(spark, settings, d, state.reconciled_version, gold_version)
    if foreign:
        return "full", f"reconciled_aggregates changed outside the pipeline (versions {foreign})"
    return "incremental", f"bronze changes after version {state.bronze_version}"
