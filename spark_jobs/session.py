"""The one SparkSession factory: local Maven-fetched jars, Delta, RocksDB state, UTC, quiet."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from pyspark import SparkContext
from pyspark import __version__ as PYSPARK_VERSION
from pyspark.sql import SparkSession

from lakehouse.config import spark_secrets, storage
from lakehouse.config.settings import Settings, remote_shown
from lakehouse.tables import commit_log
from lakehouse.tables.catalog import WAREHOUSE_DIR
from spark_jobs.connect_work import record_session

REPO = Path(__file__).resolve().parents[1]
SPARK_JARS = REPO / ".jars" / "spark"
S3_JARS = REPO / ".jars" / "s3"
CLASS_ARCHIVES = REPO / ".jars" / "cds"


def spark_jars() -> list[str]:
    jars = sorted(str(p) for p in SPARK_JARS.glob("*.jar"))
    if not all(any(name in j for j in jars)
               for name in ("delta-spark", "spark-sql-kafka", "spark-avro")):
        raise RuntimeError(f"Delta/Kafka/Avro jars missing in {SPARK_JARS}: run `make setup` "
                           "first")
    return jars


def object_store_classpath(settings: Settings) -> dict[str, str]:
    """hadoop-aws and the AWS SDK bundle for an s3a:// root, on the driver's and executors' class
    path (the same path on every host of the cluster; ~640 MB, so never copied to each app
    through spark.jars). Nothing for other roots."""
    if storage.scheme(settings.root) != "s3a":
        return {}
    jars = sorted(str(p) for p in S3_JARS.glob("*.jar"))
    if not any("hadoop-aws" in j for j in jars):
        raise RuntimeError(f"s3a jars missing in {S3_JARS}: run `make setup` first")
    keys = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")
    return {k: ":".join(filter(None, [settings.spark_conf_overrides.get(k), *jars])) for k in keys}


def log_store_conf(settings: Settings) -> dict[str, str]:
    """For an s3a:// root, Delta's log store whose commits the writer locks fence
    (`lakehouse.tables.commit_log`): the store for the scheme and the lock server (its password a
    secret setting: never on a command line). Its jars join spark.jars (`spark_conf`), the
    loader of Delta's own classes. Nothing for other roots."""
    return commit_log.spark_conf(str(settings.root), settings.lock_dsn)


