"""The downstream feed of gold's revisions (`lakehouse.kafka.feed`): after the proof of a
run's dates, every gold version the feed topic does not carry yet, one Kafka transaction each."""

from functools import cache

import dagster as dg

from assets.pipelines import Pipeline
from assets.resources import LakehouseResource
from lakehouse.kafka.feed import FeedFenced, publish


@cache
def feed_asset(p: Pipeline) -> dg.AssetsDefinition:
    """Pipeline `p`'s feed asset, on its daily partitions (a run's dates were just proven; a
    backfill of any date publishes whatever gold holds that the topic does not)."""

    @dg.asset(key=p.key("reconciled_feed"), deps=[p.key("reconciled_aggregates")],
              group_name=p.group("reconcile"), owners=p.owners, kinds={"kafka"}, partitions_def=p.partitions,
              backfill_policy=dg.BackfillPolicy.single_run(), code_version=p.code_version,
              description="Every revision of a reconciled window on the feed topic "
                          "(RECONCILED_TOPIC, default <topic>.reconciled; compacted, keyed by "
                          "the window): one Kafka transaction per gold version with its "
                          "progress record, for consumers reading with read_committed.")
    def reconciled_feed(lakehouse: LakehouseResource) -> dg.MaterializeResult:
        settings = lakehouse.settings_for(p.name)
        try:
            result = publish(settings)
        except FeedFenced as exc:
            raise dg.Failure(description=str(exc)) from exc
        return dg.MaterializeResult(metadata={
            **result.as_metadata(),
            "first": result.first if result.first is not None else -1,
            "last": result.last if result.last is not None else -1,
        })

    return reconciled_feed
