"""The one-pass ingest batch on the real broker, Spark and Delta: a batch Spark runs again (its
checkpoint commit lost, as after a crash) writes nothing twice and its aggregates MERGE changes
no row; the watermark a batch judges lateness by is the one stamped on the previous bronze
commit, and the late lane holds exactly the events at or below it; a clean batch makes two
Delta commits."""

from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from lakehouse.kafka.admin import ensure_topic
from lakehouse.tables import delta_log
from lakehouse.tables.commit_tags import StreamCommit, batch_of, batch_tag
from lakehouse.tables.reads import read
from spark_jobs import stream
from spark_jobs.writer import Writer
from testkit.generator import GeneratorConfig, generate, produce

TABLES = ("bronze_events", "quarantined_events", "late_events", "streaming_aggregates")


def versions(settings) -> dict[str, int]:
    return {t: delta_log.version(settings, t) for t in TABLES}


def aggregates(settings) -> dict:
    return {(r["window_start"], r["key"]): (r["event_count"], r["value_sum"], r["value_min"],
                                            r["value_max"], r["status"])
            for r in read(settings, "streaming_aggregates").to_pylist()}


def test_a_rerun_batch_writes_nothing_twice_and_its_merge_changes_no_row(instance_env, spark):
    settings = instance_env
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    chunks = [generate(GeneratorConfig(count=400, seed=s, end=end + timedelta(minutes=10 * s),
                                       span=timedelta(minutes=30), keys=4, late_fraction=0.1,
                                       duplicate_fraction=0.05)).records for s in (1, 2)]
    produce(settings, chunks[0])
    stream.catch_up(spark, settings)
    first = StreamCommit.parse(delta_log.commits(settings, "bronze_events", 1)[0])
    before_second = versions(settings)
    produce(settings, chunks[1])
    progress = stream.catch_up(spark, settings)["ingest"]
    assert [p["numInputRows"] for p in progress] == [len(chunks[1])]
    batch = int(progress[0]["batchId"])
    second = StreamCommit.parse(delta_log.commits(settings, "bronze_events", 1)[0])
    # The watermark the second batch judged by is the one the first batch left.
    assert second.watermark_ms == first.next_watermark_ms > 0
    late = read(settings, "late_events").to_pylist()
    in_second = [r for r in late if r["batch_id"] == batch]
    assert len(in_second) == second.late > 0
    wm = datetime.fromtimestamp(second.watermark_ms / 1000, tz=UTC)
    assert all(r["event_time"] <= wm for r in in_second)
    bronze = read(settings, "bronze_events").to_pylist()
    on_time = [r for r in bronze if r["bronze_batch_id"] == batch and r["event_time"] > wm]
    assert len(on_time) + len(in_second) == sum(1 for r in bronze if r["bronze_batch_id"] == batch)

    done, table = versions(settings), aggregates(settings)
    # One commit to each table by the batch (quarantine and late only because it had some).
    assert {t: done[t] - before_second[t] for t in TABLES} == dict.fromkeys(TABLES, 1)
    # On a local root the publication is the driver's commit (delta-rs), tagged with the batch.
    published = delta_log.commits(settings, "streaming_aggregates", 1)[0]
    assert published["engineInfo"].startswith("delta-rs")
    assert published["userMetadata"] == batch_tag(second.query, batch)

    # Spark runs the batch again: its checkpoint commit is lost.
    checkpoint = Path(settings.checkpoint_path("ingest").removeprefix("file://"))
    for name in (str(batch), f".{batch}.crc"):  # the file and Hadoop's checksum of it
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    stream.catch_up(spark, settings)
    assert (checkpoint / "commits" / str(batch)).exists()  # re-run and committed
    after = versions(settings)
    # No append again, and the MERGE changed no row (Delta commits nothing for it).
    assert {t: after[t] - done[t] for t in TABLES} == dict.fromkeys(TABLES, 0)
    assert aggregates(settings) == table
    positions = Counter((r["partition"], r["offset"]) for r in read(settings, "bronze_events").to_pylist())
    assert max(positions.values()) == 1


