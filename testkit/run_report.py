"""A finished run's errors and event log as text: what an operator (or a test checking that a
secret never reaches the UI) reads, serialized the way Dagster stores it."""

from __future__ import annotations


def failure_text(result) -> str:
    """The failed steps' errors of an `ExecuteInProcessResult`, with their whole cause chains
    (class, message and stack)."""
    out = []
    for event in result.all_events:
        if event.event_type_value != "STEP_FAILURE":
            continue
        error = event.event_specific_data.error
        while error is not None:
            out.append(f"{error.cls_name}: {error.message}\n{''.join(error.stack)}")
            error = error.cause
    return "\n".join(out)


def event_log_text(instance, run_id: str) -> str:
    """Every event log record of the run and its run record, serialized (what the UI shows)."""
    from dagster import serialize_value

    parts = [serialize_value(record) for record in instance.all_logs(run_id)]
    run = instance.get_run_by_id(run_id)
    if run is not None:
        parts.append(serialize_value(run))
    return "\n".join(parts)
