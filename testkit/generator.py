"""Realistic event generator (docs/design.md §3): deterministic for a seed, produced to Kafka.

    python -m testkit.generator --count 100000 --seed 7 [--rate 50000] [--end 2026-11-21T12:00Z]

Traffic over `--span` of event time ending at `--end` (default now): a hot key, arrivals out of
order within the watermark delay, a fraction of late arrivals (minutes to hours behind), re-sent
duplicates (some soon, some after their window closed) and malformed records of every kind the
parser quarantines. Records are produced in arrival order; the topic is created (LogAppendTime,
several partitions) when missing.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from lakehouse.config.settings import Settings, parse_duration

MALFORMED_KINDS = (
    "invalid_json",
    "not_an_object",
    "invalid_utf8",
    "missing_event_id",
    "missing_value",
    "invalid_event_time",
    "invalid_value",
    "value_too_precise",
    "event_time_in_future",
    "event_time_before_start",
)


@dataclass
class GeneratorConfig:
    count: int = 10_000
    seed: int = 7
    end: datetime | None = None
    span: timedelta = timedelta(days=1)
    keys: int = 50
    hot_key_share: float = 0.3
    disorder: timedelta = timedelta(seconds=20)  # < default watermark delay (30 s)
    late_fraction: float = 0.01
    duplicate_fraction: float = 0.02
    malformed_fraction: float = 0.005


@dataclass
class Record:
    key: bytes | None
    value: bytes
    kind: str  # "event", "late", "duplicate", "late_duplicate" or a malformed kind
    event: dict | None = None


@dataclass
class Generated:
    records: list[Record] = field(default_factory=list)

    def kinds(self) -> Counter:
        return Counter(r.kind for r in self.records)


def end_across_midnight(now: datetime, after: timedelta = timedelta(hours=2),
                        margin: timedelta = timedelta(minutes=10),
                        room: timedelta = timedelta(minutes=40)) -> datetime:
    """An end for generated data that spans a UTC midnight whatever the hour `now` is: up to
    `after` past the newest midnight and at least `margin` before `now`; in the first `room`
    after a midnight (too little of the new date yet), `after` past the midnight before."""
    now = now.astimezone(UTC)
    midnight = datetime.combine(now.date(), datetime.min.time(), tzinfo=UTC)
    if now - midnight < room:
        midnight -= timedelta(days=1)
    return min(now - margin, midnight + after)


def end_within_one_date(now: datetime, span: timedelta,
                        margin: timedelta = timedelta(minutes=10)) -> datetime:
    """An end for generated data of `span` that stays on one UTC date, all of it at least
    `margin` before `now`: `now - margin`, or 23:50 of the date before when `span` back from
    there would cross the newest midnight."""
    end = now.astimezone(UTC) - margin
    if end - span < datetime.combine(end.date(), datetime.min.time(), tzinfo=UTC):
        end = (end - timedelta(days=1)).replace(hour=23, minute=50)
    return end


def _iso(t: datetime, rnd: random.Random) -> str | int:
    if rnd.random() < 0.2:
        return int(t.timestamp() * 1000)  # epoch milliseconds
    if rnd.random() < 0.1:
        return t.isoformat(timespec="milliseconds")  # "+00:00" offset form
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _value(rnd: random.Random) -> float | str:
    cents = Decimal(rnd.randint(1, 500_000)) / 100
    if rnd.random() < 0.1:
        return str(cents + Decimal(rnd.randint(0, 9999)) / Decimal(1_000_000))  # 6 digits, string
    return str(cents) if rnd.random() < 0.3 else float(cents)


def _encode(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _malformed(kind: str, t: datetime, rnd: random.Random, i: int) -> bytes:
    base = {"event_id": f"bad-{i}", "key": "merchant-0001", "event_time": _iso(t, rnd), "value": 1}
    if kind == "invalid_json":
        return b'{"event_id": "bad-%d", "key": ' % i
    if kind == "not_an_object":
        return b'[{"event_id": "bad-%d"}]' % i
    if kind == "invalid_utf8":
        return b'{"event_id": "bad-\xff\xfe", "key": "k"}'
    if kind == "missing_event_id":
        base.pop("event_id")
    elif kind == "missing_value":
        base.pop("value")
    elif kind == "invalid_event_time":
        base["event_time"] = "yesterday at noon"
    elif kind == "invalid_value":
        base["value"] = "12,50 EUR"
    elif kind == "value_too_precise":
        base["value"] = "0.1234567"
    elif kind == "event_time_in_future":
        # Far beyond any skew whenever it is produced, and still deterministic.
        base["event_time"] = (t + timedelta(days=3650)).isoformat().replace("+00:00", "Z")
    elif kind == "event_time_before_start":
        base["event_time"] = int(t.timestamp())  # epoch seconds where milliseconds are due
    return _encode(base)


def generate(cfg: GeneratorConfig) -> Generated:
    """The records to produce, in arrival order. Pure: same config, same bytes."""
    rnd = random.Random(cfg.seed)
    end = cfg.end or datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - cfg.span
    keys = [f"merchant-{k:04d}" for k in range(cfg.keys)]
    out = Generated()
    sent: list[dict] = []
    step = cfg.span / max(cfg.count, 1)
    for i in range(cfg.count):
        nominal = start + step * i  # arrival order follows the nominal clock
        roll = rnd.random()
        if roll < cfg.malformed_fraction:
            kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
            out.records.append(Record(b"merchant-0001", _malformed(kind, nominal, rnd, i), kind))
            continue
        if roll < cfg.malformed_fraction + cfg.duplicate_fraction and sent:
            # Re-send an earlier event unchanged: recent (counted once by dedup) or old (its
            # window is closed: a late duplicate).
            old = rnd.random() < 0.3
            pool = sent if old else sent[-50:]
            event = rnd.choice(pool)
            kind = "late_duplicate" if old else "duplicate"
            out.records.append(Record(event["key"].encode(), _encode(event), kind, event))
            continue
        late = rnd.random() < cfg.late_fraction and nominal - start > timedelta(hours=3)
        if late:
            t = nominal - timedelta(seconds=rnd.randint(120, 3 * 3600))
        else:
            t = nominal - timedelta(milliseconds=rnd.randint(0, int(cfg.disorder.total_seconds() * 1000)))
        key = keys[0] if rnd.random() < cfg.hot_key_share else rnd.choice(keys)
        event = {"event_id": f"evt-{cfg.seed}-{i}", "key": key, "event_time": _iso(t, rnd),
                 "value": _value(rnd)}
        if rnd.random() < 0.2:
            event["attributes"] = {"country": rnd.choice(["DE", "FR", "US", "JP"]), "n": i % 7}
        sent.append(event)
        out.records.append(Record(key.encode(), _encode(event), "late" if late else "event", event))
    return out


def produce(settings: Settings, records: list[Record], rate: float | None = None,
            topic: str | None = None) -> int:
    """Produce records in order (idempotent producer, acks=all); returns the number delivered."""
    from confluent_kafka import Producer

    from lakehouse.kafka.admin import ensure_topic

    topic = topic or settings.events_topic
    ensure_topic(settings, topic)
    errors: list[str] = []
    producer = Producer({
        **settings.client_config,
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        "log_level": 3,
    })

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    t0 = time.monotonic()
    for n, r in enumerate(records, 1):
        while True:
            try:
                producer.produce(topic, key=r.key, value=r.value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if rate and n % 1000 == 0:
            ahead = n / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        producer.poll(0)
    producer.flush(60)
    if errors:
        raise RuntimeError(f"{len(errors)} records were not delivered, first: {errors[0]}")
    return len(records)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Produce realistic events to the events topic.")
    p.add_argument("--count", type=int, default=GeneratorConfig.count)
    p.add_argument("--seed", type=int, default=GeneratorConfig.seed)
    p.add_argument("--rate", type=float, default=None, help="records per second (default: max)")
    p.add_argument("--end", default=None, help="event-time end, ISO-8601 (default: now)")
    p.add_argument("--span", default="1 day", help="event-time span, e.g. '1 day', '2 hours'")
    p.add_argument("--keys", type=int, default=GeneratorConfig.keys)
    p.add_argument("--late-fraction", type=float, default=GeneratorConfig.late_fraction)
    p.add_argument("--duplicate-fraction", type=float, default=GeneratorConfig.duplicate_fraction)
    p.add_argument("--malformed-fraction", type=float, default=GeneratorConfig.malformed_fraction)
    args = p.parse_args(argv)
    settings = Settings.from_env()
    cfg = GeneratorConfig(
        count=args.count, seed=args.seed,
        end=datetime.fromisoformat(args.end.replace("Z", "+00:00")) if args.end else None,
        span=parse_duration(args.span, "--span"), keys=args.keys,
        late_fraction=args.late_fraction, duplicate_fraction=args.duplicate_fraction,
        malformed_fraction=args.malformed_fraction,
    )
    generated = generate(cfg)
    t0 = time.monotonic()
    n = produce(settings, generated.records, rate=args.rate)
    took = time.monotonic() - t0
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(generated.kinds().items()))
    print(f"produced {n} records to {settings.events_topic} in {took:.1f}s ({kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
