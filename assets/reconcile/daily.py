"""Per-date batch assets: corrections (changelog + gold) and the replay from Kafka."""


import time
from datetime import date
from functools import cache

import dagster as dg

from assets.pipelines import Pipeline
from assets.reconcile.log_position import version_for
from assets.resources import LakehouseResource, LogPositionResource, SparkResource
from expectations import import_in_background
from lakehouse.kafka.log_ranges import ReplayIncomplete
from lakehouse.tables.catalog import CORRECTIONS, RECONCILED, REPLAY
from spark_jobs.corrections import run_corrections
from spark_jobs.replay import replayed_in_run, run_replay

# Corrections and replays of a pipeline's daily tables run one at a time (instance pool limit 1,
# one pool per pipeline): two runs correcting one date would race their MERGEs (a per-date lock
# also guards local roots).
DAILY_POOL = "lakehouse_daily"


def partition_dates(context: dg.AssetExecutionContext) -> list[date]:
    """The run's dates: one partition, or a range in a single-run backfill."""
    return [date.fromisoformat(k) for k in context.partition_keys]


class CorrectionsConfig(dg.Config):
    reprocess: bool = False
    """Rebuild the dates from replay_aggregates (after a bug fix or a changed window size)
    instead of applying bronze changes; every changed window becomes a `reprocess` correction.
    The state records the bronze version of the replay it published (the job reprocess_dates
    replays first, in the same run)."""


COST_TOTALS = ("kafka_records_fetched", "kafka_bytes_fetched", "bytes_written", "files_written",
               "jvm_cpu_s", "executors_cpu_s", "wall_s")

PER_DATE_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("event_date", "string"), dg.TableColumn("mode", "string"),
    dg.TableColumn("reason", "string"), dg.TableColumn("windows_recomputed", "int"),
    dg.TableColumn("windows", "int"), dg.TableColumn("inserted", "int"),
    dg.TableColumn("corrected", "int"), dg.TableColumn("finalized", "int"), dg.TableColumn("removed", "int"),
    dg.TableColumn("late_events", "int"), dg.TableColumn("beyond_horizon", "int"),
    dg.TableColumn("watermark", "string"),
])


