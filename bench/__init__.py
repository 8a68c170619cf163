"""Benchmarks and drills: each writes its figures to bench/results/<kind>-<date>T<time>.json
(`testkit.results.write_result`)."""

from testkit.results import RESULTS, write_result

__all__ = ["RESULTS", "write_result"]
