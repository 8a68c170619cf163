"""The topic and the fast path: thin Dagster shells over spark_jobs.stream."""


import time
from functools import cache

import dagster as dg

from assets.observe.topic import topic_metadata
from assets.pipelines import Pipeline
from assets.resources import KafkaResource, LakehouseResource, SparkResource
from lakehouse.config.settings import Settings
from lakehouse.tables.catalog import BRONZE, INGEST_QUERY, LATE, QUARANTINE, STREAMING
from lakehouse.tables.locks import (
    CATCH_UP_ROLE,
    INGESTING_ROLES,
    CheckpointBusy,
    LockHolder,
    acting_as,
    checkpoint_holder,
)
from lakehouse.tables.progress_reports import BatchReport
from lakehouse.tables.run_metadata import bronze_summary, streaming_summary
from spark_jobs import stream

STREAM_POOL = "lakehouse_stream"  # one catch-up per checkpoint at a time (per pipeline)

BATCH_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("batch_id", "int"), dg.TableColumn("input_rows", "int"),
    dg.TableColumn("duration_ms", "int"),
])


def _run_metadata(progresses: list[dict], seconds: float) -> dict:
    """What the catch-up's batches did, from Spark's progress reports."""
    reports = [r for r in map(BatchReport.of, progresses) if r.executed]  # not idle triggers
    return {
        "batches": len(reports),
        "input_rows": sum(r.input_rows for r in reports),
        "offsets_read": dg.MetadataValue.json({
            "start": reports[0].start_offsets if reports else None,
            "end": reports[-1].end_offsets if reports else None,
        }),
        "batch_progress": dg.MetadataValue.table(
            records=[dg.TableRecord({"batch_id": r.batch_id, "input_rows": r.input_rows,
                                  "duration_ms": r.trigger_ms}) for r in reports],
            schema=BATCH_SCHEMA,
        ),
        "duration_s": round(seconds, 2),
    }


def stream_held_elsewhere(settings: Settings) -> LockHolder | None:
    """Who else holds the pipeline's stream checkpoint now (the streaming service, another
    catch-up), asked without Spark and without taking the lock; None when it is free (or held
    by this very process, which is no one else)."""
    holder = checkpoint_holder(settings, INGEST_QUERY)
    return None if holder is None or holder.is_this_process else holder


def ingesting_elsewhere(holder: LockHolder) -> str:
    """Why no catch-up is needed: e.g. "the streaming service (pid 1234 on host, since
    2026-11-27T10:00:00Z) holds the stream checkpoint 'ingest': it is ingesting; no catch-up
    needed"."""
    if holder.role in INGESTING_ROLES:
        return f"{holder.describe()} holds {holder.lock}: it is ingesting; no catch-up needed"
    return (f"{holder.describe()} holds {holder.lock}: the stream is in use; nothing to do "
            "until it is released (the next catch-up ingests what arrives meanwhile)")


def _skipped_metadata(holder: LockHolder, seconds: float) -> dict:
    """What a catch-up that found the stream held by another runner says: it ingested nothing,
    why, and who holds the stream."""
    return {
        **_run_metadata([], seconds),
        "skipped": True,
        "skip_reason": ingesting_elsewhere(holder),
        "stream_holder": dg.MetadataValue.json(holder.as_metadata()),
    }


@cache
def ingest_assets(p: Pipeline) -> tuple[dg.AssetsDefinition, ...]:
    """Pipeline `p`'s topic and the one-pass catch-up of its stream."""

    @dg.asset(key=p.key("raw_events"), group_name=p.group("ingest"), owners=p.owners, kinds={"kafka"},
              description="The Kafka topic of business events (LogAppendTime): offsets and lag.")
    def raw_events(context: dg.AssetExecutionContext,
                   kafka: KafkaResource) -> dg.MaterializeResult:
        """Creates the topic when missing; the sensor `topic_observation_sensor` keeps observing
        it. A retention too short for the correction horizon is a warning (and metadata)."""
        created = kafka.ensure_topic(p.name)
        metadata = topic_metadata(kafka, p.name)
        if "retention_warning" in metadata:
            context.log.warning(metadata["retention_warning"])
        return dg.MaterializeResult(metadata={"created": created, **metadata})

    bronze, aggregates = p.key("bronze_events"), p.key("streaming_aggregates")

    @dg.multi_asset(
        name=p.named("ingest"),
        specs=[
            dg.AssetSpec(bronze, deps=[raw_events.key], group_name=p.group("ingest"), owners=p.owners,
                         kinds={"spark", "delta"}, skippable=True, code_version=p.code_version,
                         description="Every valid Kafka record once (+ quarantined_events for "
                                     "malformed ones), written by the one-pass ingest query."),
            dg.AssetSpec(aggregates, deps=[bronze], group_name=p.group("ingest"), owners=p.owners,
                         kinds={"spark", "delta"}, skippable=True, code_version=p.code_version,
                         description="Fast provisional windows (explicit watermark, dedup by "
                                     "event_id) and the late-event lane, written by the same "
                                     "batches as bronze."),
        ],
        can_subset=True,
        pool=p.named(STREAM_POOL),
        description="One checkpointed availableNow catch-up of the ingest query: each micro-batch "
                    "classifies its records once and writes bronze, quarantine, the late lane and "
                    "the aggregates.",
    )
    def ingest(context: dg.AssetExecutionContext, lakehouse: LakehouseResource,
               spark: SparkResource):
        """Whichever of the two assets a run selects, the catch-up is the same one pass (the
        tables it writes are never advanced apart); each selected asset reports its side."""
        settings = lakehouse.settings_for(p.name)
        t0 = time.monotonic()
        # The streaming service (or another catch-up) holds the stream: it is ingesting, so this
        # run has nothing to do. It says so and succeeds, ingesting nothing (asked first without
        # Spark; asked again should the lock be taken between that question and this run's).
        holder = stream_held_elsewhere(settings)
        if holder is None:
            try:
                with acting_as(CATCH_UP_ROLE):  # what its lock says it is, should others ask
                    # Nothing new (decided from the checkpoint and the topic's offsets): no JVM,
                    # no query start, no Spark job; the metadata then comes from the Delta logs.
                    idle = stream.caught_up(settings)
                    progresses = [] if idle else stream.run_available_now(spark.session,
                                                                          settings)
            except CheckpointBusy:
                if (holder := stream_held_elsewhere(settings)) is None:
                    raise
        if holder is not None:
            context.log.info(f"skipped, nothing ingested by this run: "
                             f"{ingesting_elsewhere(holder)}")
            progresses = []
        common = (_skipped_metadata(holder, time.monotonic() - t0) if holder is not None
                  else _run_metadata(progresses, time.monotonic() - t0))
        batch_ids = [r.batch_id for r in map(BatchReport.of, progresses) if r.executed]
        if bronze in context.selected_asset_keys:
            yield dg.MaterializeResult(asset_key=bronze, metadata={
                **common, **bronze_summary(settings, batch_ids),
                "path": dg.MetadataValue.path(settings.table_path(BRONZE.name)),
                "quarantine_path": dg.MetadataValue.path(settings.table_path(QUARANTINE.name)),
            })
        if aggregates in context.selected_asset_keys:
            yield dg.MaterializeResult(asset_key=aggregates, metadata={
                **common, **streaming_summary(settings, batch_ids),
                "path": dg.MetadataValue.path(settings.table_path(STREAMING.name)),
                "late_events_path": dg.MetadataValue.path(settings.table_path(LATE.name)),
            })

    return raw_events, ingest
