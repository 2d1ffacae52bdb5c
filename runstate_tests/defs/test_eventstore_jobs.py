"""The eventstore jobs through real Postgres (and fakesnow for the Snowflake backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from runstate.defs.eventstore.jobs import append_events, archive_events
from runstate.defs.eventstore.resources import EventStoreResource, SnowflakeConnection
from runstate.defs.eventstore.schedules import archive_events_schedule
from runstate.eventstore import NewEvent

NOW = datetime.now(UTC)


def append_config(run_id: str, events: list[dict]) -> dict:
    return {"ops": {"append_events_op": {"config": {"run_id": run_id, "events": events}}}}


RUN_EVENTS = [
    {"event_type": "RunStarted", "emitted_at": NOW.isoformat()},
    {"event_type": "StepStarted", "step_id": "extract", "data": {"attempt": 1}},
    {"event_type": "StepCompleted", "step_id": "extract", "data": {"rows": 42, "tags": ["a", "b"]}},
]


def materializations(result: dg.ExecuteInProcessResult) -> list[dg.AssetMaterialization]:
    return [event.event_specific_data.materialization for event in result.get_asset_materialization_events()]


def test_append_events_job_writes_the_batch_and_reports_seqs(resource, store):
    result = append_events.execute_in_process(
        run_config=append_config("run-a", RUN_EVENTS), resources={"event_store": resource}
    )

    assert result.success
    assert result.output_for_node("append_events_op") == [1, 2, 3]
    [materialization] = materializations(result)
    assert materialization.asset_key == dg.AssetKey("run_events")
    assert materialization.metadata["written"].value == 3
    assert materialization.metadata["last_seq"].value == 3
    stored = store.fetch("run-a")
    assert [e.event_type for e in stored] == ["RunStarted", "StepStarted", "StepCompleted"]
    assert stored[2].data == {"rows": 42, "tags": ["a", "b"]}


def test_append_events_job_rerun_is_idempotent(resource, store):
    config = append_config("run-b", RUN_EVENTS)
    append_events.execute_in_process(run_config=config, resources={"event_store": resource})

    again = append_events.execute_in_process(run_config=config, resources={"event_store": resource})

    assert again.output_for_node("append_events_op") == [1, 2, 3]
    [materialization] = materializations(again)
    assert materialization.metadata["written"].value == 0
    assert materialization.metadata["duplicates"].value == 3
    assert len(store.fetch("run-b")) == 3


@pytest.mark.parametrize(
    ("bad_event", "field"),
    [
        ({"event_type": ""}, "event_type"),
        ({"event_type": "StepStarted", "emitted_at": "2026-01-01T00:00:00"}, "emitted_at"),
        ({"event_type": "StepStarted", "emitted_at": "yesterday"}, "emitted_at"),
        ({"event_type": "StepStarted", "event_id": "not-a-uuid"}, "event_id"),
    ],
)
def test_append_events_job_rejects_a_bad_event_and_writes_nothing(resource, store, bad_event, field):
    events = [RUN_EVENTS[0], bad_event]

    result = append_events.execute_in_process(
        run_config=append_config("run-bad", events), resources={"event_store": resource}, raise_on_error=False
    )

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.user_failure_data.description
    assert field in message and "nothing written" in message
    assert store.fetch("run-bad") == []


def test_append_events_job_rejects_an_overlong_run_id(resource, store):
    result = append_events.execute_in_process(
        run_config=append_config("r" * 257, RUN_EVENTS[:1]),
        resources={"event_store": resource},
        raise_on_error=False,
    )

    assert not result.success
    assert store.run_ids() == []


def test_archive_events_job_moves_only_completed_runs(resource, store):
    old = NOW - timedelta(days=40)
    store.append_batch(
        "done",
        [
            NewEvent("done", "RunStarted", old),
            NewEvent("done", "RunCompleted", old + timedelta(minutes=5)),
        ],
    )
    store.append_batch("running", [NewEvent("running", "RunStarted", old)])

    result = archive_events.execute_in_process(
        run_config={"ops": {"archive_events_op": {"config": {"older_than_days": 0}}}},
        resources={"event_store": resource},
    )

    assert result.success
    assert result.output_for_node("archive_events_op") == 2
    assert len(store.fetch("done")) == 2  # archived, and still readable
    assert len(store.fetch("running")) == 1


def test_archive_events_job_rejects_negative_days(resource):
    result = archive_events.execute_in_process(
        run_config={"ops": {"archive_events_op": {"config": {"older_than_days": -1}}}},
        resources={"event_store": resource},
        raise_on_error=False,
    )

    assert not result.success


def test_archive_schedule_requests_one_run_per_day_with_valid_config():
    when = datetime(2026, 3, 4, 3, 30, tzinfo=UTC)
    with dg.build_schedule_context(scheduled_execution_time=when) as context:
        request = archive_events_schedule(context)

    assert request.run_key == "archive_events:2026-03-04"
    dg.validate_run_config(archive_events, request.run_config)


def test_archive_schedule_tick_archives_once_per_day(resource, store):
    from runstate.commands.ticking import tick_schedule

    long_ago = NOW - timedelta(days=400)
    store.append_batch(
        "ancient", [NewEvent("ancient", "RunStarted", long_ago), NewEvent("ancient", "RunFailed", long_ago)]
    )
    defs = dg.Definitions(
        jobs=[archive_events], schedules=[archive_events_schedule], resources={"event_store": resource}
    )
    instance = dg.DagsterInstance.ephemeral()
    when = datetime(2026, 3, 4, 3, 30, tzinfo=UTC)

    first = tick_schedule("archive_events_schedule", defs=defs, instance=instance, at=when)
    again = tick_schedule("archive_events_schedule", defs=defs, instance=instance, at=when)

    assert first.succeeded == 1
    assert first.results[0].output_for_node("archive_events_op") == 2
    assert again.skipped_run_keys == ["archive_events:2026-03-04"]
    assert len(store.fetch("ancient")) == 2  # archived, and still readable


def test_append_events_job_on_the_snowflake_backend(snowflake_schema):
    conn_kwargs, schema = snowflake_schema
    snowflake = SnowflakeConnection(
        **{
            key: conn_kwargs[key]
            for key in (
                "account",
                "user",
                "password",
                "database",
                "network_timeout",
                "host",
                "port",
                "protocol",
            )
        }
    )
    resource = EventStoreResource(backend="snowflake", snowflake=snowflake, snowflake_schema=schema)

    result = append_events.execute_in_process(
        run_config=append_config("sf-run", RUN_EVENTS), resources={"event_store": resource}
    )
    again = append_events.execute_in_process(
        run_config=append_config("sf-run", RUN_EVENTS), resources={"event_store": resource}
    )

    assert result.output_for_node("append_events_op") == [1, 2, 3]
    assert again.output_for_node("append_events_op") == [1, 2, 3]
    store = resource.get_store()
    try:
        assert [e.run_seq for e in store.fetch("sf-run")] == [1, 2, 3]
        assert store.project("sf-run").status == "RUNNING"
    finally:
        resource.close()


def test_append_events_job_with_a_stale_expected_last_seq_fails_without_retries(resource, store):
    def config(events: list[dict], expected: int) -> dict:
        doc = append_config("occ", events)
        doc["ops"]["append_events_op"]["config"]["expected_last_seq"] = expected
        return doc

    won = append_events.execute_in_process(
        run_config=config(RUN_EVENTS[:1], 0), resources={"event_store": resource}
    )
    lost = append_events.execute_in_process(
        run_config=config(RUN_EVENTS[1:], 0), resources={"event_store": resource}, raise_on_error=False
    )

    assert won.success and not lost.success
    failure = [e for e in lost.all_events if e.is_step_failure][0]
    assert "expected last seq 0" in failure.step_failure_data.error.message
    assert [e for e in lost.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"] == []
    assert [e.run_seq for e in store.fetch("occ")] == [1]
