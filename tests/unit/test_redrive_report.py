"""The redrive's commit tag and its per-reason report, without Spark."""

from datetime import date

from lakehouse.tables.commit_tags import batch_of, redrive_of, redrive_tag
from spark_jobs.redrive import RedriveResult


def test_the_redrive_tag_names_the_date_and_the_run_and_is_no_ingest_tag():
    tag = redrive_tag(date(2026, 11, 27), "run-1:a")
    assert tag == "lakehouse-redrive:2026-11-27:run-1:a"
    assert redrive_of(tag) == ("2026-11-27", "run-1:a")
    assert redrive_of("lakehouse-ingest-batch:q:3") is None
    assert batch_of(tag) is None  # the stream never takes a redrive commit for its own


def test_per_reason_counts_what_was_redriven_and_what_still_fails_as_what():
    r = RedriveResult(date(2026, 11, 27), None, "run")
    r.considered = {"unknown_schema_id": 10, "invalid_avro": 2}
    r.redriven = {"unknown_schema_id": 7}
    r.still_failing = {"unknown_schema_id": {"missing_region": 2, "unknown_schema_id": 1},
                       "invalid_avro": {"invalid_avro": 2}}
    assert r.total_redriven == 7 and r.total_still_failing == 5
    assert r.per_reason() == [
        {"reason": "invalid_avro", "considered": 2, "redriven": 0, "still_failing": 2,
         "now_failing_as": "invalid_avro: 2"},
        {"reason": "unknown_schema_id", "considered": 10, "redriven": 7, "still_failing": 3,
         "now_failing_as": "missing_region: 2, unknown_schema_id: 1"},
    ]
    meta = r.as_metadata()
    assert meta["reasons"] == "all" and meta["redriven"] == 7 and meta["still_failing"] == 5
