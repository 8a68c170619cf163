"""The settings' cron expressions (`lakehouse.config.cron`): the next tick agrees with the
iterator Dagster's own schedules use, and a bad expression is an error naming its field."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from dagster._utils.schedules import cron_string_iterator  # the reference, in a test only

from lakehouse.config.cron import next_after, parse

EXPRESSIONS = ["0 3 * * *", "*/5 * * * *", "15 * * * *", "30 2 * * *", "0 4 * * 1-5",
               "0 0 1 * *", "0 12 * * sun", "10,40 8-18/2 * * *", "0 0 29 2 *",
               "0 6 13 * 5", "5 4 * jan,jul mon", "59 23 31 12 *", "0 0 * * 7"]


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_the_next_tick_is_dagsters(expr):
    rnd = random.Random(expr)
    for _ in range(40):
        t = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=rnd.randrange(4 * 365 * 1440),
                                                         seconds=rnd.randrange(60))
        want = next(cron_string_iterator(t.timestamp(), expr, "UTC"))
        got = next_after(expr, t)
        assert got == want.astimezone(UTC), (expr, t)


@pytest.mark.parametrize(("expr", "message"), [
    ("0 3 * *", "5-field"), ("61 * * * *", "minute 61"), ("0 24 * * *", "hour 24"),
    ("0 0 0 * *", "day of month 0"), ("0 0 * 13 *", "month 13"), ("x * * * *", "minute 'x'"),
    ("0 5-2 * * *", "runs backwards"), ("*/0 * * * *", "minute step 0")])
def test_a_bad_expression_names_its_field(expr, message):
    with pytest.raises(ValueError, match=message):
        parse(expr)
