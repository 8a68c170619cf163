"""Great Expectations suites that prove `reconciled_aggregates` equals the replay of the log.

GX does the comparing, over a full outer join of the two sides on (window_start, key): each
measure pairwise equal (an exact comparison in Spark, decimals included; a null on one side is
unequal), no window on one side only (not-null measures on each side, which also makes the row
counts equal), and the date's totals equal. It runs in two passes: first one GX
`UnexpectedRowsExpectation` per frame (the rows where any of those fails: 12 Spark operations
for both frames over Connect, where the per-measure suites took 19); only when that finds a
row, the suites with an expectation per measure (`ExpectColumnPairValuesToBeEqual`) name which
measures differ. A
failing validation is kept as Data Docs (`data_docs_dir`), listing the differing windows by
(window_start, key); the check links to its page.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # GX metric progress bars

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
from great_expectations.checkpoint import UpdateDataDocsAction  # noqa: E402
from great_expectations.render import LegacyDiagnosticRendererType  # noqa: E402
from great_expectations.render.components import RenderedTableContent  # noqa: E402
from great_expectations.render.renderer.renderer import renderer  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from expectations.comparison import WINDOW, comparison_frame, differs, sum_columns  # noqa: E402
from lakehouse.config.settings import Settings, utc  # noqa: E402
from lakehouse.events.shape import DEFAULT_SHAPE, EventShape  # noqa: E402
from lakehouse.tables.catalog import REPORTS_DIR  # noqa: E402

MAX_EVIDENCE_ROWS = 20


def detailed(shape: EventShape) -> dict:
    """A failing validation is run again at this level for its Data Docs: the unexpected rows
    with their window and dimensions, not only pass/fail (BOOLEAN_ONLY, about half the Spark
    jobs, for the first run)."""
    return {"result_format": "COMPLETE",
            "unexpected_index_column_names": [WINDOW, *shape.dimension_names]}


def data_docs_dir(settings: Settings) -> Path:
    """The GX project holding the validation results and their Data Docs: under a local
    lakehouse root (`<root>/reports/quality`); for an object-store root, a local folder named
    after it (GX's file stores are local)."""
    if settings.local_root is not None:
        return settings.local_root / REPORTS_DIR / "quality"
    return (Path(tempfile.gettempdir()) / "lakehouse-quality"
            / re.sub(r"[^A-Za-z0-9_.-]+", "_", settings.root))


class ExpectWindowMeasuresToBeEqual(gxe.ExpectColumnPairValuesToBeEqual):
    """`ExpectColumnPairValuesToBeEqual` whose Data Docs list each unexpected row with its
    window (the result's index columns), not only the sampled pairs of values."""

    @classmethod
    @renderer(renderer_type=LegacyDiagnosticRendererType.UNEXPECTED_TABLE)
    def _diagnostic_unexpected_table_renderer(cls, configuration=None, result=None,
                                              runtime_configuration=None):
        rows = (result.result or {}).get("unexpected_index_list") if result is not None else None
        if not rows:
            return super()._diagnostic_unexpected_table_renderer(
                configuration, result, runtime_configuration)
        index = list(result.result.get("unexpected_index_column_names") or [])
        header = index + [c for c in rows[0] if c not in index]
        return [RenderedTableContent(
            content_block_type="table", header_row=header,
            table=[["null" if r.get(c) is None else str(r.get(c)) for c in header] for r in rows],
            styling={"body": {"classes": ["table-bordered", "table-sm", "mt-3"]}})]


def reconciliation_suite(shape: EventShape = DEFAULT_SHAPE, name: str = "reconciled_equals_replay",
                         left: str = "reconciled", right: str = "replay") -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name)
    for side in (left, right):  # no window on one side only
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=f"{side}_event_count"))
    for m in shape.measure_columns:
        suite.add_expectation(ExpectWindowMeasuresToBeEqual(
            column_A=f"{left}_{m}", column_B=f"{right}_{m}", ignore_row_if="neither"))
    return suite


def totals_suite(shape: EventShape = DEFAULT_SHAPE, name: str = "date_totals_equal"
                 ) -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name)
    for m in total_names(shape):
        suite.add_expectation(
            gxe.ExpectColumnPairValuesToBeEqual(column_A=f"reconciled_{m}", column_B=f"replay_{m}")
        )
    return suite


def total_names(shape: EventShape) -> tuple[str, ...]:
    """The date's totals compared: windows, events and each sum."""
    return ("windows", "event_count", *shape.columns_of("sum"))


def unexpected_rows_suite(name: str, conditions: list[str]) -> gx.ExpectationSuite:
    """One GX expectation: no row of the batch fails any of `conditions` (Spark SQL, each
    never null). The first pass of a proof; `reconciliation_suite` and `totals_suite` name the
    measures when it fails."""
    suite = gx.ExpectationSuite(name=name)
    suite.add_expectation(gxe.UnexpectedRowsExpectation(
        unexpected_rows_query=f"SELECT * FROM {{batch}} WHERE NOT ({' AND '.join(conditions)})",
        description=f"every row: {'; '.join(conditions)}"))
    return suite


