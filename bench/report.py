"""`make report`: the generated tables of docs/performance.md and docs/cluster.md and the plots
under docs/images/, from bench/results/ (testkit/perf_report.py, which tests/unit/test_performance_page.py compares)."""

from testkit.perf_report import main

if __name__ == "__main__":
    main()
