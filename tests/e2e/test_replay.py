"""The replay of a date whose read holds records but none of its events: those a catch-up took
today, all of them events of the day before (in the first hour after a midnight, a backfill of
every partition replays today's so). It writes no window and says what it read; adaptive
execution, which replaces a stage found empty, once dropped the replay's observed counts and the
run failed ("assertion failed")."""

from datetime import UTC, datetime, time, timedelta


def test_a_date_with_records_read_but_none_of_its_events_replays_to_no_windows(
        instance_env, spark):
    from spark_jobs.replay import run_replay
    from spark_jobs.stream import catch_up
    from testkit.generator import GeneratorConfig, generate, produce

    settings = instance_env
    count = 40
    while True:  # produced on the date it replays (a midnight between would move them)
        today = datetime.now(UTC).date()
        produce(settings, generate(GeneratorConfig(
            count=count, seed=7, end=datetime.combine(today - timedelta(days=1), time(12, 0),
                                                      tzinfo=UTC),
            span=timedelta(hours=1), keys=3, late_fraction=0, duplicate_fraction=0,
            malformed_fraction=0)).records)
        if datetime.now(UTC).date() == today:
            break
    catch_up(spark, settings)

    result = run_replay(spark, settings, today)
    assert result.records_read >= count  # the day's records were read...
    assert (result.windows, result.events, result.quarantined) == (0, 0, 0)  # ...none of its
    yesterday = run_replay(spark, settings, today - timedelta(days=1))
    assert yesterday.events == count and yesterday.windows > 0
