"""The quarantine redrive as Dagster ops (`spark_jobs.redrive`): re-classify a quarantine date's
records with today's spec and registry, land those that now pass, then correct, replay and prove
the event dates they landed in.

Ops, not assets: the job's partition is the quarantine date (the records' broker date), while
the tables it changes are keyed by event date, which a redriven record may not share with it
(an event a few seconds before midnight, appended after; an event hours late). So the second op
reconciles each event date the redrive touched, from one bronze version (the run's position,
recorded after the redrive), exactly as `reconcile_dates` does, and fails when a date's proof
fails; the materializations of the daily assets it wrote are reported for those dates."""


from datetime import date
from functools import cache

import dagster as dg

from assets.pipelines import Pipeline
from assets.reconcile.checks import prove_dates
from assets.reconcile.daily import DAILY_POOL
from assets.resources import LakehouseResource, SparkResource
from lakehouse.kafka.log_ranges import ReplayIncomplete
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import BRONZE
from spark_jobs.corrections import run_corrections
from spark_jobs.redrive import run_redrive
from spark_jobs.replay import run_replay

PER_REASON = dg.TableSchema(columns=[
    dg.TableColumn("reason", "string"), dg.TableColumn("considered", "int"),
    dg.TableColumn("redriven", "int"), dg.TableColumn("still_failing", "int"),
    dg.TableColumn("now_failing_as", "string"),
])


class RedriveConfig(dg.Config):
    reasons: list[str] = []
    """The quarantine reason codes to redrive (e.g. ["unknown_schema_id"]); empty: every
    reason. A record that still fails stays quarantined, counted under its new reason."""


@cache
def redrive_ops(p: Pipeline) -> tuple[dg.OpDefinition, dg.OpDefinition]:
    """Pipeline `p`'s redrive and the reconciliation of the dates it touched (its daily pool:
    no corrections or replay of the pipeline beside them)."""

    @dg.op(name=p.named("redrive_quarantined"), pool=p.named(DAILY_POOL),
           out=dg.Out(list[str]),
           description="Re-classify the partition's quarantined records (its broker date) with "
                       "today's spec and schema registry; land those that now pass in the late "
                       "lane and bronze exactly once and mark them redriven (never deleted).")
    def redrive_quarantined(context: dg.OpExecutionContext, config: RedriveConfig,
                            lakehouse: LakehouseResource, spark: SparkResource):
        settings = lakehouse.settings_for(p.name)
        d = date.fromisoformat(context.partition_key)
        result = run_redrive(spark.session, settings, d, run_id=context.run.run_id,
                             reasons=config.reasons or None)
        context.log.info(f"quarantine {d}: {result.total_redriven} redriven "
                         f"({result.landed_now} landed now), {result.total_still_failing} still "
                         f"failing, event dates {[x.isoformat() for x in result.event_dates]}")
        meta = result.as_metadata()
        yield dg.Output([x.isoformat() for x in result.event_dates], metadata={
            "redriven": result.total_redriven,
            "landed_now": result.landed_now,
            "still_failing": result.total_still_failing,
            "beyond_position": result.beyond_position,
            "reasons": dg.MetadataValue.json(meta["reasons"]),
            "redriven_by_reason": dg.MetadataValue.json(result.redriven),
            "still_failing_by_reason": dg.MetadataValue.json(result.still_failing),
            "per_reason": dg.MetadataValue.table(
                records=[dg.TableRecord(r) for r in result.per_reason()], schema=PER_REASON),
            "event_dates": dg.MetadataValue.json(meta["event_dates"]),
            "columns_added": dg.MetadataValue.json(result.columns_added),
        })

    @dg.op(name=p.named("reconcile_redriven_dates"), pool=p.named(DAILY_POOL),
           description="Corrections, replay and the proof (gold == replay) of every event date "
                       "the redrive landed records in, from one bronze version.")
    def reconcile_redriven_dates(context: dg.OpExecutionContext, event_dates: list[str],
                                 lakehouse: LakehouseResource, spark: SparkResource):
        settings = lakehouse.settings_for(p.name)
        session, run_id = spark.session, context.run.run_id
        dates = [date.fromisoformat(x) for x in event_dates]
        version = delta_log.version(settings, BRONZE.name)
        for d in dates:
            corrected = run_corrections(session, settings, d, run_id=run_id, as_of=version)
            try:
                replayed = run_replay(session, settings, d, as_of=version, run_id=run_id)
            except ReplayIncomplete as exc:
                raise dg.Failure(description=str(exc), metadata=exc.as_metadata()) from exc
            partition = d.isoformat() if p.partitions.has_partition_key(d.isoformat()) else None
            for name, meta in (("reconciled_aggregates", corrected.as_metadata()),
                               ("replay_aggregates", replayed.as_metadata())):
                yield dg.AssetMaterialization(
                    p.key(name), partition=partition,
                    metadata={"redrive_run": run_id, "bronze_version": version,
                              "per_date": dg.MetadataValue.json(meta)})
        verdict = prove_dates(session, settings, dates) if dates else None
        metadata = {"event_dates": dg.MetadataValue.json(event_dates),
                    "bronze_version": version}
        if verdict is not None:
            metadata.update({"proof": verdict.description or "",
                             **{k: v for k, v in (verdict.metadata or {}).items()
                                if k in ("rows_compared", "redriven_records", "totals",
                                         "differing_windows")}})
            if not verdict.passed:
                raise dg.Failure(description=f"the proof failed after the redrive: "
                                             f"{verdict.description}", metadata=metadata)
        yield dg.Output(None, metadata=metadata)

    return redrive_quarantined, reconcile_redriven_dates
