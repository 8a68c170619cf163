"""Per-date batch assets: corrections (changelog + gold) and the replay from Kafka."""


import time
from datetime import date

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    multi_asset,
)

from assets.partitions import daily_event_dates
from assets.resources import LakehouseResource, SparkResource
from spark_jobs.corrections import gold_bronze_version, run_corrections
from spark_jobs.replay import ReplayIncomplete, replayed_in_run, run_replay
from spark_jobs.tables import CORRECTIONS, RECONCILED, REPLAY


def partition_dates(context: AssetExecutionContext) -> list[date]:
    """The run's dates: one partition, or a range in a single-run backfill."""
    return [date.fromisoformat(k) for k in context.partition_keys]


def assets_in_run(context: AssetExecutionContext) -> set[str]:
    """Every asset this run materializes (not only this op's)."""
    keys = context.run.asset_selection or context.job_def.asset_layer.selected_asset_keys
    return {k.to_user_string() for k in keys}


class CorrectionsConfig(Config):
    reprocess: bool = False
    """Rebuild the dates from replay_aggregates (after a bug fix or a changed window size)
    instead of applying bronze changes; every changed window becomes a `reprocess` correction.
    Select replay_aggregates in the same run so the replay is fresh."""


PER_DATE_SCHEMA = TableSchema(columns=[
    TableColumn("event_date", "string"), TableColumn("mode", "string"),
    TableColumn("reason", "string"), TableColumn("windows_recomputed", "int"),
    TableColumn("windows", "int"), TableColumn("inserted", "int"),
    TableColumn("corrected", "int"), TableColumn("finalized", "int"), TableColumn("removed", "int"),
    TableColumn("late_events", "int"), TableColumn("beyond_horizon", "int"),
    TableColumn("watermark", "string"),
])


@multi_asset(
    specs=[
        AssetSpec("late_corrections", deps=["streaming_aggregates"], group_name="reconcile",
                  kinds={"spark", "delta"}, skippable=True,
                  description="Changelog of every change to a published window (before/after, "
                              "revision, cause, run id)."),
        AssetSpec("reconciled_aggregates", deps=["late_corrections", "replay_aggregates"],
                  group_name="reconcile",
                  kinds={"spark", "delta"}, skippable=True,
                  description="Gold: exact per-window aggregates, revisioned, Change Data Feed "
                              "on; proven equal to the replay by a blocking GX check."),
    ],
    partitions_def=daily_event_dates,
    backfill_policy=BackfillPolicy.single_run(),
    can_subset=True,
)
def corrections(context: AssetExecutionContext, config: CorrectionsConfig,
                lakehouse: LakehouseResource, spark: SparkResource):
    """One corrections pass per date writes both tables (the changelog first), so selecting
    either asset runs the same idempotent job."""
    settings = lakehouse.settings
    t0 = time.monotonic()
    run_id = context.run.run_id

    replays = "replay_aggregates" in assets_in_run(context)

    def as_of(d: date) -> int | None:
        # A replay of the date earlier in this run fixes the bronze version to compute from, so
        # the blocking check compares both on the same log prefix. A reprocess without one uses
        # the latest replay (its rows are what a reprocess publishes).
        version = replayed_in_run(spark.session, settings, d, run_id) if replays else None
        if version is None and config.reprocess:
            version = replayed_in_run(spark.session, settings, d, None)
        return version

    results = [
        run_corrections(spark.session, settings, d, run_id=run_id, reprocess=config.reprocess,
                        as_of=as_of(d)).as_metadata()
        for d in partition_dates(context)
    ]
    selected = {k.to_user_string() for k in context.selected_asset_keys}
    per_date = MetadataValue.table(
        records=[TableRecord({c.name: r[c.name] if r[c.name] is not None else "" for c in
                              PER_DATE_SCHEMA.columns}) for r in results],
        schema=PER_DATE_SCHEMA,
    )
    totals = {k: sum(r[k] for r in results) for k in
              ("windows", "windows_recomputed", "inserted", "corrected", "removed", "finalized",
               "beyond_horizon", "late_events")}
    if "late_corrections" in selected:
        yield MaterializeResult(asset_key="late_corrections", metadata={
            "corrections": totals["corrected"],
            "beyond_horizon_not_applied": totals["beyond_horizon"],
            "late_events": totals["late_events"],
            "per_date": per_date,
            "path": MetadataValue.path(settings.table_path(CORRECTIONS.name)),
        })
    if "reconciled_aggregates" in selected:
        yield MaterializeResult(asset_key="reconciled_aggregates", metadata={
            **{(k if k.startswith("windows") else f"windows_{k}"): v
               for k, v in totals.items() if k != "late_events"},
            "modes": MetadataValue.json({r["event_date"]: f"{r['mode']}: {r['reason']}"
                                         for r in results}),
            "seconds_by_stage": MetadataValue.json({r["event_date"]: r["seconds"]
                                                    for r in results}),
            "watermark": results[-1]["watermark"] if results else None,
            "duration_s": round(time.monotonic() - t0, 2),
            "per_date": per_date,
            "path": MetadataValue.path(settings.table_path(RECONCILED.name)),
        })


@asset(key="replay_aggregates", deps=["raw_events"], group_name="reconcile",
       kinds={"spark", "kafka", "delta"}, partitions_def=daily_event_dates,
       backfill_policy=BackfillPolicy.single_run(),
       description="Batch recomputation of the date straight from the Kafka log (not from "
                   "bronze, not from stream state).")
def replay_aggregates(context: AssetExecutionContext, lakehouse: LakehouseResource,
                      spark: SparkResource) -> MaterializeResult:
    settings = lakehouse.settings
    session = spark.session
    # With corrections later in this run: the newest log position (they compute from the same
    # one). Alone (verification): the position the date's gold rows were computed from, or the
    # log end for a date never corrected.
    corrects = bool(assets_in_run(context) & {"reconciled_aggregates", "late_corrections"})
    run_id = context.run.run_id

    def replay(d: date):
        if corrects:
            return run_replay(session, settings, d, run_id=run_id)
        gold = gold_bronze_version(session, settings, d)
        return run_replay(session, settings, d, as_of=gold, run_id=run_id, to_log_end=gold is None)

    try:
        results = [replay(d).as_metadata() for d in partition_dates(context)]
    except ReplayIncomplete as exc:
        raise Failure(description=str(exc), metadata={
            "event_date": exc.event_date.isoformat(),
            "missing_offsets": MetadataValue.json(
                {str(p): {"first_missing": lo, "log_start": hi} for p, (lo, hi) in exc.missing.items()}),
        }) from exc
    return MaterializeResult(metadata={
        "windows": sum(r["windows"] for r in results),
        "events": sum(r["events"] for r in results),
        "records_read": sum(r["records_read"] for r in results),
        "per_date": MetadataValue.json(results),
        "path": MetadataValue.path(settings.table_path(REPLAY.name)),
    })