def test_records_of_aborted_transactions_are_never_ingested(instance_env, spark):
    """A transactional producer commits one transaction and aborts another: the stream (Spark's
    consumer reads committed records only) lands exactly the committed records."""
    import json

    from confluent_kafka import Producer

    settings = instance_env
    ensure_topic(settings)
    at = (datetime.now(UTC) - timedelta(minutes=3)).isoformat(timespec="milliseconds")
    producer = Producer({**settings.client_config, "transactional.id": f"tx-{settings.events_topic}"})
    producer.init_transactions(30)

    def send(prefix: str, n: int, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(n):
            producer.produce(settings.events_topic, key="k", value=json.dumps(
                {"event_id": f"{prefix}-{i}", "key": "k", "event_time": at, "value": "1.5"}))
        producer.flush(30)  # in the log before the abort (librdkafka purges undelivered ones)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    send("committed", 30, True)
    send("aborted", 20, False)
    send("committed-again", 10, True)
    stream.catch_up(spark, settings)
    ids = read(settings, "bronze_events")["event_id"].to_pylist()
    assert len(ids) == 40 and not [i for i in ids if i.startswith("aborted")]
    # The aborted records are in the log: a reader of uncommitted records sees them.
    for level, n in (("read_uncommitted", 60), ("read_committed", 40)):
        assert spark.read.format("kafka").options(**{
            **settings.spark_kafka_options, "kafka.isolation.level": level}).option(
            "subscribe", settings.events_topic).load().count() == n
    assert read(settings, "quarantined_events").num_rows == 0
    assert sum(read(settings, "streaming_aggregates")["event_count"].to_pylist()) == 40


def test_copies_in_later_batches_of_one_run_count_once(instance_env, spark):
    """Within one query run of the service's kind the dedup looks ids up in its in-memory index
    (not in bronze): every event is sent twice, its copies in different micro-batches, and each
    counts once. Their Kafka keys are text, bytes that are not UTF-8, or none: each is kept
    exactly, and bronze stays readable by delta-rs."""
    import base64
    import json

    from confluent_kafka import Producer

    settings = instance_env.model_copy(update={"max_offsets_per_trigger": 120})
    ensure_topic(settings)
    at = (datetime.now(UTC) - timedelta(minutes=2)).isoformat(timespec="milliseconds")
    producer = Producer(settings.client_config)

    def kafka_key(i: int) -> bytes | None:
        return (f"k{i % 3}".encode(), b"\xff\xfe\x00" + str(i).encode(), None)[i % 3]

    for _copy in range(2):
        for i in range(300):
            producer.produce(settings.events_topic, key=kafka_key(i), value=json.dumps(
                {"event_id": f"e-{i}", "key": f"k{i % 3}", "event_time": at,
                 "value": f"{i}.5"}))
        producer.flush(30)
    from lakehouse.tables.locks import checkpoint_lock
    from spark_jobs.recent_ids import RecentIds

    recent = RecentIds()  # kept across the run's batches, as the service keeps it
    with checkpoint_lock(settings, stream.INGEST_QUERY):
        query = stream.start_ingest(spark, settings, stream.Trigger(available_now=True), recent)
        query.awaitTermination()
    progress = query.recentProgress
    assert len(progress) >= 5  # 600 records, at most 120 a batch
    assert recent.version >= 0 and recent.chunks  # the lookups used the index
    recent.clear()
    rows = read(settings, "streaming_aggregates").to_pylist()
    assert sum(r["event_count"] for r in rows) == 300
    assert sum(r["value_sum"] for r in rows) == sum(Decimal(f"{i}.5") for i in range(300))
    bronze = read(settings, "bronze_events")  # delta-rs: no string column holds other bytes
    assert bronze.num_rows == 600
    assert read(settings, "late_events").num_rows == 0
    kept = {(r["event_id"], r["record_key"], r["record_key_base64"]) for r in bronze.to_pylist()}
    key = {i: kafka_key(i) for i in range(300)}
    assert kept == {(f"e-{i}", k.decode() if i % 3 == 0 else None,
                     base64.b64encode(k).decode() if i % 3 == 1 else None)
                    for i, k in ((i, key[i] or b"") for i in range(300))}


def test_a_clean_batch_opens_each_tables_log_once_before_its_writes(instance_env, spark,
                                                                     monkeypatch):
    """The batch reads what it needs from the logs once (`BatchPlan`) and acts on it: from the
    batch's start to its first write, no table's log is opened twice (and a clean batch never
    opens the quarantine's or the late lane's)."""
    from lakehouse.tables import batch_plan

    settings = instance_env
    ensure_topic(settings)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    clean = {"late_fraction": 0.0, "duplicate_fraction": 0.0, "malformed_fraction": 0.0}
    produce(settings, generate(GeneratorConfig(count=200, seed=3, end=end, keys=3,
                                               span=timedelta(minutes=3), **clean)).records)
    stream.catch_up(spark, settings)  # the stream's first commit: the next batch has a previous
    produce(settings, generate(GeneratorConfig(count=200, seed=4, end=end + timedelta(minutes=4),
                                               keys=3, span=timedelta(minutes=3), **clean)).records)
    events: list[tuple[str, str]] = []
    real_open, real_read, real_append = (delta_log.open_table, batch_plan.BatchPlan.read,
                                         Writer.append)

    def open_table(s, name, *args, **kwargs):
        events.append(("open", name))
        return real_open(s, name, *args, **kwargs)

    def plan_read(s, query, batch_id):
        events.append(("batch", str(batch_id)))
        return real_read(s, query, batch_id)

    def append(self, df, table, *args, **kwargs):
        events.append(("write", getattr(table, "name", table)))
        return real_append(self, df, table, *args, **kwargs)

    monkeypatch.setattr(delta_log, "open_table", open_table)
    monkeypatch.setattr(batch_plan.BatchPlan, "read", staticmethod(plan_read))
    monkeypatch.setattr(Writer, "append", append)
    progress = stream.catch_up(spark, settings)["ingest"]
    assert [p["numInputRows"] for p in progress if p["numInputRows"]] == [200]
    start = events.index(("batch", str(progress[-1]["batchId"])))
    first_write = events.index(("write", "bronze_events"), start)
    opens = Counter(name for kind, name in events[start:first_write] if kind == "open")
    assert opens and max(opens.values()) == 1, opens
    assert not {"quarantined_events", "late_events"} & set(opens)
    assert ("write", "quarantined_events") not in events and ("write", "late_events") not in events


def test_a_batch_past_the_drivers_bound_is_published_by_spark_with_the_same_rows(
        instance_env, spark, monkeypatch):
    """A batch whose open windows and on-time records could exceed DRIVER_ROWS_MAX is published
    by Spark's writer, on top of the driver's earlier commits: the same rows as the driver's
    publications of the same events (sent to a second topic, ingested into a second root)."""
    settings = instance_env
    other = settings.model_copy(update={
        "lakehouse_root": str(settings.local_root.parent / "by-spark"),
        "events_topic": f"{settings.events_topic}-b"})
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    for s in (settings, other):
        ensure_topic(s)
    # Two chunks, the second's events later (none in the future: a batch of only quarantined
    # records is another case).
    chunks = [generate(GeneratorConfig(count=300, seed=seed, end=end - timedelta(minutes=m),
                                       span=timedelta(minutes=20), keys=3)).records
              for seed, m in ((3, 20), (4, 0))]
    for s in (settings, other):
        for i, records in enumerate(chunks):
            produce(s, records)
            if s is other and i == 1:
                monkeypatch.setattr(stream, "DRIVER_ROWS_MAX", 0)  # no batch's windows fit
            stream.catch_up(spark, s)
    by_driver = delta_log.commits(settings, "streaming_aggregates", 2)
    assert all(c["engineInfo"].startswith("delta-rs") for c in by_driver)
    by_spark, before = delta_log.commits(other, "streaming_aggregates", 2)
    assert by_spark["engineInfo"].startswith("Apache-Spark")
    assert before["engineInfo"].startswith("delta-rs")
    assert batch_of(by_spark["userMetadata"])[1] == batch_of(by_driver[0]["userMetadata"])[1]
    assert aggregates(other) == aggregates(settings)


def test_a_batch_of_only_quarantined_records_stamps_bronze_and_the_stream_goes_on(
        instance_env, spark):
    """Every record of a batch quarantined (events in the future): the quarantine holds them,
    bronze records the batch's position in an empty commit, and the next batch ingests."""
    settings = instance_env
    ensure_topic(settings)
    now = datetime.now(UTC).replace(microsecond=0)

    def chunk(seed: int, end: datetime) -> list:
        return generate(GeneratorConfig(count=100, seed=seed, end=end, span=timedelta(minutes=5),
                                        keys=2, late_fraction=0, duplicate_fraction=0,
                                        malformed_fraction=0)).records

    for seed, end in ((1, now - timedelta(minutes=5)), (2, now + timedelta(hours=2)),
                      (3, now - timedelta(minutes=1))):
        produce(settings, chunk(seed, end))
        stream.catch_up(spark, settings)
    stamped = [StreamCommit.parse(c) for c in delta_log.commits(settings, "bronze_events", 3)]
    assert [c.batch_id for c in stamped] == [2, 1, 0]
    quarantined = Counter((r["bronze_batch_id"], r["reason"])
                          for r in read(settings, "quarantined_events").to_pylist())
    assert sum(n for (batch, _), n in quarantined.items() if batch == 1) == 100
    assert quarantined[(1, "event_time_in_future")] > 90
    bronze = Counter(r["bronze_batch_id"] for r in read(settings, "bronze_events").to_pylist())
    assert bronze[1] == 0 and bronze[0] > 0 and bronze[2] > 0
