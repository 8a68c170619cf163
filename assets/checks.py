"""Great Expectations as Dagster asset checks."""


from decimal import Decimal

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)
from pyspark.sql import functions as F

from assets.daily import partition_dates
from assets.resources import LakehouseResource, SparkResource
from expectations.reconciliation import check_equal, fast_path_gap
from spark_jobs.corrections import gold_bronze_version
from spark_jobs.replay import missing_offsets, replayed_in_run
from spark_jobs.tables import LATE, RECONCILED, REPLAY, STREAMING, read_table


def _for_date(session, settings, table, d):
    return read_table(session, settings, table).where(F.col("event_date") == F.lit(d))


@asset_check(asset="reconciled_aggregates", additional_deps=["replay_aggregates"],
             blocking=True,
             description="GX: reconciled_aggregates equals replay_aggregates for the date, "
                         "row by row (counts, exact decimal sums/min/max, fingerprints) and in "
                         "total.")
def reconciled_equals_replay(context: AssetCheckExecutionContext, lakehouse: LakehouseResource,
                             spark: SparkResource) -> AssetCheckResult:
    return prove_dates(spark.session, lakehouse.settings, partition_dates(context.op_execution_context))


def prove_dates(session, settings, dates) -> AssetCheckResult:
    """The reconciliation verdict for `dates` (the body of the blocking check)."""
    verdicts, missing, positions = [], {}, {}
    for d in dates:
        # Which log prefix each side was computed from (bronze versions; see replay.py).
        positions[d.isoformat()] = {
            "reconciled_from_bronze_version": gold_bronze_version(session, settings, d),
            "replay_up_to_bronze_version": replayed_in_run(session, settings, d, None),
        }
        # A replay of a log that retention has cut proves nothing: fail with the lost offsets.
        if gone := missing_offsets(session, settings, d):
            missing[d.isoformat()] = {str(p): f"[{lo}, {hi})" for p, (lo, hi) in gone.items()}
        gold = _for_date(session, settings, RECONCILED, d)
        verdicts.append(check_equal(gold, _for_date(session, settings, REPLAY, d), d))
    failing = [v for v in verdicts if not v.success]
    return AssetCheckResult(
        passed=not failing and not missing,
        metadata={
            "offsets_deleted_by_retention": MetadataValue.json(missing),
            "dates": [v.event_date for v in verdicts],
            "rows_compared": sum(v.rows_compared for v in verdicts),
            "failed_expectations": MetadataValue.json(
                {v.event_date: v.failed_expectations for v in failing}
            ),
            "differing_windows": MetadataValue.json(
                {v.event_date: v.differing_windows for v in failing}
            ),
            "totals": MetadataValue.json({v.event_date: v.totals for v in verdicts}),
            "log_positions": MetadataValue.json(positions),
        },
    )


@asset_check(asset="replay_aggregates", additional_deps=["streaming_aggregates"], blocking=False,
             description="How far the fast path (streaming_aggregates) was from the replay: "
                         "windows, events and value it missed (the cost of WATERMARK_DELAY). "
                         "Warns when a difference is not explained by recorded late events.")
def fast_path_vs_replay(context: AssetCheckExecutionContext, lakehouse: LakehouseResource,
                        spark: SparkResource) -> AssetCheckResult:
    settings = lakehouse.settings
    session = spark.session
    gaps = [
        fast_path_gap(_for_date(session, settings, STREAMING, d),
                      _for_date(session, settings, REPLAY, d),
                      _for_date(session, settings, LATE, d), d)
        for d in partition_dates(context.op_execution_context)
    ]
    unexplained = sum(g["windows_unexplained"] for g in gaps)
    totals = {k: sum(g[k] for g in gaps) for k in
              ("windows_compared", "windows_differing", "events_missed", "late_events")}
    return AssetCheckResult(
        passed=unexplained == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={
            **totals,
            "windows_unexplained": unexplained,
            "value_missed": str(sum(Decimal(g["value_missed"]) for g in gaps)),
            "per_date": MetadataValue.json(gaps),
        },
    )
