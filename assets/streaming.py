"""The topic and the fast path: thin Dagster shells over spark_jobs.stream."""


import time

from dagster import (
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from assets.observations import topic_metadata
from assets.resources import LakehouseResource, SparkResource
from lakehouse.kafka_admin import ensure_topic
from spark_jobs import stream
from spark_jobs.run_metadata import bronze_summary, streaming_summary
from spark_jobs.tables import BRONZE, LATE, QUARANTINE, STREAMING

STREAM_POOL = "lakehouse_stream"  # one catch-up per checkpoint at a time


@asset(key="raw_events", group_name="ingest", kinds={"kafka"},
       description="The Kafka topic of business events (LogAppendTime): offsets and lag.")
def raw_events(lakehouse: LakehouseResource) -> MaterializeResult:
    """Creates the topic when missing; the sensor `topic_observation_sensor` keeps observing it."""
    settings = lakehouse.settings
    created = ensure_topic(settings)
    return MaterializeResult(metadata={"created": created, **topic_metadata(settings)})


BATCH_SCHEMA = TableSchema(columns=[
    TableColumn("batch_id", "int"), TableColumn("input_rows", "int"),
    TableColumn("dropped_by_watermark", "int"), TableColumn("watermark", "string"),
    TableColumn("duration_ms", "int"),
])


def _dropped(p: dict) -> int:
    return sum(int(s.get("numRowsDroppedByWatermark", 0)) for s in (p.get("stateOperators") or []))


def _catch_up(spark: SparkResource, lakehouse: LakehouseResource, query: str) -> tuple[dict, list]:
    """Run one availableNow catch-up of `query`; metadata common to both stream assets."""
    t0 = time.monotonic()
    progresses = stream.run_available_now(spark.session, lakehouse.settings, query)
    sources = [(p.get("sources") or [{}])[0] for p in progresses]
    meta = {
        "batches": len(progresses),
        "input_rows": sum(int(p.get("numInputRows") or 0) for p in progresses),
        "rows_dropped_by_watermark": sum(_dropped(p) for p in progresses),
        "offsets_read": MetadataValue.json({
            "start": sources[0].get("startOffset") if sources else None,
            "end": sources[-1].get("endOffset") if sources else None,
        }),
        "batch_progress": MetadataValue.table(
            records=[TableRecord({
                "batch_id": int(p["batchId"]), "input_rows": int(p.get("numInputRows") or 0),
                "dropped_by_watermark": _dropped(p),
                "watermark": str((p.get("eventTime") or {}).get("watermark", "")),
                "duration_ms": int((p.get("durationMs") or {}).get("triggerExecution", 0)),
            }) for p in progresses],
            schema=BATCH_SCHEMA,
        ),
        "duration_s": round(time.monotonic() - t0, 2),
    }
    return meta, [int(p["batchId"]) for p in progresses]


@asset(key="bronze_events", deps=["raw_events"], group_name="ingest", kinds={"spark", "delta"},
       pool=STREAM_POOL,
       description="Every valid Kafka record once (+ quarantined_events for malformed ones): "
                   "one checkpointed availableNow catch-up of the bronze query.")
def bronze_events(context: AssetExecutionContext, lakehouse: LakehouseResource,
                  spark: SparkResource) -> MaterializeResult:
    settings = lakehouse.settings
    meta, batch_ids = _catch_up(spark, lakehouse, stream.BRONZE_QUERY)
    meta.update(bronze_summary(spark.session, settings, batch_ids))
    meta["path"] = MetadataValue.path(settings.table_path(BRONZE.name))
    meta["quarantine_path"] = MetadataValue.path(settings.table_path(QUARANTINE.name))
    return MaterializeResult(metadata=meta)


@asset(key="streaming_aggregates", deps=["bronze_events"], group_name="ingest",
       kinds={"spark", "delta"}, pool=STREAM_POOL,
       description="Fast provisional windows (watermark, dedup) and the late-event lane: one "
                   "checkpointed availableNow catch-up of the aggregation query.")
def streaming_aggregates(context: AssetExecutionContext, lakehouse: LakehouseResource,
                         spark: SparkResource) -> MaterializeResult:
    settings = lakehouse.settings
    meta, batch_ids = _catch_up(spark, lakehouse, stream.AGG_QUERY)
    meta.update(streaming_summary(spark.session, settings, batch_ids))
    meta["path"] = MetadataValue.path(settings.table_path(STREAMING.name))
    meta["late_events_path"] = MetadataValue.path(settings.table_path(LATE.name))
    return MaterializeResult(metadata=meta)
