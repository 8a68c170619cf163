"""Great Expectations suites that prove `reconciled_aggregates` equals the replay of the log.

GX converts column sums to floats in its metrics, so the exact decimal comparison happens in
Spark (boolean columns on a full outer join of both sides) and GX asserts over that frame; the
differing windows themselves are collected in Spark for the check's evidence (DESIGN §10).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date, datetime

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # GX metric progress bars

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from lakehouse.settings import utc  # noqa: E402
from spark_jobs.tables import MEASURE_COLUMNS  # noqa: E402

KEY = ("window_start", "key")
CHECK_COLUMNS = (
    "present_in_reconciled",
    "present_in_replay",
    "count_equal",
    "sum_equal",
    "min_max_equal",
    "fingerprint_equal",
)
MAX_EVIDENCE_ROWS = 20


def comparison_frame(left: DataFrame, right: DataFrame, left_name: str, right_name: str):
    """Full outer join on (window_start, key) with one exact boolean column per property."""
    l_, r_ = left.alias("l"), right.alias("r")
    joined = l_.join(r_, [F.col(f"l.{k}") == F.col(f"r.{k}") for k in KEY], "full_outer")

    def same(col: str) -> F.Column:
        return F.coalesce(F.col(f"l.{col}").eqNullSafe(F.col(f"r.{col}")), F.lit(False))

    return joined.select(
        F.coalesce("l.window_start", "r.window_start").alias("window_start"),
        F.coalesce("l.key", "r.key").alias("key"),
        *[F.col(f"l.{m}").alias(f"{left_name}_{m}") for m in MEASURE_COLUMNS],
        *[F.col(f"r.{m}").alias(f"{right_name}_{m}") for m in MEASURE_COLUMNS],
        F.col("l.key").isNotNull().alias("present_in_reconciled"),
        F.col("r.key").isNotNull().alias("present_in_replay"),
        same("event_count").alias("count_equal"),
        same("value_sum").alias("sum_equal"),
        (same("value_min") & same("value_max")).alias("min_max_equal"),
        same("event_fingerprint").alias("fingerprint_equal"),
    ).withColumn("matches", F.expr(" AND ".join(CHECK_COLUMNS)))


def reconciliation_suite(name: str = "reconciled_equals_replay") -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name)
    for column in (*CHECK_COLUMNS, "matches"):
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=[True]))
    return suite


def totals_suite(name: str = "date_totals_equal") -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name)
    for m in ("windows", "event_count", "value_sum"):
        suite.add_expectation(
            gxe.ExpectColumnPairValuesToBeEqual(column_A=f"reconciled_{m}", column_B=f"replay_{m}")
        )
    return suite


@dataclass
class Verdict:
    success: bool
    event_date: str
    rows_compared: int
    failed_expectations: list[str] = field(default_factory=list)
    differing_windows: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)


def _validate(context, df: DataFrame, suite: gx.ExpectationSuite, asset: str):
    source = context.data_sources.add_or_update_spark(name=f"lakehouse_{asset}")
    batch = (
        source.add_dataframe_asset(name=asset)
        .add_batch_definition_whole_dataframe("whole")
        .get_batch(batch_parameters={"dataframe": df})
    )
    context.suites.add(suite)
    # Only pass/fail per expectation is used (the differing rows come from the frame itself):
    # BOOLEAN_ONLY skips the unexpected-value metrics, about half of a validation's Spark jobs.
    return batch.validate(suite, result_format="BOOLEAN_ONLY")


def _totals(df: DataFrame, side: str) -> DataFrame:
    return df.agg(
        F.count("*").cast("string").alias(f"{side}_windows"),
        F.coalesce(F.sum("event_count"), F.lit(0)).cast("string").alias(f"{side}_event_count"),
        F.coalesce(F.sum("value_sum"), F.lit(0)).cast("decimal(38,6)").cast("string")
        .alias(f"{side}_value_sum"),
    )


def check_equal(reconciled: DataFrame, replay: DataFrame, d: date) -> Verdict:
    """Validate reconciled == replay for one date, row by row and in total."""
    context = gx.get_context(mode="ephemeral")  # suites need an active context
    frame = comparison_frame(reconciled, replay, "reconciled", "replay").persist()
    try:
        rows = _validate(context, frame, reconciliation_suite(), "reconciliation")
        totals_df = _totals(reconciled, "reconciled").crossJoin(_totals(replay, "replay"))
        totals = _validate(context, totals_df, totals_suite(), "totals")
        failed = [
            r.expectation_config.kwargs.get("column")
            or "{column_A} == {column_B}".format(**r.expectation_config.kwargs)
            for res in (rows, totals)
            for r in res.results
            if not r.success
        ]
        evidence = [
            {k: (str(utc(v) if isinstance(v, datetime) else v) if v is not None else None)
             for k, v in r.asDict().items()}
            for r in frame.where(~F.col("matches")).orderBy(*KEY).limit(MAX_EVIDENCE_ROWS).collect()
        ]
        return Verdict(
            success=rows.success and totals.success,
            event_date=d.isoformat(),
            rows_compared=frame.count(),
            failed_expectations=failed,
            differing_windows=evidence,
            totals=totals_df.first().asDict(),
        )
    finally:
        frame.unpersist()


def fast_path_gap(streaming: DataFrame, replay: DataFrame, late: DataFrame, d: date) -> dict:
    """How far the fast path was from the replay for one date: the windows, events and value
    the watermark cost. A differing window is explained when the late lane recorded events in
    it, or when the fast path still has it open."""
    status = streaming.select(*KEY, F.col("status").alias("fast_path_status"))
    late_windows = late.select(*KEY).distinct().withColumn("has_late", F.lit(True))
    frame = (
        comparison_frame(streaming, replay, "streaming", "replay")
        .join(status, list(KEY), "left")
        .join(late_windows, list(KEY), "left")
    )
    differs = ~F.col("matches")
    explained = F.col("has_late").isNotNull() | (F.col("fast_path_status") == "open")

    def total(col: str) -> F.Column:
        return F.coalesce(F.sum(F.coalesce(F.col(col), F.lit(0))), F.lit(0))

    row = frame.agg(
        F.count("*").alias("windows_compared"),
        F.count(F.when(differs, 1)).alias("windows_differing"),
        F.count(F.when(differs & ~F.col("present_in_reconciled"), 1)).alias("windows_missing"),
        F.count(F.when(differs & ~F.coalesce(explained, F.lit(False)), 1))
        .alias("windows_unexplained"),
        (total("replay_event_count") - total("streaming_event_count")).alias("events_missed"),
        (total("replay_value_sum") - total("streaming_value_sum")).cast("decimal(38,6)")
        .alias("value_missed"),
    ).first()
    gap = row.asDict()
    gap["value_missed"] = str(gap["value_missed"])
    gap["late_events"] = late.count()
    gap["event_date"] = d.isoformat()
    return gap
