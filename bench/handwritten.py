"""The jobs a user would write by hand in Spark on the same topic: the peers `make bench`
measures the pipeline against.

Plain and obvious on purpose, but fair: they parse every timestamp form the generator sends
(ISO-8601 with an offset, and epoch milliseconds), so they count the same events as the product.
Written for the pipeline's event shape (`settings.shape`): the default's `event_id, key,
event_time, value`, or a spec's fields (the schema a user would give `from_json` for them).
- `streaming_job` (the naive peer): `from_json`, a watermark, 1-minute windows, a Delta append.
- `fair_streaming_job` (the fair peer): the same, plus what any serious job does: every parsed
  record written to a bronze Delta table (partitioned by date) and a dedup by `event_id`.
- `live_job` (the live peers of `make bench-service`, bench/service_peers.py): Kafka ->
  `from_json` -> watermark -> 1-minute windows -> Delta in complete mode, 1 s trigger, in a Spark
  application of its own: naive (Spark's defaults) or tuned (`LIVE_TUNED_CONF`: RocksDB state
  with changelog checkpointing, 2 shuffle partitions, adaptive execution off).
- `medallion_job` (the third live peer): the tuned application running two queries, one landing
  every typed record with its Kafka coordinates in a bronze Delta table (append, by date), one
  the windows of the first copy of each `event_id` (`dropDuplicatesWithinWatermark`) in complete
  mode: the product's guarantees minus the quarantine, the late lane and the proof.
- `batch_job` (the replay's peer): a date's offset range read from Kafka, parsed, deduplicated
  by `event_id`, windowed, written with a `replaceWhere` of the date.
None does the product's other work (exact-decimal validation and quarantine with reasons, the
late lane, exactly-once bookkeeping, the proof), which is what the ratios price.
For an Avro spec (`format: avro`) the peers decode with `from_avro` instead of `from_json`
(`avro_events`): the writer schema by the Confluent header's id, read as the reader schema.
"""

from __future__ import annotations

import json
from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import TimestampType

from lakehouse.config.settings import Settings, spark_interval
from lakehouse.events.shape import DEFAULT_SHAPE, EventShape


def schema(shape: EventShape) -> str:
    """`from_json`'s schema: the id, the dimensions and the time as text, the measures as
    their declared decimals (the default: "event_id string, key string, event_time string,
    value decimal(38,6)")."""
    text = [shape.event_id, *(d.source for d in shape.dimensions), shape.event_time.field]
    return ", ".join([*(f"`{c}` string" for c in text),
                      *(f"`{f}` {shape.fields[f]}" for f in shape.measure_fields)])


def event_time(text, formats=("iso8601", "epoch_millis")):
    """Epoch milliseconds or seconds (digits), as declared, or ISO-8601."""
    digits = (F.timestamp_millis(text.cast("long")) if "epoch_millis" in formats
              else F.timestamp_seconds(text.cast("decimal(18,6)")))
    return F.when(text.rlike("^[0-9]+(\\.[0-9]+)?$"), digits).otherwise(F.try_to_timestamp(text))


def avro_events(kafka: DataFrame, shape: EventShape) -> DataFrame:
    """What a user writes for Confluent-framed Avro: the id from the header picks the writer
    schema, `from_avro` reads it as the reader schema; the typed fields straight from the
    struct (a timestamp-millis time is a timestamp already), records that did not decode
    dropped with the incomplete ones."""
    avro = shape.avro
    options = {"mode": "PERMISSIVE", "avroSchema": avro.reader_schema.text}
    if avro.wire_format == "confluent":
        sid = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int")
        body = F.expr("substring(value, 6)")
    else:
        sid, body = F.lit(next(iter(avro.schemas))), F.col("value")
    record = None
    for i, writer in avro.schemas.items():
        record = (F.when if record is None else record.when)(
            sid == i, from_avro(body, writer.text, options))
    e = kafka.select(record.alias("e"), F.col("timestamp").alias("kafka_timestamp"),
                     "partition", "offset")
    t = F.col(f"e.`{shape.event_time.field}`")
    if not isinstance(e.schema["e"].dataType[shape.event_time.field].dataType, TimestampType):
        t = event_time(t.cast("string"), shape.event_time.formats)
    columns = [F.col(f"e.`{shape.event_id}`").cast("string").alias("event_id"),
               *(F.col(f"e.`{d.source}`").alias(d.name) for d in shape.dimensions),
               t.alias("event_time"),
               *(F.col(f"e.`{f}`").cast(shape.fields[f]).alias(f) for f in shape.measure_fields)]
    names = ["event_id", *shape.dimension_names, "event_time", *shape.measure_fields]
    parsed = e.select(*columns, "kafka_timestamp", "partition", "offset")
    return parsed.where(" AND ".join(f"`{n}` IS NOT NULL" for n in names))