@cache
def daily_assets(p: Pipeline) -> tuple[dg.AssetsDefinition, ...]:
    """Pipeline `p`'s per-date assets: corrections (changelog + gold) and the replay, on its
    daily partitions."""
    changelog, gold, replay = (p.key(n) for n in ("late_corrections", "reconciled_aggregates",
                                                  "replay_aggregates"))

    @dg.multi_asset(
        name=p.named("corrections"),
        specs=[
            dg.AssetSpec(changelog, deps=[p.key("streaming_aggregates")],
                         group_name=p.group("reconcile"), owners=p.owners, kinds={"spark", "delta"},
                         skippable=True, code_version=p.code_version,
                         description="Changelog of every change to a published window "
                                     "(before/after, revision, cause, run id)."),
            dg.AssetSpec(gold, deps=[changelog, replay], group_name=p.group("reconcile"), owners=p.owners,
                         kinds={"spark", "delta"}, skippable=True, code_version=p.code_version,
                         description="Gold: exact per-window aggregates, revisioned, Change Data "
                                     "Feed on; proven equal to the replay by a blocking GX "
                                     "check."),
        ],
        partitions_def=p.partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=p.named(DAILY_POOL),
    )
    def corrections(context: dg.AssetExecutionContext, config: CorrectionsConfig,
                    lakehouse: LakehouseResource, spark: SparkResource,
                    log_position: LogPositionResource):
        """One corrections pass per date writes both tables (the changelog first); the two
        assets are one step (no subsetting). Input: bronze at the run's log position
        (`log_position`), the same one a replay of the run reads up to; a reprocess publishes the
        date's replay and takes that replay's position."""
        import_in_background()  # the checks on gold follow in this process
        settings = lakehouse.settings_for(p.name)
        t0 = time.monotonic()
        run_id = context.run.run_id

        def as_of(d: date) -> int | None:
            if config.reprocess:
                return replayed_in_run(settings, d, None)
            return version_for(context, log_position, spark, settings, d)

        results = [
            run_corrections(spark.session, settings, d, run_id=run_id,
                            reprocess=config.reprocess, as_of=as_of(d)).as_metadata()
            for d in partition_dates(context)
        ]
        per_date = dg.MetadataValue.table(
            records=[dg.TableRecord({c.name: r[c.name] if r[c.name] is not None else "" for c in
                                     PER_DATE_SCHEMA.columns}) for r in results],
            schema=PER_DATE_SCHEMA,
        )
        totals = {k: sum(r[k] for r in results) for k in
                  ("windows", "windows_recomputed", "inserted", "corrected", "removed",
                   "finalized", "beyond_horizon", "late_events")}
        yield dg.MaterializeResult(asset_key=changelog, metadata={
            "corrections": totals["corrected"],
            "beyond_horizon_not_applied": totals["beyond_horizon"],
            "late_events": totals["late_events"],
            "per_date": per_date,
            "path": dg.MetadataValue.path(settings.table_path(CORRECTIONS.name)),
        })
        yield dg.MaterializeResult(asset_key=gold, metadata={
            **{(k if k.startswith("windows") else f"windows_{k}"): v
               for k, v in totals.items() if k != "late_events"},
            "bronze_versions": dg.MetadataValue.json({r["event_date"]: r["bronze_version"]
                                                      for r in results}),
            "modes": dg.MetadataValue.json({r["event_date"]: f"{r['mode']}: {r['reason']}"
                                            for r in results}),
            "seconds_by_stage": dg.MetadataValue.json({r["event_date"]: r["seconds"]
                                                       for r in results}),
            "watermark": results[-1]["watermark"] if results else None,
            "duration_s": round(time.monotonic() - t0, 2),
            "per_date": per_date,
            "path": dg.MetadataValue.path(settings.table_path(RECONCILED.name)),
        })

    @dg.asset(key=replay, deps=[p.key("raw_events")], group_name=p.group("reconcile"), owners=p.owners,
              kinds={"spark", "kafka", "delta"}, partitions_def=p.partitions,
              backfill_policy=dg.BackfillPolicy.single_run(), pool=p.named(DAILY_POOL),
              code_version=p.code_version,
              description="Batch recomputation of the date straight from the Kafka log (not "
                          "from bronze, not from stream state), up to the run's log position.")
    def replay_aggregates(context: dg.AssetExecutionContext, lakehouse: LakehouseResource,
                          spark: SparkResource, log_position: LogPositionResource
                          ) -> dg.MaterializeResult:
        """Reads the log up to the Kafka offsets stamped on the run's bronze version
        (`log_position`), the same input the run's corrections compute from."""
        if context.run.asset_selection is None or gold in context.run.asset_selection:
            import_in_background()  # gold's proof follows in this process
        settings = lakehouse.settings_for(p.name)
        session = spark.session
        run_id = context.run.run_id
        try:
            results = [
                run_replay(session, settings, d,
                           as_of=version_for(context, log_position, spark, settings, d),
                           run_id=run_id).as_metadata()
                for d in partition_dates(context)
            ]
        except ReplayIncomplete as exc:
            raise dg.Failure(description=str(exc), metadata=exc.as_metadata()) from exc
        return dg.MaterializeResult(metadata={
            "windows": sum(r["windows"] for r in results),
            "events": sum(r["events"] for r in results),
            "records_read": sum(r["records_read"] for r in results),
            # What the run's replays cost (spark_jobs.costs; per date in `per_date`).
            "cost": dg.MetadataValue.json({k: round(sum(r["cost"].get(k) or 0 for r in results), 3)
                                           for k in COST_TOTALS}),
            "bronze_versions": dg.MetadataValue.json({r["event_date"]: r["as_of_bronze_version"]
                                                      for r in results}),
            "per_date": dg.MetadataValue.json(results),
            "path": dg.MetadataValue.path(settings.table_path(REPLAY.name)),
        })

    return corrections, replay_aggregates
