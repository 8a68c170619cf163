"""The service and its writer lock, without Spark: it says when it took and released the lock,
and once the lock is lost (its PostgreSQL session gone, e.g. while the process was paused) it
stops the query and commits nothing more: no bookkeeping row either (exit 3)."""

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from lakehouse.config.settings import Settings
from lakehouse.tables.locks import WriterLockLost
from orchestration.service import runner as service


class FakeFence:
    def __init__(self):
        self.lost = False

    def check(self):
        if self.lost:
            raise WriterLockLost("the stream checkpoint 'ingest': the writer lock is no longer "
                                 "held; not committing")


class FakeQuery:
    name = "ingest"

    def __init__(self):
        self.batch = 0
        self.stopped = False

    @property
    def recentProgress(self):
        return [SimpleNamespace(json=f'{{"batchId": {b}, "id": "q", "numInputRows": 1, '
                                     f'"durationMs": {{"addBatch": 1, "triggerExecution": 1}}}}')
                for b in range(self.batch + 1)]

    def exception(self):
        return None

    @property
    def isActive(self):
        return not self.stopped

    def stop(self):
        self.stopped = True


@pytest.fixture()
def fake_service(monkeypatch):
    fence, query, recorded = FakeFence(), FakeQuery(), []

    @contextmanager
    def lock(settings, name):
        yield fence

    @contextmanager
    def serving(settings, spark, **kw):
        yield None

    @contextmanager
    def exposing(metrics, port):
        yield False

    monkeypatch.setattr(service, "ensure_topic", lambda settings: None)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda *a: None))
    spark.newSession = lambda: spark
    monkeypatch.setattr(service, "get_spark", lambda settings, **kw: spark)
    monkeypatch.setattr(service, "checkpoint_lock", lock)
    monkeypatch.setattr(service, "serving", serving)
    monkeypatch.setattr(service, "exposing", exposing)
    monkeypatch.setattr(service, "start_ingest", lambda *a, **k: query)
    monkeypatch.setattr(service, "record_progress",
                        lambda writer, q, reports, ends: recorded.append(
                            [r["batchId"] for r in reports]))
    monkeypatch.setattr(service, "_topic_ends", lambda settings: None)
    monkeypatch.setattr(service, "PROGRESS_EVERY_S", 0.0)  # record at every poll
    settings = Settings.from_env({"LAKEHOUSE_ROOT": "s3a://bucket/lake",
                                  "STREAM_TRIGGER_INTERVAL": "50 ms"})
    return settings, fence, query, recorded


@contextmanager
def running_service(settings):
    """`service.serve` in a thread for the block, stopped (SIGTERM's event) at its end; yields
    the list its exit status is appended to."""
    stop, done = threading.Event(), []
    t = threading.Thread(target=lambda: done.append(service.serve([settings], stop)))
    t.start()
    try:
        yield done
    finally:
        stop.set()
        t.join(10)


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = service.time.monotonic() + timeout
    while not predicate():
        assert service.time.monotonic() < deadline, f"timed out waiting for {what}"
        service.time.sleep(0.02)


def test_a_service_that_loses_its_lock_stops_and_commits_nothing_more(fake_service, capsys):
    settings, fence, query, recorded = fake_service
    with running_service(settings) as done:
        wait_for(lambda: recorded, "a bookkeeping commit while the lock was held")
        fence.lost = True  # the session is gone (the server dropped it while we were paused)
        before = len(recorded)
        query.batch += 1  # a new batch's progress: due for a bookkeeping commit
        wait_for(lambda: done, "the service to stop on its own")
    assert len(recorded) == before, "a progress row was committed after the lock was lost"
    assert done == [3]  # service.LOCK_LOST
    assert query.stopped
    out = capsys.readouterr().out
    assert "writer lock: took" in out and "writer lock: LOST" in out
    assert "writer lock: releasing" not in out


def test_a_service_says_when_it_held_the_lock(fake_service, capsys):
    settings, fence, query, recorded = fake_service
    with running_service(settings) as done:
        wait_for(lambda: recorded, "a bookkeeping commit")  # running, the lock held
    assert done == [0]
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("writer lock:")]
    assert [line.split()[2] for line in lines] == ["took", "releasing"], lines
    took, released = (int(line.split(" at ")[1].split()[0]) for line in lines)
    assert took <= released


def test_one_pipeline_losing_its_lock_stops_alone(fake_service, monkeypatch, capsys):
    """Two pipelines in one service: the one whose lock is lost stops (its query, no more
    commits), the other goes on recording until SIGTERM; the exit status says a lock was lost."""
    settings, _, _, recorded = fake_service
    fences = {"default": FakeFence(), "orders": FakeFence()}
    queries = {"default": FakeQuery(), "orders": FakeQuery()}
    per_pipeline = []

    @contextmanager
    def lock(settings, name):
        yield fences[settings.pipeline]

    monkeypatch.setattr(service, "checkpoint_lock", lock)
    monkeypatch.setattr(service, "start_ingest",
                        lambda spark, settings, *a, **k: queries[settings.pipeline])
    monkeypatch.setattr(service, "record_progress",
                        lambda writer, q, reports, ends: per_pipeline.append(
                            writer.settings.pipeline))
    orders = settings.model_copy(update={"pipeline": "orders"})
    stop, done = threading.Event(), []
    t = threading.Thread(target=lambda: done.append(service.serve([settings, orders], stop)))
    t.start()
    try:
        wait_for(lambda: {"default", "orders"} <= set(per_pipeline), "both pipelines recording")
        fences["orders"].lost = True
        queries["orders"].batch += 1
        wait_for(lambda: queries["orders"].stopped, "the orders query to stop")
        n_orders = per_pipeline.count("orders")
        n_default = per_pipeline.count("default")
        queries["default"].batch += 1
        wait_for(lambda: per_pipeline.count("default") > n_default, "default still recording")
        assert not queries["default"].stopped and not done
    finally:
        stop.set()
        t.join(10)
    assert per_pipeline.count("orders") == n_orders  # nothing committed after the loss
    assert queries["default"].stopped and done == [3]  # service.LOCK_LOST
    out = capsys.readouterr().out
    assert "pipeline 'orders' stopped; still streaming: default" in out


def test_a_lost_lock_shows_in_the_metrics_before_the_service_exits(fake_service, monkeypatch):
    """The metrics say the lock is held, then lost, and the endpoint stays up
    LOCK_LOST_LINGER_S after the loss (so that Prometheus scrapes it) before the service exits."""
    settings, fence, query, recorded = fake_service
    events = []

    class Metrics:
        registry = None

        def observe_progress(self, query, reports):
            return 0

        def lock_held(self, held):
            events.append(("held", held, service.time.monotonic()))

        def query_failed(self, query):
            events.append(("failed", query))

        def restart_scheduled(self, reason, restarting):
            events.append(("restart", reason))

        def retrying(self, seconds):
            pass

        def position(self):
            return {}

    @contextmanager
    def serving(settings, spark, **kw):
        yield Metrics()
        events.append(("stopped", None, service.time.monotonic()))

    monkeypatch.setattr(service, "serving", serving)
    monkeypatch.setattr(service, "LOCK_LOST_LINGER_S", 0.5)
    with running_service(settings) as done:
        wait_for(lambda: recorded, "a bookkeeping commit while the lock was held")
        fence.lost = True
        query.batch += 1
        wait_for(lambda: done, "the service to stop on its own")
        exited = service.time.monotonic()
    assert done == [3]
    assert [e[:2] for e in events] == [("held", True), ("held", False), ("stopped", None)]
    assert exited - events[1][2] >= 0.5  # the endpoint lingered
