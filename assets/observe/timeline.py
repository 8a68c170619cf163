"""The observability timeline: one HTML report next to a pipeline's tables."""

from functools import cache
from pathlib import Path

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, MetadataValue, asset

from assets.observe.timeline_page import write_timeline
from assets.pipelines import Pipeline
from assets.resources import LakehouseResource, SparkResource
from spark_jobs.timeline import collect_timeline


@cache
def timeline_asset(p: Pipeline) -> AssetsDefinition:
    """Pipeline `p`'s timeline report (under its own folder's `reports/`)."""

    @asset(key=p.key("timeline_report"), deps=[p.key("streaming_aggregates")],
           group_name=p.group("observe"), owners=p.owners, kinds={"spark", "html"},
           description="One time axis: lateness (event vs broker time), watermark, consumer lag, "
                       "batch durations, aggregate freshness; and the what-if histogram of late "
                       "records per candidate WATERMARK_DELAY. Self-contained HTML under "
                       "$LAKEHOUSE_ROOT/reports.")
    def timeline_report(context: AssetExecutionContext, lakehouse: LakehouseResource,
                        spark: SparkResource) -> MaterializeResult:
        settings = lakehouse.settings_for(p.name)
        report = write_timeline(collect_timeline(spark.session, settings), settings)
        summary = dict(report.summary)
        summary.pop("path", None)
        return MaterializeResult(metadata={
            "path": MetadataValue.path(str(report.path)),
            "report": MetadataValue.url(
                Path(report.path).as_uri() if report.path.startswith("/") else report.path),
            "what_if_late_records": MetadataValue.json(summary.pop("what_if_late_records")),
            "series_points": MetadataValue.json(summary.pop("series_points")),
            "lateness_seconds": MetadataValue.json(summary.pop("lateness_seconds")),
            **{k: v for k, v in summary.items() if v is not None},
        })

    return timeline_report
