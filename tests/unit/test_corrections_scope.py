"""The event-time ranges an incremental corrections run reads: adjacent windows merged, the
count bounded by closing the smallest gaps first, every window still covered."""

from datetime import datetime, timedelta

from spark_jobs.transforms.recompute import time_ranges

T0 = datetime(2026, 11, 21)
MIN = timedelta(minutes=1)


def covered(ranges, start):
    return any(lo <= start and start + MIN <= hi for lo, hi in ranges)


def test_adjacent_windows_merge_and_distant_ones_stay_apart():
    starts = [T0, T0 + MIN, T0 + 3 * MIN, T0 + 600 * MIN]
    assert time_ranges(starts, MIN) == [(T0, T0 + 2 * MIN), (T0 + 3 * MIN, T0 + 4 * MIN),
                                        (T0 + 600 * MIN, T0 + 601 * MIN)]


def test_the_smallest_gaps_close_first_when_ranges_are_capped():
    starts = [T0, T0 + 3 * MIN, T0 + 100 * MIN, T0 + 1000 * MIN]
    assert time_ranges(starts, MIN, max_ranges=2) == [(T0, T0 + 101 * MIN),
                                                      (T0 + 1000 * MIN, T0 + 1001 * MIN)]


def test_many_scattered_windows_are_all_covered_by_at_most_max_ranges():
    starts = sorted({T0 + (i * i % 1439) * MIN for i in range(400)})
    ranges = time_ranges(starts, MIN, max_ranges=32)
    assert len(ranges) <= 32
    assert all(covered(ranges, s) for s in starts)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # disjoint, sorted


def test_no_windows_no_ranges():
    assert time_ranges([], MIN) == []
