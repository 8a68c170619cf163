"""A schema registry outage under an Avro pipeline: a registry of the drill's own (Apicurio,
`infra/registry/registry.py`'s `Registry` on a free port, its own state folder), an Avro orders
spec of its own topic whose writer schemas come from it (`avro: {wire_format: confluent,
registry: {url}}`), version 1 of the order schema registered, the service (`make stream` with
PIPELINE) consuming it, and a producer sending RATE events/s (event time = now) written with
version 1, 1% malformed (half a JSON object on the Avro topic: `invalid_avro`; half framed with
a schema id nobody registered: `unknown_schema_id`). After BEFORE_S of steady state, version 2
is registered (the service's query started with version 1 alone and no record of version 2 has
been sent: it has not seen it), the registry is stopped (SIGTERM, its `down`) for OUTAGE_S, and
the producer writes with version 2 from the stop on: the service's next batch holds an id
unknown at its query's start and must ask the registry about it while the registry is down
(the fault that matters: quarantining those records as `unknown_schema_id` would lose them).
Then the registry is started again on the same state folder and port, and the producer goes on
at its rate with version 2.

Apicurio (as `make registry-up` runs it) keeps its schemas in memory: a restart forgets them.
The drill checks whether the subject survived the restart and, when it did not, registers the
same two schemas again in the same order at once (as its operator would, from where the
schemas are kept), and checks that they got the same ids: records already written name them.
A restart attempt of the service that fetches in the moment between the registry's start and
that re-registration finds the subject empty or with version 1 alone; the log lines say so
(`other_failures`), and the checks below would catch any record it quarantined.

The service must ride out the outage by itself: still running afterwards, never restarted by
hand; its log showing the batch's failure and each restart attempt's as `transient failure
(registry)` with the backoff doubling from 1 s; its metrics showing the retrying
(`lakehouse_stream_retrying_seconds` above 0, `lakehouse_stream_restarts_total{reason=
"registry"}` counting them; the LakehouseStreamRetrying alert fires past 300 s, longer than this
outage). Measured from outside, as the broker drill does: the lag every PROBE_S, its steady level
before the outage, and how long after the registry's return (up, schemas registered) it is flat
again (at most 1.5 times the steady maximum plus one trigger's records, from then on), within
RECOVERY_S. Verified: every acknowledged offset in bronze or the quarantine exactly once,
nothing else landed, bronze's event ids each once and exactly the acknowledged valid events
(both versions'), the quarantine holding exactly the acknowledged malformed records under their
reasons, no record of a registered schema id quarantined as `unknown_schema_id`, every date
proven (the spec pipeline's `<name>__reconcile_dates`: the blocking check, gold == replay).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import time
import urllib.request
import uuid
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import fastavro
import yaml

from bench.drills.common import (
    Context,
    DrillFailed,
    DrillResult,
    LiveProducer,
    Probe,
    Record,
    check_landing,
    event_ids_check,
    free_port,
    instance,
    land_and_stop,
    landed_rows,
    prove,
    registry_module,
    say,
    service_env,
    table_or_empty,
)
from testkit import faults
from testkit.avro_events import avro_body, confluent_frame

NAME = "registry_outage"
PIPELINE_NAME = "orders_registry"
RATE = 10_000  # events/s at DRILLS_SCALE 1
BEFORE_S = 60  # steady state before the outage (its lag is the level to come back to)
OUTAGE_S = 120
RECOVERY_S = 120  # the lag must be flat again within this long of the registry's return
AFTER_S = 180  # the producer goes on this long after the registry's return
STALL_S = 300  # seconds without a new landed row that fail the wait for the acknowledged ones
METRICS_S = 5.0  # the service's metrics scraped this often during and after the outage
TRIGGER = "10 seconds"  # the service's default STREAM_TRIGGER_INTERVAL
UNREGISTERED_ID = 999_999  # a schema id nobody registers: its records are unknown_schema_id
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VERSIONS = {1: "orders_v1.avsc", 2: "orders_v2.avsc"}  # version 2 adds the currency
REGIONS = ("eu", "us", "apac")


class AvroProducer(LiveProducer):
    """LiveProducer's load as Avro records in the Confluent wire format (fastavro), written with
    the schema `use` last set (the switch takes effect from the next slice on)."""

    def __init__(self, settings, rate: int, version: int, sid: int):
        super().__init__(settings, rate)
        self.bad: dict[int, str] = {}  # record index -> the reason it must be quarantined under
        self.use(version, sid)

    def use(self, version: int, sid: int) -> None:
        schema = json.loads((EXAMPLES / VERSIONS[version]).read_text())
        self.writer = (version, sid, fastavro.parse_schema(schema))

    def _record(self, i: int, now: datetime) -> Record:
        version, sid, parsed = self.writer
        key = f"k{i % 50}".encode()
        order = {"order_id": f"v{version}-{i}", "created_at": int(now.timestamp() * 1000),
                 "region": REGIONS[i % len(REGIONS)], "amount": Decimal(f"{i % 997}.25"),
                 "currency": "USD"}
        if i % 100 == 99:
            if (i // 100) % 2:
                self.bad[i] = "invalid_avro"
                return Record(key, b'{"order_id": broken')
            self.bad[i] = "unknown_schema_id"
            return Record(key, confluent_frame(UNREGISTERED_ID, avro_body(parsed, order)))
        self.valid_ids[i] = order["order_id"]
        return Record(key, confluent_frame(sid, avro_body(parsed, order)))


def subjects(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/subjects", timeout=10) as response:
        return json.loads(response.read())


def register(url: str, subject: str, version: int) -> int:
    from testkit.avro_events import register_schema

    return register_schema(url, subject, (EXAMPLES / VERSIONS[version]).read_text())


def scrape(port: int) -> tuple[float, float] | None:
    """The service's `lakehouse_stream_retrying_seconds` and its registry restarts so far
    (None: the metrics did not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    retrying = re.search(r"^lakehouse_stream_retrying_seconds\{[^}]*\} (\S+)$", text, re.M)
    restarts = re.search(r'^lakehouse_stream_restarts_total\{[^}]*reason="registry"[^}]*\} (\S+)$',
                         text, re.M)
    return (float(retrying.group(1)) if retrying else 0.0,
            float(restarts.group(1)) if restarts else 0.0)


def schema_ids_seen(log: str) -> list[list[int]]:
    """The ids of each `writer schemas from ...: ids [...]` line (each start of the query)."""
    return [[int(x) for x in m.split(",") if x.strip()]
            for m in re.findall(r"writer schemas from \S+ subject \S+: ids \[([\d, ]*)\]", log)]


def spec_file(folder: Path, url: str) -> Path:
    """examples/orders_avro.yaml with a topic of its own and its schemas from `url`, read by
    region only (version 1, the first registered and the reader until version 2, has no
    currency)."""
    data = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    data.update(name=PIPELINE_NAME, topic=f"drill-registry-{uuid.uuid4().hex[:8]}",
                fields={k: v for k, v in data["fields"].items() if k != "currency"},
                dimensions=["region"], avro={"wire_format": "confluent", "registry": {"url": url}})
    path = folder / f"{PIPELINE_NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Metrics:
    """The service's retrying as its metrics show it, scraped while the drill waits."""

    def __init__(self, port: int):
        self.port, self.samples = port, []

    def wait(self, seconds: float, t0: float, svc) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(METRICS_S, left))
            if svc.poll() is None and (m := scrape(self.port)) is not None:
                self.samples.append((round(time.monotonic() - t0, 1), *m))

    def max_retrying(self) -> float:
        return max((r for _, r, _ in self.samples), default=0.0)

    def registry_restarts(self) -> float:
        return max((n for _, _, n in self.samples), default=0.0)


