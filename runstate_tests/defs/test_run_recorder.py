"""The deployment records its own Dagster runs in the run state store, through the run_recorder sensor."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.events import StepSuccessData

from runstate.commands.ticking import tick_sensor
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.sensors import run_recorder

_attempts = {"flaky": 0}


@dg.op(retry_policy=dg.RetryPolicy(max_retries=1))
def flaky() -> int:
    _attempts["flaky"] += 1
    if _attempts["flaky"] == 1:
        raise RuntimeError("first attempt fails")
    return 1


@dg.op
def boom(value: int) -> None:
    raise ValueError(f"boom {value}")


@dg.job
def succeeds():
    flaky()


@dg.job
def fails():
    boom(flaky())


@pytest.fixture
def recorder_defs(pg_database: str, pg_schema: str) -> dg.Definitions:
    resource = EventStoreResource(backend="postgres", pg_url=pg_database, pg_schema=pg_schema)
    return dg.Definitions(jobs=[succeeds, fails], sensors=[run_recorder], resources={"event_store": resource})


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def _store(defs: dg.Definitions):
    return defs.resources["event_store"].get_store()


def test_successful_run_with_a_retried_step_is_recorded(recorder_defs, instance):
    _attempts["flaky"] = 0
    run = recorder_defs.resolve_job_def("succeeds").execute_in_process(instance=instance)

    tick_sensor("run_recorder", defs=recorder_defs, instance=instance)

    events = _store(recorder_defs).fetch(run.run_id)
    kinds = [(e.event_type, e.step_id, e.data.get("attempt") if e.data else None) for e in events]
    assert kinds == [
        ("RunStarted", None, None),
        ("StepStarted", "flaky", 1),
        ("StepRetrying", "flaky", 1),
        ("StepStarted", "flaky", 2),
        ("StepCompleted", "flaky", 2),
        ("RunCompleted", None, None),
    ]
    snapshot = _store(recorder_defs).project(run.run_id)
    assert snapshot.status == "COMPLETED"
    assert snapshot.steps["flaky"].attempts == 2


def test_failed_run_is_recorded_with_the_error(recorder_defs, instance):
    _attempts["flaky"] = 1
    run = recorder_defs.resolve_job_def("fails").execute_in_process(instance=instance, raise_on_error=False)

    tick_sensor("run_recorder", defs=recorder_defs, instance=instance)

    snapshot = _store(recorder_defs).project(run.run_id)
    assert snapshot.status == "FAILED"
    assert snapshot.steps["boom"].status == "FAILED"
    assert "boom 1" in (snapshot.steps["boom"].error or "")


def test_redelivered_ticks_append_nothing_twice(recorder_defs, instance):
    _attempts["flaky"] = 1
    run = recorder_defs.resolve_job_def("succeeds").execute_in_process(instance=instance)
    tick_sensor("run_recorder", defs=recorder_defs, instance=instance)
    first = _store(recorder_defs).fetch(run.run_id)

    instance.run_storage.set_cursor_values({"runstate.tick_cursor.run_recorder": "{}"})  # cursor lost
    tick_sensor("run_recorder", defs=recorder_defs, instance=instance)

    assert _store(recorder_defs).fetch(run.run_id) == first


def test_a_run_failed_by_liveness_and_then_ended_by_its_paused_worker_is_recorded_as_failed_only(
    recorder_defs, instance
):
    """Issue 42.1: a run declared dead whose process resumed wrote StepStarted, StepCompleted and
    RunCompleted after the RunFailed; the run ends once, at its first terminal event."""
    job = recorder_defs.resolve_job_def("succeeds")
    run = instance.create_run_for_job(job)

    def report(event_type: dg.DagsterEventType, step_key: str | None = None, data=None) -> None:
        event = dg.DagsterEvent(
            event_type.value, job_name=job.name, step_key=step_key, event_specific_data=data
        )
        instance.report_dagster_event(event, run_id=run.run_id)

    report(dg.DagsterEventType.RUN_START)
    instance.report_run_failed(instance.get_run_by_id(run.run_id), "runstate: the run's process is gone")
    report(dg.DagsterEventType.STEP_START, "flaky")  # what the resumed worker wrote next
    report(dg.DagsterEventType.STEP_SUCCESS, "flaky", StepSuccessData(duration_ms=1.0))
    report(dg.DagsterEventType.RUN_SUCCESS)

    tick_sensor("run_recorder", defs=recorder_defs, instance=instance)

    store = _store(recorder_defs)
    assert [e.event_type for e in store.fetch(run.run_id)] == ["RunStarted", "RunFailed"]
    assert store.project(run.run_id).status == "FAILED"