def events(kafka: DataFrame, shape: EventShape = DEFAULT_SHAPE) -> DataFrame:
    if shape.format == "avro":
        return avro_events(kafka, shape)
    e = kafka.select(F.from_json(F.col("value").cast("string"), schema(shape)).alias("e"),
                     F.col("timestamp").alias("kafka_timestamp"), "partition", "offset")
    columns = [F.col(f"e.`{shape.event_id}`").alias("event_id"),
               *(F.col(f"e.`{d.source}`").alias(d.name) for d in shape.dimensions),
               event_time(F.col(f"e.`{shape.event_time.field}`"), shape.event_time.formats)
               .alias("event_time"),
               *(F.col(f"e.`{f}`").alias(f) for f in shape.measure_fields)]
    names = ["event_id", *shape.dimension_names, "event_time", *shape.measure_fields]
    parsed = e.select(*columns, "kafka_timestamp", "partition", "offset")
    return parsed.where(" AND ".join(f"`{n}` IS NOT NULL" for n in names))


def windows(events: DataFrame, shape: EventShape = DEFAULT_SHAPE,
            size: str = "1 minute") -> DataFrame:
    aggregates = [F.count("*").alias("event_count")]
    for m in shape.measures:
        for a in m.aggregates:
            fn = {"sum": F.sum, "min": F.min, "max": F.max}[a]
            aggregates.append(fn(m.field).alias(f"{m.column_prefix}_{a}"))
    return events.groupBy(F.window("event_time", size), *shape.dimension_names).agg(*aggregates)


def _windows_of(events: DataFrame, settings: Settings) -> DataFrame:
    return windows(events, settings.shape, spark_interval(settings.window_size))


def _kafka(reader, settings: Settings):
    return (reader.format("kafka").options(**settings.spark_kafka_options)
            .option("subscribe", settings.events_topic).option("startingOffsets", "earliest"))


def streaming_job(spark: SparkSession, settings: Settings, out: str, checkpoint: str,
                  max_offsets: int) -> None:
    """availableNow: Kafka -> from_json -> watermark -> windows -> Delta append."""
    source = _kafka(spark.readStream, settings).option("maxOffsetsPerTrigger", max_offsets).load()
    query = (_windows_of(events(source, settings.shape).withWatermark(
                 "event_time", spark_interval(settings.watermark_delay)), settings)
             .writeStream.format("delta").outputMode("append")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(out))
    query.awaitTermination()


