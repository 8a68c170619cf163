"""Diff recomputed windows against gold and apply the difference: gold MERGE, then the
changelog rows of its corrections, from gold's change feed (`changelog`), both tagged as the
pipeline's commits. The changelog never holds a revision gold has not published.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse.config.settings import Settings
from lakehouse.tables import delta_log
from lakehouse.tables.catalog import CORRECTIONS, RECONCILED
from lakehouse.tables.correction_result import CorrectionResult
from spark_jobs.corrections.changelog import log_published
from spark_jobs.tables import date_rows, quoted, read_table
from spark_jobs.writer import Writer


def _measures_equal(a: str, b: str, measures: tuple[str, ...]) -> F.Column:
    cond = F.lit(True)
    for m in measures:
        cond = cond & F.col(f"{a}.{m}").eqNullSafe(F.col(f"{b}.{m}"))
    return cond


def publish(
    writer: Writer,
    d: date,
    recomputed: DataFrame,
    scope: DataFrame | None,
    run_id: str,
    result: CorrectionResult,
    cause: str | None = None,
) -> CorrectionResult:
    """Diff `recomputed` with the gold rows of `d` in `scope` (windows; None = the whole date)
    and apply the differences. The cause of a correction is `late_event` when the window has
    late events; `duplicate` when it lost events without any (another copy of an event id now
    comes first); else `reprocess` (a recompute not explained by new data, such as the repair of
    a change made outside the pipeline). `cause` forces one (a reprocess run). Windows close
    at `result.watermark` (the stream's, read when the run planned); `result.windows_recomputed`
    holds the count of `recomputed`."""
    spark, settings = writer.spark, writer.settings
    shape = settings.shape
    keys, dims, measures = shape.window_id, shape.dimension_names, shape.measure_columns
    wm = F.lit(result.watermark) if result.watermark else F.lit(None).cast("timestamp")
    now = datetime.now(UTC)
    # A date gold has never held (no gold row, no changelog row): every recomputed window is an
    # insert at revision 0, its status by the watermark, with nothing to join it against.
    first = scope is None and not any(date_rows(spark, settings, t, d)
                                      for t in (RECONCILED, CORRECTIONS))
    diff = None
    try:
        with result.timed("diff"):
            if first:
                diff = recomputed.select(
                    "event_date", "window_start", "window_end", *dims,
                    *[F.col(m).alias(f"after_{m}") for m in measures],
                    F.lit("insert").alias("_action"), F.lit(0).alias("revision"),
                    F.when(F.coalesce(F.col("window_end") <= wm, F.lit(False)), "final")
                    .otherwise("open").alias("status"))
                windows = result.windows_recomputed  # counted by the caller
                counts, corrections_n = ({"insert": windows} if windows else {}), 0
            else:
                # Computed once and cut from its lineage: the counts and both MERGEs then plan
                # over a plain scan instead of re-analysing the recompute (seconds per MERGE on
                # 2 cores).
                diff = _diff(spark, settings, d, recomputed, scope, wm).localCheckpoint(eager=True)
                rows = diff.groupBy("_action", "_is_correction").agg(
                    F.count("*").alias("n")).collect()
                counts = {r._action: 0 for r in rows}
                for r in rows:
                    counts[r._action] += r.n
                corrections_n = sum(r.n for r in rows if r._is_correction)
        result.inserted = counts.get("insert", 0)
        result.removed = counts.get("remove", 0)
        result.finalized = counts.get("finalize", 0)
        result.corrected = corrections_n
        if not counts:
            return result
        src = diff.select(
            "event_date", "window_start", "window_end", *dims, "_action", "revision", "status",
            *[F.col(f"after_{m}").alias(m) for m in measures],
            F.lit(now).alias("updated_at"),
        )
        names = ("event_date", "window_start", "window_end", *dims, *measures, "revision",
                 "status", "updated_at")
        if first:
            # Nothing in gold to match: the windows appended, one commit of inserts as the MERGE
            # would make (the same rows, the same change feed), without its join and rewrite
            # planning (seconds on 2 cores, whatever the date's size).
            with result.timed("gold_append"):
                writer.append(src.select(*names), RECONCILED)
            return result
        date_pred = f"t.event_date = DATE'{d.isoformat()}'"
        columns = [quoted(c) for c in names]
        before = delta_log.version(settings, RECONCILED.name)
        with result.timed("gold_merge"):
            writer.merge(
                RECONCILED, src,
                date_pred + "".join(f" AND t.{quoted(k)} = s.{quoted(k)}" for k in keys),
                "WHEN MATCHED AND s._action = 'remove' THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET " + ", ".join(f"t.{c} = s.{c}" for c in columns)
                + " WHEN NOT MATCHED AND s._action != 'remove' THEN INSERT ("
                + ", ".join(columns) + ") VALUES (" + ", ".join(f"s.{c}" for c in columns) + ")")
        if corrections_n:
            with result.timed("changelog"):
                log_published(writer, d, before, run_id, cause)
        return result
    finally:
        if diff is not None:
            diff.unpersist()


def _diff(spark: SparkSession, settings: Settings, d: date, recomputed: DataFrame,
          scope: DataFrame | None, wm: F.Column) -> DataFrame:
    """Each window of `d` (in `scope`) whose publication changes: its action, revision and
    status, before and after images of its measures."""
    keys, dims, measures = (settings.shape.window_id, settings.shape.dimension_names,
                            settings.shape.measure_columns)
    gold = read_table(spark, settings, RECONCILED).where(F.col("event_date") == F.lit(d))
    if scope is not None:
        gold = gold.join(F.broadcast(scope), list(keys), "left_semi")
    # Windows with a changelog: a window removed and later re-inserted continues its revisions
    # (it does not restart at 0 and overwrite the changelog of its earlier life).
    history = (
        read_table(spark, settings, CORRECTIONS)
        .where(F.col("event_date") == F.lit(d))
        .groupBy(*keys)
        .agg(F.max("revision").alias("_last_revision"),
             # The last revision recorded the window as absent (a removal); else a gold row
             # was removed outside the pipeline, and its re-insert restores that revision.
             F.max_by(F.col("after_event_count").isNull(), "revision").alias("_last_removed"))
    )
    closed = F.coalesce(F.col("n.window_end") <= wm, F.lit(False))
    return (
        recomputed.alias("n")
        .join(gold.alias("o"), [F.col(f"n.{k}") == F.col(f"o.{k}") for k in keys], "full_outer")
        .join(
            F.broadcast(history).alias("h"),
            [F.coalesce(F.col(f"n.{k}"), F.col(f"o.{k}")) == F.col(f"h.{k}") for k in keys],
            "left",
        )
        .select(
            F.coalesce("n.event_date", "o.event_date").alias("event_date"),
            F.coalesce("n.window_start", "o.window_start").alias("window_start"),
            F.coalesce("n.window_end", "o.window_end").alias("window_end"),
            *[F.coalesce(f"n.{c}", f"o.{c}").alias(c) for c in dims],
            *[F.col(f"o.{m}").alias(f"before_{m}") for m in measures],
            *[F.col(f"n.{m}").alias(f"after_{m}") for m in measures],
            F.col("o.revision").alias("_old_revision"),
            F.col("o.status").alias("_old_status"),
            F.col("h._last_revision"), F.col("h._last_removed"),
            F.when(F.col("o.window_start").isNull(), "insert")
            .when(F.col("n.window_start").isNull(), "remove")
            .when(~_measures_equal("n", "o", measures), "change")
            .when((F.col("o.status") == "open") & closed, "finalize")
            .alias("_action"),
            closed.alias("_closed"),
        )
        .where(F.col("_action").isNotNull())
        .withColumn(
            "_is_correction",
            (F.col("_action") == "remove")
            | ((F.col("_action") == "change") & (F.col("_old_status") != "open"))
            | ((F.col("_action") == "insert") & F.col("_last_revision").isNotNull()),
        )
        .withColumn(
            "revision",
            F.when((F.col("_action") == "insert") & F.col("_last_revision").isNotNull(),
                   F.col("_last_revision") + F.when(F.col("_last_removed"), 1).otherwise(0))
            .when(F.col("_is_correction"), F.col("_old_revision") + 1)
            .otherwise(F.coalesce(F.col("_old_revision"), F.lit(0)))
            .cast("int"),
        )
        .withColumn(
            "status",
            F.when(F.col("_is_correction"), "corrected")
            .when(F.col("_action") == "change", F.when(F.col("_closed"), "final").otherwise("open"))
            .when(F.col("_action") == "finalize", "final")
            .when(F.col("_closed"), "final")
            .otherwise("open"),
        )
    )
