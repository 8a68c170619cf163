"""Table maintenance as a Dagster op (it makes no data, so it is not an asset): compaction of
small files and VACUUM, `spark_jobs.maintenance`."""

from functools import cache

from dagster import (
    MetadataValue,
    OpDefinition,
    OpExecutionContext,
    Output,
    TableColumn,
    TableRecord,
    TableSchema,
    op,
)

from assets.pipelines import Pipeline
from assets.reconcile.daily import DAILY_POOL
from assets.resources import LakehouseResource, SparkResource
from spark_jobs.maintenance import MIN_FILES, maintain_tables

SCHEMA = TableSchema(columns=[
    TableColumn("table", "string"), TableColumn("dates_compacted", "int"),
    TableColumn("files_before", "int"), TableColumn("files_after", "int"),
    TableColumn("files_vacuumed", "int"), TableColumn("retention_hours", "float"),
    TableColumn("skipped", "string"),
])


@cache
def maintenance_op(p: Pipeline) -> OpDefinition:
    """Pipeline `p`'s maintenance of its tables. In its daily pool: on an object store (no file
    locks) it keeps compactions of the daily tables from racing a corrections or replay run."""

    @op(name=p.named("compact_and_vacuum"), pool=p.named(DAILY_POOL),
        description=f"Compact every table partition holding >= {MIN_FILES} files where no "
                    "writer races it, then VACUUM files older than the table's Delta log "
                    "retention.")
    def compact_and_vacuum(context: OpExecutionContext, lakehouse: LakehouseResource,
                           spark: SparkResource) -> Output[None]:
        done = maintain_tables(spark.session, lakehouse.settings_for(p.name))
        for m in done:
            if m.skipped:
                context.log.warning(f"{m.table}: not maintained: {m.skipped}")
            if m.dates_compacted or m.files_vacuumed:
                context.log.info(f"{m.table}: {len(m.dates_compacted)} dates compacted, "
                                 f"{m.files_before} -> {m.files_after} files, "
                                 f"{m.files_vacuumed} vacuumed")
        return Output(None, metadata={
            "tables": MetadataValue.table(
                [TableRecord({"table": m.table, "dates_compacted": len(m.dates_compacted),
                              "files_before": m.files_before, "files_after": m.files_after,
                              "files_vacuumed": m.files_vacuumed,
                              "retention_hours": m.retention_hours, "skipped": m.skipped})
                 for m in done],
                schema=SCHEMA),
            "files_removed": sum(m.files_removed for m in done),
            "files_vacuumed": sum(m.files_vacuumed for m in done),
        })

    return compact_and_vacuum
