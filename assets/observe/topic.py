"""Metadata for a pipeline's topic asset (`raw_events`), shared by its materialization and the
observation sensor."""

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from assets.resources import KafkaResource
from lakehouse.specs.pipeline import DEFAULT_PIPELINE

PARTITION_SCHEMA = TableSchema(columns=[
    TableColumn("partition", "int"),
    TableColumn("earliest", "int", description="log start offset (retention moves it)"),
    TableColumn("latest", "int", description="log end offset"),
    TableColumn("processed", "int", description="end offset of the ingest query's last batch"),
    TableColumn("lag", "int", description="latest - processed"),
])


def topic_metadata(kafka: KafkaResource, pipeline: str = DEFAULT_PIPELINE) -> dict:
    status = kafka.status(pipeline)
    return {
        "topic": status.topic,
        "partitions": len(status.partitions),
        "retained_records": status.retained,
        "consumer_lag": status.lag,
        "records_per_second_last_minute": status.records_per_second,
        "retention_hours": round(status.retention_ms / 3_600_000, 2)
        if status.retention_ms and status.retention_ms > 0 else "unlimited",
        # Retention must exceed the correction horizon plus a day (lakehouse.kafka.topic_checks).
        "retention_covers_horizon": status.retention_warning is None,
        **({"retention_warning": status.retention_warning} if status.retention_warning else {}),
        "last_stream_batch_at": status.last_batch_at.isoformat() if status.last_batch_at else None,
        "offsets": MetadataValue.table(
            records=[TableRecord({k: (v if v is not None else -1) for k, v in p.items()})
                     for p in status.partitions],
            schema=PARTITION_SCHEMA,
        ),
    }