def fair_streaming_job(spark: SparkSession, settings: Settings, out: str, checkpoint: str,
                       max_offsets: int) -> None:
    """availableNow, foreachBatch: parse once (cached), append every record to bronze, then the
    windows of the first copy of each event_id appended to the aggregates table."""
    source = _kafka(spark.readStream, settings).option("maxOffsetsPerTrigger", max_offsets).load()

    def batch(df: DataFrame, _batch_id: int) -> None:
        parsed = events(df, settings.shape).withColumn("event_date",
                                                        F.to_date("event_time")).persist()
        parsed.write.format("delta").mode("append").partitionBy("event_date").save(out + "_bronze")
        _windows_of(parsed.dropDuplicates(["event_id"]), settings).write.format("delta").mode(
            "append").save(out)
        parsed.unpersist()

    query = (source.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()


def batch_job(spark: SparkSession, settings: Settings, out: str, day: date,
              ranges: dict[int, tuple[int, int]] | None = None) -> None:
    """One date's windows from a batch read of its offset range (default: the whole topic),
    deduplicated by event_id -> Delta, replacing the date."""
    reader = _kafka(spark.read, settings)
    if ranges:
        topic = settings.events_topic
        reader = (reader.option("startingOffsets", json.dumps(
                      {topic: {str(p): lo for p, (lo, _) in ranges.items()}}))
                  .option("endingOffsets", json.dumps(
                      {topic: {str(p): hi for p, (_, hi) in ranges.items()}})))
    day_events = events(reader.load(), settings.shape).where(
        F.to_date("event_time") == F.lit(day))
    (_windows_of(day_events.dropDuplicates(["event_id"]), settings)
     .withColumn("event_date", F.to_date("window.start"))
     .write.format("delta").mode("overwrite")
     .option("replaceWhere", f"event_date = DATE'{day.isoformat()}'").save(out))


# The live peers of `make bench-service` (bench/service_peers.py): a window query a user would
# run next to the service, each in a Spark application of its own. Naive: Spark's defaults but
# for the jars, Delta and UTC. Tuned: what a user tunes after reading the docs.
LIVE_TUNED_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.adaptive.enabled": "false",
}


def live_conf(settings: Settings, tuned: bool) -> dict[str, str]:
    """The peer application's Spark configuration: the same jars, Delta, driver memory and
    time zone as the service, nothing else set by the naive peer; the tuned one adds
    `LIVE_TUNED_CONF`."""
    from spark_jobs.session import spark_jars

    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": f"handwritten-live-{'tuned' if tuned else 'naive'}",
        "spark.jars": ",".join(spark_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "4g",
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_host,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **{k: "-Duser.timezone=UTC" for k in ("spark.driver.extraJavaOptions",
                                               "spark.executor.extraJavaOptions")},
    }
    return {**conf, **(LIVE_TUNED_CONF if tuned else {})}


def live_job(spark: SparkSession, settings: Settings, out: str, checkpoint: str,
             trigger: str = "1 second"):
    """The live window query: Kafka -> from_json -> watermark -> 1-minute windows by key ->
    Delta, complete mode (every window rewritten each batch, as a dashboard reads it),
    `trigger`. Returns the started query."""
    source = _kafka(spark.readStream, settings).load()
    return (_windows_of(events(source, settings.shape).withWatermark(
                "event_time", spark_interval(settings.watermark_delay)), settings)
            .writeStream.format("delta").outputMode("complete")
            .option("checkpointLocation", checkpoint).trigger(processingTime=trigger)
            .start(out))


def medallion_job(spark: SparkSession, settings: Settings, out: str, checkpoint: str,
                  trigger: str = "1 second"):
    """The hand-written medallion: bronze (every typed record with its topic, partition, offset
    and broker time, appended by `event_date` to `out`_bronze) and the live windows of the first
    copy of each event id within the watermark (complete mode into `out`), two queries of one
    application, each `trigger`. Returns the windows query (the one probed)."""
    source = _kafka(spark.readStream, settings).load()
    typed = events(source, settings.shape)
    (typed.withColumn("topic", F.lit(settings.events_topic))
     .withColumn("event_date", F.to_date("event_time"))
     .writeStream.format("delta").outputMode("append").partitionBy("event_date")
     .option("checkpointLocation", f"{checkpoint}_bronze").trigger(processingTime=trigger)
     .start(f"{out}_bronze"))
    deduplicated = (typed.withWatermark("event_time", spark_interval(settings.watermark_delay))
                    .dropDuplicatesWithinWatermark(["event_id"]))
    return (_windows_of(deduplicated, settings)
            .writeStream.format("delta").outputMode("complete")
            .option("checkpointLocation", checkpoint).trigger(processingTime=trigger)
            .start(out))
