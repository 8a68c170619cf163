"""Dagster jobs of `defs` run in-process, as the tests, the drills and the demo run them."""

from __future__ import annotations

# Dagster's console logger at WARNING: the caller prints what it does; the event log keeps all.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def check_evaluations(result) -> list:
    """The asset check evaluations of a finished run, in the order they happened."""
    return [e.asset_check_evaluation_data for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def run_job(name: str, instance, quiet: bool = False, **kw):
    """Run job `name` of `defs` in-process (`kw`: partition_key, run_id, run_config...); never
    raises for a failed step. Returns (result, check evaluations)."""
    from orchestration.definitions import defs

    if quiet:
        kw.setdefault("run_config", QUIET)
    return run_in(defs, name, instance, **kw)


def run_in(defs, name: str, instance, **kw):
    """`run_job` in the code location `defs` (a test's own, built for its environment)."""
    result = defs.resolve_job_def(name).execute_in_process(instance=instance,
                                                           raise_on_error=False, **kw)
    return result, check_evaluations(result)


def step_failures(result) -> str:
    """The failed steps' error messages, one line."""
    return "; ".join(str(e.event_specific_data.error.message if e.event_specific_data.error
                         else e.event_specific_data)[:400]
                     for e in result.all_events if e.event_type_value == "STEP_FAILURE")


def stop_local_spark() -> None:
    """Stop this process's SparkSession, if any: on the cluster stack it holds the standalone
    cluster's cores, so another application (the service, the daemon's runs) would wait for
    resources until it ends."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if session is not None:
        session.stop()
