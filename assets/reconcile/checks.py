"""Great Expectations as Dagster asset checks.

`expectations.reconciliation` (Great Expectations, ~4 s of imports on this machine) is
imported by the proof when it runs, not when the code location loads: a run without the proof
(a catch-up, a replay alone, a sensor tick, the UI) never pays for it; the daily assets of a
run that proves start it in a thread (`expectations.import_in_background`). The fast path's
check compares without GX (`expectations.comparison`)."""


from datetime import UTC, datetime
from decimal import Decimal
from functools import cache

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from assets.pipelines import Pipeline
from assets.reconcile.daily import partition_dates
from assets.resources import LakehouseResource, SparkResource
from lakehouse.kafka.admin import topic_offsets
from lakehouse.tables.catalog import LATE, RECONCILED, REPLAY, STREAMING
from lakehouse.tables.commit_tags import bronze_position
from spark_jobs.corrections import latest_state
from spark_jobs.redrive import redriven_counts
from spark_jobs.replay import latest_replay, missing_offsets
from spark_jobs.tables import date_rows, read_date


def prove_dates(session, settings, dates) -> AssetCheckResult:
    """The reconciliation verdict for `dates` (the body of the blocking check). A date passes
    only when gold and the replay were computed from the same log position, the retained log
    holds every record of the date, there is data, and the rows are equal."""
    from expectations.reconciliation import check_equal, data_docs_dir

    verdicts, incomplete, positions, unpinned, no_data = [], {}, {}, [], []
    offsets = topic_offsets(settings)
    now = datetime.now(UTC)
    for d in dates:
        key = d.isoformat()
        state = latest_state(settings, d)
        replay = latest_replay(settings, d)
        gold_v = state.bronze_version if state is not None else None
        replay_v = replay.bronze_version if replay is not None else None
        position = bronze_position(settings, replay_v) if replay_v is not None else None
        positions[key] = {
            "reconciled_from_bronze_version": gold_v,
            "reconciled_by_run": state.run_id if state is not None else None,
            "replay_up_to_bronze_version": replay_v,
            "replayed_by_run": replay.run_id if replay is not None else None,
            # How old the proven prefix is: a stalled stream must not keep proving an old one.
            "position_committed_at": position.committed_at.isoformat()
            if position and position.committed_at else None,
            "position_age_s": round((now - position.committed_at).total_seconds(), 1)
            if position and position.committed_at else None,
            "records_after_position": sum(
                max(0, p.latest - position.end_offsets.get(p.partition, 0)) for p in offsets)
            if position else None,
        }
        if gold_v is None or replay_v is None or gold_v != replay_v:
            unpinned.append(key)
        # A replay of a log that retention has cut proves nothing: fail with the lost offsets.
        if gone := missing_offsets(session, settings, d, offsets, position):
            incomplete[key] = gone.as_metadata()
        gold = read_date(session, settings, RECONCILED, d)
        verdict = check_equal(gold, read_date(session, settings, REPLAY, d), d,
                              data_docs_dir(settings), shape=settings.shape)
        if verdict.rows_compared == 0:
            no_data.append(key)
        verdicts.append(verdict)
    failing = [v for v in verdicts if not v.success]
    reasons = [
        *([f"no data on either side for {', '.join(no_data)}"] if no_data else []),
        *([f"gold and replay computed from different log positions for {', '.join(unpinned)} "
           "(see log_positions; reconcile_dates computes both from one position)"]
          if unpinned else []),
        *([f"the retained log cannot prove {', '.join(incomplete)}"] if incomplete else []),
        *([f"rows differ for {', '.join(v.event_date for v in failing)}"] if failing else []),
    ]
    return AssetCheckResult(
        passed=not reasons,
        description="; ".join(reasons) if reasons else "reconciled == replay, row by row",
        metadata={
            "incomplete": MetadataValue.json(incomplete),
            "no_data_dates": MetadataValue.json(no_data),
            "dates": [v.event_date for v in verdicts],
            "rows_compared": sum(v.rows_compared for v in verdicts),
            "failed_expectations": MetadataValue.json(
                {v.event_date: v.failed_expectations for v in failing}
            ),
            "differing_windows": MetadataValue.json(
                {v.event_date: v.differing_windows for v in failing}
            ),
            "totals": MetadataValue.json({v.event_date: v.totals for v in verdicts}),
            # GX's Data Docs of each date's validation; a failing one lists the differing windows.
            **({"data_docs": MetadataValue.url(page)} if (page := next(
                (v.data_docs for v in failing + verdicts if v.data_docs), None)) else {}),
            "data_docs_by_date": MetadataValue.json({v.event_date: v.data_docs for v in verdicts}),
            "log_positions": MetadataValue.json(positions),
            # Records in the proven dates that a quarantine redrive landed (spark_jobs.redrive).
            "redriven_records": MetadataValue.json(redriven_counts(session, settings, list(dates))),
        },
    )


def fast_path_vs_replay_result(session, settings, dates) -> AssetCheckResult:
    """How far the fast path was from the replay for `dates` (the body of the warning check)."""
    from expectations.comparison import fast_path_gap, missed

    gaps = [
        fast_path_gap(read_date(session, settings, STREAMING, d),
                      read_date(session, settings, REPLAY, d),
                      read_date(session, settings, LATE, d), d,
                      date_rows(session, settings, LATE, d), shape=settings.shape)
        for d in dates
    ]
    # What the watermark cost per sum (the default pipeline's: `value_missed`).
    costs = [missed(c) for c in settings.shape.columns_of("sum")]
    unexplained = sum(g["windows_unexplained"] for g in gaps)
    totals = {k: sum(g[k] for g in gaps) for k in
              ("windows_compared", "windows_differing", "events_missed", "late_events")}
    return AssetCheckResult(
        passed=unexplained == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={
            **totals,
            "windows_unexplained": unexplained,
            **{m: str(sum(Decimal(g[m]) for g in gaps)) for m in costs},
            "per_date": MetadataValue.json(gaps),
        },
    )


@cache
def data_checks(p: Pipeline) -> tuple[AssetChecksDefinition, ...]:
    """Pipeline `p`'s checks of its daily assets: the blocking proof and the fast path's gap."""

    @asset_check(asset=p.key("reconciled_aggregates"), additional_deps=[p.key("replay_aggregates")],
                 blocking=True,
                 description="GX: reconciled_aggregates equals replay_aggregates for the date, "
                             "row by row (counts, exact decimal sums/min/max, fingerprints) and "
                             "in total.")
    def reconciled_equals_replay(context: AssetCheckExecutionContext,
                                 lakehouse: LakehouseResource,
                                 spark: SparkResource) -> AssetCheckResult:
        return prove_dates(spark.session, lakehouse.settings_for(p.name),
                           partition_dates(context.op_execution_context))

    @asset_check(asset=p.key("replay_aggregates"), additional_deps=[p.key("streaming_aggregates")],
                 blocking=False,
                 description="How far the fast path (streaming_aggregates) was from the replay: "
                             "windows, events and value it missed (the cost of WATERMARK_DELAY). "
                             "Warns when a difference is not explained by recorded late events.")
    def fast_path_vs_replay(context: AssetCheckExecutionContext, lakehouse: LakehouseResource,
                            spark: SparkResource) -> AssetCheckResult:
        return fast_path_vs_replay_result(spark.session, lakehouse.settings_for(p.name),
                                          partition_dates(context.op_execution_context))

    return reconciled_equals_replay, fast_path_vs_replay
