"""The switch to a rebuilt spec generation and the retirement of an old one, as Dagster ops (they
make no data of their own: the tables are the assets'), `spark_jobs.generations.switch` and
`retire`."""

from functools import cache

from dagster import Config, Failure, MetadataValue, OpDefinition, OpExecutionContext, Output, op

from assets.pipelines import Pipeline
from assets.reconcile.daily import DAILY_POOL
from assets.resources import LakehouseResource, SparkResource
from spark_jobs.generations import SwitchRefused, retire, switch


class SwitchConfig(Config):
    accept_not_rebuildable: bool = False
    """Switch even though the retained log no longer holds every record of some dates: they
    are listed in the switch's metadata and the registry (`spec_generations.not_rebuildable`),
    and are absent or partial in the new generation (the old one keeps them, retired)."""


@cache
def switch_op(p: Pipeline) -> OpDefinition:
    """Pipeline `p`'s generation switch, in its daily pool (no corrections or replay runs
    beside it); the stream's writer locks of both generations are taken inside."""

    @op(name=p.named("switch_in_rebuilt_generation"), pool=p.named(DAILY_POOL),
        description="Switch to the generation rebuilt under the current spec version, once "
                    "every date is proven in it (gold == its replay from the log) or reported "
                    "as not rebuildable: one commit of the generations registry names it "
                    "current; the old generation stays readable where it is until retired.")
    def switch_generation(context: OpExecutionContext, config: SwitchConfig,
                          lakehouse: LakehouseResource, spark: SparkResource) -> Output[None]:
        settings = lakehouse.settings_for(p.name)
        try:
            report = switch(spark.session, settings, run_id=context.run.run_id,
                            accept_not_rebuildable=config.accept_not_rebuildable)
        except SwitchRefused as exc:
            raise Failure(description=str(exc),
                          metadata={k: MetadataValue.json(v) if isinstance(v, dict) else v
                                    for k, v in exc.report.as_metadata().items()}) from exc
        context.log.info(f"spec version {report.new_version} switched in, replacing "
                         f"{report.old_version}: {len(report.proven)} dates proven")
        return Output(None, metadata={
            "old_version": report.old_version or "", "new_version": report.new_version,
            "dates_proven": len(report.proven),
            "not_rebuildable": MetadataValue.json(report.not_rebuildable)})

    return switch_generation


class RetireConfig(Config):
    spec_version: str
    """The retired generation to delete (`spec_generations.spec_version`, status `retired`)."""


@cache
def retire_op(p: Pipeline) -> OpDefinition:
    """Pipeline `p`'s retirement of an old generation: its folder deleted, under its stream
    lock (taken inside: a runner still writing it makes the op fail)."""

    @op(name=p.named("retire_old_generation"), pool=p.named(DAILY_POOL),
        description="Delete a generation a switch retired (its tables, checkpoints and reports), "
                    "readable until then; refused for the current generation and one being "
                    "built.")
    def retire_generation(context: OpExecutionContext, config: RetireConfig,
                          lakehouse: LakehouseResource, spark: SparkResource) -> Output[None]:
        settings = lakehouse.settings_for(p.name)
        try:
            where = retire(spark.session, settings, config.spec_version,
                           run_id=context.run.run_id)
        except ValueError as exc:
            raise Failure(description=str(exc)) from exc
        context.log.info(f"spec version {config.spec_version} retired: {where} deleted")
        return Output(None, metadata={"spec_version": config.spec_version, "deleted": where})

    return retire_generation