def run(ctx: Context, result: DrillResult) -> DrillResult:
    from dagster import DagsterInstance

    from assets.pipelines import spec_pipelines
    from assets.resources import LakehouseResource
    from lakehouse.kafka.admin import ensure_topic
    from orchestration.definitions import definitions_for

    folder = ctx.workdir / NAME
    folder.mkdir(parents=True, exist_ok=True)
    registry = registry_module().Registry(folder / "registry", free_port())
    say(NAME, f"own registry: {registry.up()}")
    url = registry.url
    spec = spec_file(folder, url)
    topic = yaml.safe_load(spec.read_text())["topic"]
    subject = f"{topic}-value"
    ids = {1: register(url, subject, 1)}
    rate = ctx.n(RATE, 500)
    exits: list[dict] = []
    svc = None
    try:
        with instance(ctx, "registry", PIPELINES=str(spec)):
            defs = definitions_for(spec_pipelines(), LakehouseResource())
            lakehouse = defs.resources["lakehouse"]
            job = next(p for p in spec_pipelines() if p.name == PIPELINE_NAME).named(
                "reconcile_dates")
            settings = lakehouse.settings_for(PIPELINE_NAME)
            ensure_topic(settings)
            env = service_env(STREAM_TRIGGER_INTERVAL=TRIGGER, MAX_OFFSETS_PER_TRIGGER="2000000",
                              SPARK_CONF_SPARK_DRIVER_MEMORY="4g", PIPELINE=str(spec))
            metrics = Metrics(int(env["METRICS_PORT"]))
            svc = faults.start_service(env, folder / "service-0.log")
            result.runs += 1
            producer = AvroProducer(settings, rate, 1, ids[1])
            producer.producer.send(-1, Record(b"k0", b'{"order_id": broken'))  # a first batch
            producer.producer.flush()
            faults.wait_for(lambda: landed_rows(settings) > 0, svc, timeout=600,
                            what="the service's first batch")
            settings = lakehouse.settings_for(PIPELINE_NAME)  # its generation's folder
            producer.begin()
            probe = Probe(settings)
            probe.thread.start()
            say(NAME, f"service consuming {topic} (schemas from {url}, subject {subject}: "
                      f"version 1 id {ids[1]}); producing {rate}/s; {BEFORE_S} s to a steady "
                      "state")
            time.sleep(BEFORE_S)
            steady = probe.between(probe.now() - 30, probe.now())
            ids[2] = register(url, subject, 2)
            seen_before = schema_ids_seen(faults.output(svc, 2_000_000))
            if not seen_before or ids[2] in seen_before[-1]:
                raise DrillFailed(f"the service's query should have started with version 1 "
                                  f"alone; its schema fetches: {seen_before}")
            sent_before = producer.sent
            say(NAME, registry.down() + f"; version 2 (id {ids[2]}) registered just before, "
                      f"unseen by the service (its query's ids {seen_before[-1]})")
            producer.use(2, ids[2])
            down_at = probe.now()
            result.faults_injected += 1
            say(NAME, f"producing with version 2 from now; {sent_before} records sent before; "
                      f"steady lag max {max(steady, default=0)}; registry down {OUTAGE_S} s")
            metrics.wait(OUTAGE_S, probe.t0, svc)
            say(NAME, f"registry up again: {registry.up()}")
            kept = subject in subjects(url)
            again = {v: register(url, subject, v) for v in (1, 2)}
            up_at = probe.now()
            if again != ids:
                raise DrillFailed(f"the schemas registered again got ids {again}, not {ids}: "
                                  "records already written name the old ids")
            say(NAME, f"subject {'kept' if kept else 'forgotten (in-memory storage)'} across "
                      f"the restart; versions 1 and 2 {'confirmed' if kept else 'registered again'}"
                      f" with the same ids {again}; the service went on retrying "
                      f"{metrics.max_retrying():.0f} s by its metrics, "
                      f"{metrics.registry_restarts():.0f} registry restart(s) scheduled")
            sent_while_down = producer.sent - sent_before
            level = int(1.5 * max(steady, default=0) + rate * 10)
            metrics.wait(AFTER_S, probe.t0, svc)
            acked, log, stopped = land_and_stop(settings, env, folder, svc, producer, probe,
                                                result, exits, NAME, STALL_S)
            flat, after = probe.flat_after(up_at, level)
            say(NAME, f"producer done: {len(acked)} acknowledged ({sent_while_down} sent while "
                      f"the registry was down); lag back under {level} "
                      f"{f'{flat:.0f} s' if flat is not None else 'never'} after the registry's "
                      f"return (max after it {max((n for _, n in after), default=None)})")
            retries = re.findall(r"transient failure \(registry\): (.*?); restarting from the "
                                 r"checkpoint in (\d+) s", log)
            waits = [int(w) for _, w in retries]
            backoff = len(waits) >= 2 and waits[:2] == [1, 2] and waits == sorted(waits)
            other = [ln.strip()[:300] for ln in log.splitlines()
                     if "failure (" in ln and "failure (registry)" not in ln]
            fetched = schema_ids_seen(log)
            again_lines = [ln.strip() for ln in log.splitlines() if "ingest: running again" in ln]
            say(NAME, f"service {'rode out the outage' if not exits else 'EXITED'}; "
                      f"{len(retries)} transient registry failure(s), restarts after {waits} s; "
                      f"other failures {len(other)}; schema fetches {fetched}; "
                      f"{again_lines[-1] if again_lines else 'never running again'}; stopped "
                      f"{'cleanly' if stopped else f'with {svc.returncode}'}")
            for message, _ in retries[:2] + retries[-1:]:
                say(NAME, f"  {message[:240]}")
            for line in other[:3]:
                say(NAME, f"  other: {line}")

            expected = set(acked.values())
            landing = check_landing(settings, expected)
            extra = set(landing.positions) - expected
            want = Counter(producer.valid_ids[i] for i in acked if i in producer.valid_ids)
            id_missing, id_dups, id_extra = event_ids_check(settings, want)
            versions = Counter(event_id.split("-", 1)[0] for event_id in want)
            quarantine = table_or_empty(settings, "quarantined_events")
            rows = quarantine.to_pylist() if quarantine is not None else []
            reasons = Counter(q["reason"] for q in rows)
            want_reasons = Counter(producer.bad[i] for i in acked if i in producer.bad)
            if -1 in acked:  # the first batch's record
                want_reasons["invalid_avro"] += 1
            unknown = Counter(struct.unpack(">I", base64.b64decode(q["raw_value"])[1:5])[0]
                              for q in rows if q["reason"] == "unknown_schema_id")
            registered_quarantined = sum(n for sid, n in unknown.items() if sid in ids.values())
            say(NAME, f"acknowledged positions: {landing.describe()}; landed without an "
                      f"acknowledgement: {len(extra)}; bronze event ids vs acknowledged valid "
                      f"events ({dict(versions)} by version): {id_missing} missing, {id_dups} "
                      f"duplicated, {id_extra} extra; quarantine {dict(reasons)} (acknowledged "
                      f"malformed {dict(want_reasons)}); unknown_schema_id of a registered id: "
                      f"{registered_quarantined}")
            proof = prove(settings, DagsterInstance.ephemeral(), None, NAME, job, defs)
            result.runs += len(proof.dates)
    finally:
        if svc is not None and svc.poll() is None:
            faults.crash(svc)  # the drill failed before it stopped the service
        registry.down()
    result.records_checked = landing.checked
    result.lost = landing.lost + id_missing
    result.duplicated = landing.duplicated + id_dups
    reasons_off = sum(((reasons - want_reasons) + (want_reasons - reasons)).values())
    result.wrong = (len(extra) + id_extra + reasons_off + registered_quarantined + proof.wrong
                    + len(proof.failed_checks))
    retried = {"log_registry_failures": len(retries), "backoff_waits_s": waits,
               "backoff_doubling": backoff, "other_failures": other,
               "metric_retrying_max_s": metrics.max_retrying(),
               "metric_registry_restarts": metrics.registry_restarts()}
    result.details = {
        "rate": rate, "outage_s": OUTAGE_S, "registry": url, "schema_ids": ids,
        "registry_kept_schemas": kept, "schema_fetches": fetched,
        "acknowledged": len(acked), "valid_by_version": dict(versions),
        "quarantined": dict(reasons), "unknown_schema_id_by_id": dict(unknown),
        "registered_id_quarantined": registered_quarantined,
        "sent_while_down": sent_while_down, "service_exits": exits, "rode_through": not exits,
        **retried, "running_again": again_lines, "stopped_cleanly": stopped,
        "steady_lag_max": max(steady, default=0), "flat_level": level,
        "lag_flat_after_return_s": flat, "recovery_budget_s": RECOVERY_S,
        "down_at_s": round(down_at, 1), "up_at_s": round(up_at, 1),
        "lag_samples": probe.samples, "metric_samples": metrics.samples, "job": job,
        "dates": [str(d) for d in proof.dates], "proof_failures": proof.failed_checks + proof.notes}
    result.passed = (result.lost == 0 and result.duplicated == 0 and result.wrong == 0
                     and not exits and stopped and flat is not None and flat <= RECOVERY_S
                     and backoff and metrics.max_retrying() > 0
                     and metrics.registry_restarts() >= 2 and versions["v2"] > 0 and proof.ok
                     and bool(fetched) and ids[2] in fetched[-1])
    return result
