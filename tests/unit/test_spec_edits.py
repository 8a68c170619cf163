"""Spec edits, by kind (`lakehouse.tables.generations`): what each takes, and whether gold
predates an in-place edit (applied and rebuilt on Spark and a broker:
tests/e2e/test_generations.py)."""

import uuid
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse.config.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())


def spec_settings(folder: Path, base: Settings, **changes):
    """The order example with `changes`, on `base`'s root and topic: (spec, settings)."""
    from lakehouse.specs.pipeline import load_spec

    path = folder / f"orders-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump({**BASE, "topic": base.events_topic, **changes}))
    spec = load_spec(path)
    return spec, spec.settings(base, {})


def kind(tmp_path, env=None, before=None, **changes) -> tuple[str, tuple[str, ...]]:
    """What going from the order example to it with `changes` takes; `before` / `env`: the
    settings' variables before and after."""
    from lakehouse.tables.generations import change_between

    root = {"LAKEHOUSE_ROOT": str(tmp_path)}
    _, before = spec_settings(tmp_path, Settings.from_env({**root, **(before or {})}))
    _, after = spec_settings(tmp_path, Settings.from_env({**root, **(env or {})}), **changes)
    change = change_between(before.results_inputs, after.results_inputs)
    return change.kind, change.why


def test_what_each_spec_edit_takes(tmp_path):
    assert kind(tmp_path, topic="elsewhere")[0] == "none"
    # In place: bronze holds every column the new spec reads; the tables only gain columns.
    fields = {**BASE["fields"], "amount": "decimal(18,2)"}
    assert kind(tmp_path, measures=[{"field": "amount", "aggregates": ["sum", "min", "max"]},
                                    {"field": "amount", "name": "spend",
                                     "aggregates": ["sum"]}]) == (
        "in_place", ("new columns spend_sum",))
    assert kind(tmp_path, window={**BASE["window"], "watermark_delay": "1 minute"})[0] == "in_place"
    assert kind(tmp_path, window={**BASE["window"], "correction_horizon": "3 days"})[0] == "in_place"
    # A wider size or skew limit: in place, naming the quarantine reason a redrive can meet now.
    for wider, reason in ((("MAX_EVENT_BYTES", "65536", "131072"), "payload_too_large"),
                          (("FUTURE_SKEW", "5 minutes", "1 day"), "event_time_in_future")):
        got, why = kind(tmp_path, env=dict([wider[::2]]), before=dict([wider[:2]]))
        assert got == "in_place" and len(why) == 1 and reason in why[0], why
        got, why = kind(tmp_path, env=dict([wider[:2]]), before=dict([wider[::2]]))
        assert got == "rebuild" and why, why  # narrower: the tables hold what it refuses
    # Rebuilds: what bronze never kept, another window key, another reading of a field.
    rebuild = {
        "window": {**BASE["window"], "size": "5 minutes"},
        "dimensions": ["region"],
        "fields": {**fields, "amount": "decimal(12,2)"},
        "event_id": "region",
        "measures": [{"field": "amount", "aggregates": ["sum"]}],
    }
    for key, value in rebuild.items():
        got, why = kind(tmp_path, **{key: value})
        assert got == "rebuild" and why, (key, why)
    got, why = kind(tmp_path, fields={**fields, "quantity": "decimal(10,0)"},
                    measures=[*BASE["measures"], {"field": "quantity", "aggregates": ["sum"]}])
    assert got == "rebuild" and any("bronze never kept quantity" in w for w in why), why


def test_gold_predates_only_an_in_place_edit_of_the_spec_it_is_read_under(tmp_path):
    from lakehouse.tables.generations import ACTIVE, BUILDING, RETIRED, in_place_since

    base = Settings.from_env({"LAKEHOUSE_ROOT": str(tmp_path)})
    _, v1 = spec_settings(tmp_path, base)
    _, v2 = spec_settings(tmp_path, base, window={**BASE["window"], "watermark_delay": "1 minute"})
    t = [datetime(2026, 11, 27, h, tzinfo=UTC) for h in range(4)]

    def row(settings, status, at, note=None):
        return {"spec_version": settings.results_version, "status": status, "recorded_at": at,
                "note": note}

    recorded = [row(v1, ACTIVE, t[0], "assumed: the tables predate spec versions")]
    assert in_place_since(v1, recorded) is None  # recorded, not edited
    edited = [*recorded, row(v2, ACTIVE, t[1], "in place from v1: new delay")]
    assert in_place_since(v2, edited) == t[1]
    assert in_place_since(v1, edited) is None
    # Rebuilt apart and switched in: its rows were computed under it.
    switched = [*recorded, row(v2, BUILDING, t[1]), row(v1, RETIRED, t[2]), row(v2, ACTIVE, t[3])]
    assert in_place_since(v2, switched) is None
