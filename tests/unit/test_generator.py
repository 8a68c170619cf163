from datetime import UTC, datetime, timedelta

from testkit.generator import MALFORMED_KINDS, GeneratorConfig, end_across_midnight, generate

END = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_same_seed_same_bytes_and_different_seed_differs():
    a = generate(GeneratorConfig(count=3000, seed=42, end=END))
    b = generate(GeneratorConfig(count=3000, seed=42, end=END))
    c = generate(GeneratorConfig(count=3000, seed=43, end=END))
    assert [(r.key, r.value) for r in a.records] == [(r.key, r.value) for r in b.records]
    assert [r.value for r in a.records] != [r.value for r in c.records]


def test_realistic_mix():
    g = generate(GeneratorConfig(count=20000, seed=1, end=END, malformed_fraction=0.01))
    kinds = g.kinds()
    assert len(g.records) == 20000
    for kind in ("event", "late", "duplicate", "late_duplicate", *MALFORMED_KINDS):
        assert kinds[kind] > 0, kind
    events = [r.event for r in g.records if r.kind in ("event", "late")]
    hot = sum(1 for e in events if e["key"] == "merchant-0000") / len(events)
    assert 0.25 < hot < 0.4  # a hot key
    # Duplicates re-send an earlier event unchanged.
    ids = {e["event_id"] for e in events}
    assert all(r.event["event_id"] in ids for r in g.records if "duplicate" in r.kind)


def test_event_times_fall_in_the_span_and_disorder_stays_within_the_delay():
    cfg = GeneratorConfig(count=5000, seed=3, end=END, span=timedelta(hours=6), late_fraction=0)
    g = generate(cfg)
    times = []
    for r in g.records:
        if r.kind != "event":
            continue
        t = r.event["event_time"]
        ts = (datetime.fromtimestamp(t / 1000, UTC) if isinstance(t, int)
              else datetime.fromisoformat(t.replace("Z", "+00:00")))
        times.append(ts)
    assert min(times) >= END - cfg.span - cfg.disorder and max(times) <= END
    running_max = times[0]
    for t in times:
        assert running_max - t <= cfg.disorder  # out of order, but never late
        running_max = max(running_max, t)


def test_the_scenario_spans_a_midnight_at_any_hour_near_midnight_included():
    """The e2e scenario's data (6 hours ending at `end_across_midnight(now)`) covers two UTC
    dates and ends at least 10 minutes before now, with the clock pinned around midnight, in
    UTC and in another zone."""
    from zoneinfo import ZoneInfo

    day = datetime(2026, 3, 8, tzinfo=UTC)  # a DST change in New York
    for minutes in (0, 1, 5, 9, 10, 11, 39, 40, 41, 125, 130, 720, 1439):
        for now in (day + timedelta(minutes=minutes),
                    (day + timedelta(minutes=minutes)).astimezone(ZoneInfo("America/New_York"))):
            end = end_across_midnight(now)
            start = end - timedelta(hours=6)
            assert end.tzinfo is not None and end <= now - timedelta(minutes=10), (now, end)
            assert start.astimezone(UTC).date() < end.astimezone(UTC).date(), (now, start, end)
            # at least 10 minutes of data on the later date
            later = datetime.combine(end.astimezone(UTC).date(), datetime.min.time(), tzinfo=UTC)
            assert end - later >= timedelta(minutes=10), (now, end)


def test_an_end_within_one_date_keeps_the_span_on_one_date_and_in_the_past():
    from datetime import UTC, datetime, timedelta

    from testkit.generator import end_within_one_date

    for hour, minute in ((0, 5), (1, 59), (3, 30), (4, 30), (12, 0), (23, 59)):
        now = datetime(2026, 12, 2, hour, minute, tzinfo=UTC)
        end = end_within_one_date(now, timedelta(hours=4))
        assert end <= now - timedelta(minutes=10)
        assert (end - timedelta(hours=4)).date() == end.date(), (now, end)