# A short-lived driver JVM (one Dagster run in a fresh process) compiles with C1 only: C2's
# compiler threads otherwise compete with the run's own work for the 2 cores through most of a
# run that ends before C2's code pays off (a reconcile_dates run of a 3,000-event date: 143 s
# vs 71 s and 78 s vs 49 s, A/B back to back on a loaded machine,
# 2026-11-25, commit be80114). Long-lived JVMs (the service, the tests' sessions, the bench) keep C2: the test
# suite took 24 instead of 19 minutes with C1 only (2026-11-23). C1 only also shrinks the JVM's
# default code cache from 240 to 48 MB, which a driver with the S3A/AWS SDK classes filled in a
# minute (the object_store drill's service, 2026-11-28: "Out of space in CodeCache for
# adapters"): the cache keeps its usual size.
SHORT_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def java_binary() -> Path | None:
    """The `java` spark-submit starts: JAVA_HOME's, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def class_archive_path() -> Path:
    """Where the driver JVM's class archive for this machine lives (`make class-archive`,
    infra/spark/class_archive.py). Its name is a key of what the archive was dumped from (pyspark's
    version, the java binary, the jars): another JDK or jar set names another file, so a stale
    archive is never offered to a JVM."""
    java = java_binary()
    stat = java.stat() if java else None
    key = json.dumps([PYSPARK_VERSION, str(java), stat and stat.st_size, stat and stat.st_mtime_ns,
                      [Path(j).name for j in spark_jars()]])
    return CLASS_ARCHIVES / f"driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def class_archive_option(settings: Settings) -> str:
    """`-XX:SharedArchiveFile=<archive>` when this machine's archive exists and the driver's class
    path is the one it was dumped with (no extra class path: an s3a:// root's jars or a
    deployment's `spark.driver.extraClassPath`); else nothing. A driver JVM that maps it loads
    Spark's, Delta's and Kafka's classes parsed and verified already: a one-run process's session
    in ~4 s instead of ~8 s and its first Delta command in ~3.5 s instead of ~5.9 s (AppCDS;
    measured 2026-11-29, commit 5b3a676). A JVM that finds it unusable says so in
    one warning line and starts as without it."""
    if object_store_classpath(settings) or "spark.driver.extraClassPath" in \
            settings.spark_conf_overrides:
        return ""
    archive = class_archive_path()
    return f"-XX:SharedArchiveFile={archive}" if archive.exists() else ""


def avro_limits(settings: Settings) -> str:
    """Avro's decoder allocates what a record claims (a string's length, an array's item count)
    before it reads it: a few bytes claiming 2 GB would exhaust the JVM and fail the same batch
    at every restart. No string, bytes or collection of a record is longer than the record, so
    MAX_EVENT_BYTES bounds them: a claim past it is an error the decoder raises, and the record
    is quarantined as `invalid_avro` (PERMISSIVE mode)."""
    n = settings.max_event_bytes
    return " ".join(f"-Dorg.apache.avro.limits.{what}.maxLength={n}"
                    for what in ("string", "bytes", "collectionItems"))


def spark_conf(settings: Settings, short_run: bool = False,
               class_archive: bool = True) -> dict[str, str]:
    """Spark configuration shared by every entry point (Dagster resource, service, bench);
    `short_run`: a JVM that lives for one run (`SHORT_RUN_JAVA_OPTIONS` for the driver);
    `class_archive`: the driver starts from this machine's class archive when there is one
    (`class_archive_option`; the bench's hand-written peers start as spark-submit does)."""
    driver_extra = " ".join(filter(None, (SHORT_RUN_JAVA_OPTIONS if short_run else "",
                                          class_archive_option(settings) if class_archive else "")))
    return {
        "spark.master": settings.spark_master,
        "spark.app.name": "eventtime-lakehouse",
        "spark.jars": ",".join(spark_jars() + (commit_log.log_store_jars()
                                               if log_store_conf(settings) else [])),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Spark's default of 200 costs seconds per tiny batch on 2 cores.
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.default.parallelism": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "true" if settings.spark_ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "4g",
        "spark.sql.adaptive.enabled": "true",
        # Adaptive execution may replace a stage whose input turned out empty (a replay of a
        # date with records read but none of its events) by an empty relation, dropping the
        # observed metrics the stage collected: `Observation.get` then fails ("assertion
        # failed"). The rule saves nothing worth that here.
        "spark.sql.adaptive.optimizer.excludedRules":
            "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation",
        # Generated classes kept for reuse (default 100): one ingest batch compiles ~180, so the
        # default cache evicts them all and every batch compiled them again (1-2 s a batch here).
        "spark.sql.codegen.cache.maxEntries": "4000",
        # Cached frames (each batch's classification, the corrections' diffs) live for one batch
        # or run: compressing them costs more CPU (~0.6 s per 200k events here) than it saves.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # On a local master shuffle blocks never cross a network: compressing them is CPU for
        # nothing (an ingest batch's dedup + windows: ~10.4 against ~12.7 µs CPU a record,
        # bench/results/step-ab-windows-2026-11-27T114303.json .. T114946.json). A cluster keeps
        # Spark's default.
        **({"spark.shuffle.compress": "false"} if settings.spark_master.startswith("local")
           else {}),
        # Delta rebuilds table snapshots with this many tasks (default 50): seconds per commit
        # and per read of a small table on 2 cores.
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
        # VACUUM lists a table's directories with this many tasks (default 10,000: minutes
        # for a small table on 2 cores).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(settings.shuffle_partitions),
        "spark.sql.chunkBase64String.enabled": "false",  # quarantine raw bytes on one line
        # Timestamps written as Parquet's TIMESTAMP_MICROS, not the legacy INT96: bronze's append
        # ~13% cheaper a record (10.10 against 11.65 µs CPU, 200k events,
        # bench/results/step-ab-bronze-2026-12-02T080243.json); Spark, delta-rs and polars read
        # both, so older files stay readable beside new ones.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "false",
        "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        "spark.sql.warehouse.dir": settings.path(WAREHOUSE_DIR),
        # Executors on other hosts connect back to the driver at this address.
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_host,
        # An s3a:// root: endpoint, path style, region (credentials: the AWS chain, from env).
        **storage.s3a_spark_conf(settings.root),
        # An s3a:// root: the log store whose commits the writer locks fence.
        **log_store_conf(settings),
        # SPARK_CONF_<key> env vars: any other Spark setting (credentials, executor sizes).
        **settings.spark_conf_overrides,
        **object_store_classpath(settings),
        # JVMs stay in UTC whatever extra options are passed, and Avro never believes a
        # record's claim of a string, bytes or collection longer than a record may be.
        **{k: " ".join(filter(None, (settings.spark_conf_overrides.get(k, ""),
                                     driver_extra if "driver" in k else "",
                                     "-Duser.timezone=UTC", avro_limits(settings))))
           for k in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")},
    }


# The keys of `spark_conf` a Spark Connect session sets for itself (runtime SQL and Delta
# settings); the others only take effect when a JVM starts: the server's launch takes them
# (infra/spark/connect.py). The ones sized from the shuffle partitions are set only when
# SPARK_SHUFFLE_PARTITIONS is given (else the server's, sized for its own machine or cluster).
CONNECT_SESSION_KEYS = (
    "spark.sql.session.timeZone", "spark.sql.adaptive.enabled",
    "spark.sql.adaptive.optimizer.excludedRules",
    "spark.sql.inMemoryColumnarStorage.compressed", "spark.sql.chunkBase64String.enabled",
    "spark.sql.parquet.outputTimestampType",
    "spark.sql.streaming.metricsEnabled", "spark.sql.streaming.numRecentProgressUpdates",
    "spark.databricks.delta.schema.autoMerge.enabled",
    "spark.databricks.delta.properties.defaults.enableChangeDataFeed",
)
CONNECT_SIZED_KEYS = ("spark.sql.shuffle.partitions", "spark.databricks.delta.snapshotPartitions",
                      "spark.sql.sources.parallelPartitionDiscovery.parallelism")


def connect_session(settings: Settings, extra: dict | None = None) -> SparkSession:
    """A Spark Connect session on `settings.spark_remote` with the run's runtime settings
    (`CONNECT_SESSION_KEYS`, and `extra`'s `spark.sql.*` keys). A key of `extra` that only takes
    effect at a JVM's start (memory, cores) is refused: it belongs to the server's launch.
    A process holding a Connect session is a Connect client for good (pyspark's functions
    build Connect columns from then on): it starts no classic session afterwards."""
    refused = sorted(k for k in (extra or {}) if not k.startswith("spark.sql."))
    if refused:
        raise ValueError(f"{', '.join(refused)}: not a session setting of a Spark Connect run "
                         f"({remote_shown(settings.spark_remote)}); it is the server's, set "
                         "where it starts "
                         "(SPARK_CONF_* in the environment of `make spark-up`)")
    conf = spark_conf(settings)
    keys = CONNECT_SESSION_KEYS + (CONNECT_SIZED_KEYS if settings.shuffle_partitions_explicit
                                   else ())
    session_conf = {**{k: conf[k] for k in keys}, **(extra or {})}
    # The local server's token, when SPARK_REMOTE names it (Settings.spark_remote_url).
    spark = SparkSession.builder.remote(settings.spark_remote_url).config(
        map=session_conf).getOrCreate()
    # Its operations run in the server and outlive this process: recorded with the writer
    # locks, so the next holder stops what a killed run left running (spark_jobs.connect_work).
    record_session(spark)
    return spark


def _launched(builder: SparkSession.Builder, properties: Path | None) -> SparkSession:
    """`builder.getOrCreate()`; with `properties` (the secret settings' file), the JVM it
    launches reads them from it (`spark-submit --properties-file`), not from its command line."""
    if properties is None:
        return builder.getOrCreate()
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {properties} " + (
        before or "pyspark-shell")
    try:
        return builder.getOrCreate()
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before


def get_spark(settings: Settings, extra: dict | None = None, short_run: bool = False,
              classic: bool = False, class_archive: bool = True) -> SparkSession:
    """Create (or return the running) session configured for `settings`, plus `extra` keys
    (the Dagster resource's `spark_config`); `short_run`: see `spark_conf` (it only matters
    when this call starts the JVM). With SPARK_REMOTE set (`settings.spark_remote`) a Spark
    Connect session (`connect_session`) unless `classic`: a driver in this process (the
    streaming service and the catch-up always run one). `class_archive`: see `spark_conf`."""
    if settings.spark_remote and not classic:
        return connect_session(settings, extra)
    if "SPARK_CONNECT_MODE_ENABLED" in os.environ:
        raise RuntimeError("this process already holds a Spark Connect session: it cannot start "
                           "a classic one (run the catch-up and the service in processes of "
                           "their own)")
    # pyspark's builder reads SPARK_REMOTE itself: a classic session in a process whose
    # environment sets it is built without it.
    os.environ.pop("SPARK_REMOTE", None)
    conf = {**spark_conf(settings, short_run, class_archive), **(extra or {})}
    launching = SparkContext._gateway is None  # this call starts the JVM
    plain, secret = spark_secrets.split(conf) if launching else (conf, {})
    builder = SparkSession.builder
    for key, value in plain.items():
        builder = builder.config(key, value)
    with spark_secrets.properties_file(secret) as properties:
        spark = _launched(builder, properties)
    spark.sparkContext.setLogLevel("WARN")
    if not settings.spark_master.startswith("local") and not settings.shuffle_partitions_explicit:
        # Sized from the cluster (cores of the registered executors), not the driver machine.
        spark.conf.set("spark.sql.shuffle.partitions",
                       str(max(2, 2 * spark.sparkContext.defaultParallelism)))
    # Corrections free their locally checkpointed frames when done; Spark warns on each that
    # their lineage cannot be recomputed, which is the point.
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.rdd.MapPartitionsRDD", jvm.org.apache.logging.log4j.Level.ERROR)
    return spark