def rows_equal(shape: EventShape) -> list[str]:
    """The rows suite's conditions in one pass: each side has the window, each measure equal."""
    return ["`reconciled_event_count` IS NOT NULL", "`replay_event_count` IS NOT NULL",
            *[f"`reconciled_{m}` <=> `replay_{m}`" for m in shape.measure_columns]]


def totals_equal(shape: EventShape) -> list[str]:
    """The totals suite's conditions in one pass: each total equal."""
    return [f"`reconciled_{m}` <=> `replay_{m}`" for m in total_names(shape)]


@dataclass
class Verdict:
    success: bool
    event_date: str
    rows_compared: int
    failed_expectations: list[str] = field(default_factory=list)
    differing_windows: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    data_docs: str | None = None  # the rows validation's Data Docs page


def _checkpoint(context, suite: gx.ExpectationSuite, result_format, keep: bool) -> gx.Checkpoint:
    """The suite as a checkpoint over a Spark dataframe asset of its name; `keep`: its results
    are added to the Data Docs after each run."""
    source = context.data_sources.add_or_update_spark(name="lakehouse")
    try:
        asset = source.get_asset(suite.name)
    except LookupError:
        asset = source.add_dataframe_asset(name=suite.name)
    try:
        batch = asset.get_batch_definition("whole")
    except KeyError:
        batch = asset.add_batch_definition_whole_dataframe("whole")
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite.name, data=batch, suite=suite))
    return context.checkpoints.add_or_update(gx.Checkpoint(
        name=suite.name, validation_definitions=[definition], result_format=result_format,
        actions=[UpdateDataDocsAction(name="data_docs")] if keep else []))


def _validate(context, df: DataFrame, suite: gx.ExpectationSuite, result_format="BOOLEAN_ONLY",
              keep: bool = True):
    """(validation result, the URL of its Data Docs page when `keep`)."""
    run = _checkpoint(context, suite, result_format, keep).run(batch_parameters={"dataframe": df})
    (identifier, result), = run.run_results.items()
    urls = context.get_docs_sites_urls(resource_identifier=identifier) if keep else []
    return result, (urls[0]["site_url"] if urls else None)


def _totals(df: DataFrame, side: str, shape: EventShape) -> DataFrame:
    """Windows, events and each sum over the date, as text (exact in GX's comparison)."""
    sums = sum_columns(shape)
    return df.agg(
        F.count("*").cast("string").alias(f"{side}_windows"),
        F.coalesce(F.sum("event_count"), F.lit(0)).cast("string").alias(f"{side}_event_count"),
        *[F.coalesce(F.sum(c), F.lit(0)).cast(t).cast("string").alias(f"{side}_{c}")
          for c, t in sums.items()],
    )


def check_equal(reconciled: DataFrame, replay: DataFrame, d: date,
                docs: Path | None = None, shape: EventShape = DEFAULT_SHAPE) -> Verdict:
    """Validate reconciled == replay for one date, row by row and in total. A failing rows
    validation is run again with its unexpected rows and kept as Data Docs in the GX project
    `docs` (`Verdict.data_docs`: its page); a passing one leaves nothing on disk."""
    context = gx.get_context(mode="ephemeral")
    frame = comparison_frame(reconciled, replay, "reconciled", "replay", shape).persist()
    # The date's totals, one row kept once computed: each query over the two tables would read
    # them again (a Delta file-filtering job per table and query).
    totals_df = _totals(reconciled, "reconciled", shape).crossJoin(
        _totals(replay, "replay", shape)).persist()
    try:
        rows, page = _validate(context, frame, unexpected_rows_suite(
            "reconciled_equals_replay_rows", rows_equal(shape)), keep=False)
        if not rows.success:  # again, by measure (kept with the differing windows)
            kept = gx.get_context(mode="file", project_root_dir=str(docs)) if docs else None
            rows, page = _validate(context if kept is None else kept, frame,
                                   reconciliation_suite(shape),
                                   "BOOLEAN_ONLY" if kept is None else detailed(shape),
                                   keep=kept is not None)
        totals, _ = _validate(context, totals_df, unexpected_rows_suite(
            "date_totals_equal_rows", totals_equal(shape)), keep=False)
        if not totals.success:  # again, by total
            totals, _ = _validate(context, totals_df, totals_suite(shape), keep=False)
        failed = [
            prefix + (r.expectation_config.kwargs.get("column")
                      or "{column_A} == {column_B}".format(**r.expectation_config.kwargs))
            for prefix, res in (("", rows), ("totals: ", totals))
            for r in res.results
            if not r.success
        ]
        evidence = [] if rows.success and totals.success else [
            {k: (str(utc(v) if isinstance(v, datetime) else v) if v is not None else None)
             for k, v in r.asDict().items()}
            for r in frame.where(differs("reconciled", "replay", shape)).orderBy(*shape.window_id)
            .limit(MAX_EVIDENCE_ROWS).collect()
        ]
        return Verdict(
            success=rows.success and totals.success,
            event_date=d.isoformat(),
            rows_compared=frame.count(),
            failed_expectations=failed,
            differing_windows=evidence,
            totals=totals_df.first().asDict(),
            data_docs=page,
        )
    finally:
        frame.unpersist()
        totals_df.unpersist()
