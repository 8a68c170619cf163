"""Five-field cron expressions (minute hour day-of-month month day-of-week, in UTC), as the
settings' schedules and deadlines use them: parsed once (`parse`, an error naming the field) and
stepped to the next tick after a time (`next_after`).

Each field takes `*`, a number, a range `a-b`, a step `*/n` or `a-b/n`, and lists of these;
months and weekdays also by their English three-letter names, Sunday as 0 or 7. As in Vixie
cron, when both the day of the month and the day of the week are restricted, a day matching
either is a tick's day."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))
_NAMES = {
    "month": {n: i for i, n in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)},
    "day of week": {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
}


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # the day of the month is `*`
    any_weekday: bool  # the day of the week is `*`

    def day_matches(self, t: datetime) -> bool:
        if t.month not in self.months:
            return False
        dom, dow = t.day in self.days, (t.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow


def _value(text: str, name: str, lo: int, hi: int) -> int:
    v = _NAMES.get(name, {}).get(text.lower())
    if v is None:
        if not text.isdigit():
            raise ValueError(f"{name} {text!r} is not a number")
        v = int(text)
    if not lo <= v <= hi:
        raise ValueError(f"{name} {v} is outside {lo}-{hi}")
    return v


def _field(text: str, name: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = _value(step_text, f"{name} step", 1, hi - lo + 1) if step_text else 1
        if span == "*":
            first, last = lo, hi
        elif "-" in span:
            a, b = span.split("-", 1)
            first, last = _value(a, name, lo, hi), _value(b, name, lo, hi)
            if first > last:
                raise ValueError(f"{name} range {span!r} runs backwards")
        else:
            first = _value(span, name, lo, hi)
            last = hi if step_text else first
        out.update(range(first, last + 1, step))
    return frozenset(out)


def parse(expr: str) -> Cron:
    """The expression's ticks; a ValueError naming the bad field otherwise."""
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError("must be a 5-field cron expression (UTC)")
    sets = [_field(p, name, lo, hi) for p, (name, lo, hi) in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    return Cron(*sets[:4], weekdays, any_day=parts[2] == "*", any_weekday=parts[4] == "*")


def next_after(expr: str, t: datetime) -> datetime:
    """The first tick of `expr` strictly after `t` (UTC)."""
    cron = parse(expr)
    t = t.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 8):  # a leap day's tick is at most 8 years ahead
        if cron.day_matches(t):
            for h in sorted(x for x in cron.hours if x >= t.hour):
                start = t.minute if h == t.hour else 0
                m = next((x for x in sorted(cron.minutes) if x >= start), None)
                if m is not None:
                    return t.replace(hour=h, minute=m)
        t = (t + timedelta(days=1)).replace(hour=0, minute=0)
    raise ValueError(f"{expr!r} has no tick within 8 years")
