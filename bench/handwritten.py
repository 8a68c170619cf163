"""The jobs a user would write by hand in Spark on the same topic: the peers `make bench`
measures the pipeline against (issue: stream catch-up >= 0.8x, replay >= 0.9x of these).

Plain and obvious on purpose: parse with `from_json`, a watermark, 1-minute windows, a Delta
write. They do none of the product's work (no exact-decimal validation or quarantine, no dedup
by event_id, no late lane, no exactly-once bookkeeping, no proof), which is what the ratio
prices."""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.settings import Settings

SCHEMA = "event_id string, key string, event_time timestamp, value decimal(38,6)"


def events(kafka: DataFrame) -> DataFrame:
    return (kafka.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
            .select("e.*").where(F.col("event_time").isNotNull()))


def windows(events: DataFrame) -> DataFrame:
    return events.groupBy(F.window("event_time", "1 minute"), "key").agg(
        F.count("*").alias("event_count"), F.sum("value").alias("value_sum"),
        F.min("value").alias("value_min"), F.max("value").alias("value_max"))


def _kafka(reader, settings: Settings):
    return (reader.format("kafka").options(**settings.spark_kafka_options)
            .option("subscribe", settings.events_topic).option("startingOffsets", "earliest"))


def streaming_job(spark: SparkSession, settings: Settings, out: str, checkpoint: str,
                  max_offsets: int) -> None:
    """availableNow: Kafka -> from_json -> watermark -> windows -> Delta append."""
    source = _kafka(spark.readStream, settings).option("maxOffsetsPerTrigger", max_offsets).load()
    query = (windows(events(source).withWatermark("event_time", "30 seconds"))
             .writeStream.format("delta").outputMode("append")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(out))
    query.awaitTermination()


def batch_job(spark: SparkSession, settings: Settings, out: str, day: date) -> None:
    """One date's windows from a batch read of the whole topic -> Delta overwrite."""
    day_events = events(_kafka(spark.read, settings).load()).where(
        F.to_date("event_time") == F.lit(day))
    windows(day_events).write.format("delta").mode("overwrite").save(out)
