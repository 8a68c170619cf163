"""A chain of projections built on no DataFrame, applied to any number of them.

The classification (`spark_jobs.transforms.parse.classify`) is a few hundred Column expressions:
building them costs thousands of py4j round trips (~0.7-1 s of a warm driver, measured
2026-11-29: bench/results/step-ab-plan-2026-11-29T223444.json), as much as a small run's whole
replay. Built once into a
`Projections` per process and spec, each run, replay or redrive only applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Projections:
    """Selects recorded in order; `apply` runs them on a DataFrame. Column expressions name
    columns, so one chain serves every DataFrame with the columns it reads."""

    stages: tuple[tuple[Column | str, ...], ...] = ()

    def select(self, *columns: Column | str) -> Projections:
        return Projections((*self.stages, columns))

    def add(self, *columns: Column) -> Projections:
        """Every column so far, and `columns` (aliased to names not taken yet)."""
        return self.select("*", *columns)

    def apply(self, df: DataFrame) -> DataFrame:
        for columns in self.stages:
            df = df.select(*columns)
        return df
