"""Great Expectations as Dagster asset checks."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, MetadataValue, asset_check
from pyspark.sql import functions as F

from assets.daily import partition_dates
from expectations.reconciliation import check_equal
from orchestration.resources import LakehouseResource, SparkResource
from spark_jobs.tables import RECONCILED, REPLAY, read_table


@asset_check(asset="reconciled_aggregates", additional_deps=["replay_aggregates"],
             blocking=True,
             description="GX: reconciled_aggregates equals replay_aggregates for the date, "
                         "row by row (counts, exact decimal sums/min/max, fingerprints) and in "
                         "total.")
def reconciled_equals_replay(context: AssetCheckExecutionContext, lakehouse: LakehouseResource,
                             spark: SparkResource) -> AssetCheckResult:
    settings = lakehouse.settings
    session = spark.session
    verdicts = []
    for d in partition_dates(context.op_execution_context):
        gold = read_table(session, settings, RECONCILED).where(F.col("event_date") == F.lit(d))
        replay = read_table(session, settings, REPLAY).where(F.col("event_date") == F.lit(d))
        verdicts.append(check_equal(gold, replay, d))
    failing = [v for v in verdicts if not v.success]
    return AssetCheckResult(
        passed=not failing,
        metadata={
            "dates": [v.event_date for v in verdicts],
            "rows_compared": sum(v.rows_compared for v in verdicts),
            "failed_expectations": MetadataValue.json(
                {v.event_date: v.failed_expectations for v in failing}
            ),
            "differing_windows": MetadataValue.json(
                {v.event_date: v.differing_windows for v in failing}
            ),
            "totals": MetadataValue.json({v.event_date: v.totals for v in verdicts}),
        },
    )
