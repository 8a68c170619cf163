"""The changelog (`late_corrections`) is derived from gold's own Change Data Feed, after gold
commits: it logs only what gold published, never a revision gold does not hold.

Gold (`reconciled_aggregates`) is committed first; its change feed then holds, per changed
window, the row before and after. A change is a correction when gold's new row is `corrected`
with a higher revision than before (a changed or re-inserted published window), or when the
window was deleted (a removal: the next revision, no measures after). A run that dies between
gold's commit and the changelog's is completed by the date's next run (`repair`), which reads
the same feed from the version the date's last completed run started at. The changelog is keyed
by (window, key, revision) and only inserted into, so logging a commit twice writes nothing.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import CORRECTIONS, LATE, RECONCILED
from lakehouse.tables.commit_tags import PIPELINE_TAG
from spark_jobs.tables import quoted, read_changes, read_table
from spark_jobs.writer import Writer


def _tag_parts(meta: str) -> tuple[str, str] | None:
    """(mode, run id) of a pipeline commit's tag `lakehouse-pipeline:<mode>:<date>:<run id>`."""
    parts = meta.split(":", 3)
    return (parts[1], parts[3]) if len(parts) == 4 and parts[0] == PIPELINE_TAG else None


def pipeline_commits(settings: Settings, d: date, since: int) -> dict[int, tuple[str, str]]:
    """Gold commits after `since` that the pipeline made for date `d`: version -> (mode, run)."""
    log = delta_log.open_table(settings, RECONCILED.name)
    if log is None or log.version() <= since:
        return {}
    out = {}
    for c in log.history(log.version() - since):
        meta = c.get("userMetadata") or ""
        if c["version"] > since and f":{d.isoformat()}:" in meta and (tag := _tag_parts(meta)):
            out[c["version"]] = tag
    return out


def corrections_in(spark: SparkSession, settings: Settings, d: date, first: int, last: int,
                   commits: dict[int, tuple[str, str]] | None = None,
                   run_id: str | None = None, cause: str | None = None) -> DataFrame:
    """Changelog rows for the corrections in gold's commits `first`..`last` of date `d` (only
    `commits` when given, each with its mode and run id; else `run_id` and `cause` for all).
    Working columns start with _ (a spec's column names start with a letter)."""
    changes = (read_changes(spark, settings, RECONCILED, first, last)
               .where(F.col("event_date") == F.lit(d)))
    if commits is not None:
        changes = changes.where(F.col("_commit_version").isin(list(commits)))
    on = [*settings.shape.window_id, "_commit_version"]
    pre = changes.where(F.col("_change_type").isin("update_preimage", "delete"))
    post = changes.where(F.col("_change_type").isin("update_postimage", "insert"))
    late = (read_table(spark, settings, LATE).where(F.col("event_date") == F.lit(d))
            .select(*settings.shape.window_id).distinct().withColumn("_has_late", F.lit(True)))
    joined = (post.alias("a").join(pre.alias("b"), on, "full_outer")
              .join(F.broadcast(late).alias("l"), list(settings.shape.window_id), "left"))
    removed = F.col("a.revision").isNull()
    revision = F.when(removed, F.col("b.revision") + 1).otherwise(F.col("a.revision"))
    is_correction = removed | ((F.col("a.status") == "corrected") & (
        F.col("b.revision").isNull() | (F.col("a.revision") > F.col("b.revision"))))
    if commits is not None:
        modes = spark.createDataFrame([(v, m, r) for v, (m, r) in commits.items()],
                                      "_commit_version LONG, _mode STRING, _run_id STRING")
        joined = joined.join(F.broadcast(modes), "_commit_version", "left")
        run_col = F.col("_run_id")
        forced = F.when(F.col("_mode") == "reprocess", F.lit("reprocess"))
    else:
        run_col = F.lit(run_id)
        forced = F.when(F.lit(cause is not None), F.lit(cause))
    return joined.where(is_correction).select(
        F.coalesce("a.event_date", "b.event_date").alias("event_date"),
        "window_start",
        F.coalesce("a.window_end", "b.window_end").alias("window_end"),
        *settings.shape.dimension_names,
        revision.cast("int").alias("revision"),
        F.coalesce(
            forced,
            F.when(F.col("l._has_late"), "late_event")
            .when(F.coalesce(F.col("a.event_count"), F.lit(0)) < F.col("b.event_count"),
                  "duplicate")
            .otherwise("reprocess"),
        ).alias("cause"),
        *[F.col(f"b.{m}").alias(f"before_{m}") for m in settings.shape.measure_columns],
        *[F.col(f"a.{m}").alias(f"after_{m}") for m in settings.shape.measure_columns],
        F.coalesce("a._commit_timestamp", "b._commit_timestamp").alias("corrected_at"),
        run_col.cast("string").alias("run_id"),
    )


def append_new(writer: Writer, d: date, rows: DataFrame) -> int:
    """Insert the rows whose (window, key, revision) the changelog does not hold; the count."""
    spark, settings = writer.spark, writer.settings
    logged = (read_table(spark, settings, CORRECTIONS).where(F.col("event_date") == F.lit(d))
              .select(*settings.shape.window_id, "revision"))
    keys = [*settings.shape.window_id, "revision"]
    rows = rows.join(logged, keys, "left_anti").localCheckpoint(eager=True)
    try:
        n = rows.count()
        if n:  # the MERGE only guards against a writer outside the date's lock
            writer.merge(CORRECTIONS, rows,
                         f"t.event_date = DATE'{d.isoformat()}'"
                         + "".join(f" AND t.{quoted(k)} = s.{quoted(k)}" for k in keys),
                         "WHEN NOT MATCHED THEN INSERT *")
        return n
    finally:
        rows.unpersist()


def log_published(writer: Writer, d: date, before: int, run_id: str, cause: str | None) -> int:
    """Log the corrections of gold's commits after version `before` (this run's, under the
    date's lock) of date `d`."""
    spark, settings = writer.spark, writer.settings
    last = delta_log.version(settings, RECONCILED.name)
    if last <= before:
        return 0
    return append_new(writer, d, corrections_in(spark, settings, d, before + 1, last,
                                                run_id=run_id, cause=cause))


def repair(writer: Writer, d: date, state) -> int:
    """Log the corrections of a run that died after gold's commit and before the changelog's:
    the pipeline's gold commits of `d` since the last completed run started, other than that
    run's own (logged, since its state row is written after its changelog)."""
    if state is None:  # no completed run: nothing was published before, no correction either
        return 0
    spark, settings = writer.spark, writer.settings
    commits = {v: t for v, t in pipeline_commits(settings, d, state.reconciled_version).items()
               if t[1] != state.run_id}
    if not commits:
        return 0
    return append_new(writer, d,
                      corrections_in(spark, settings, d, min(commits), max(commits), commits))
