"""Run liveness from heartbeats, on a real instance: the verdicts, the reaping, the beat writers."""

import re
import time

import dagster as dg
import pytest

from runstate.defs.runs.beating import HeartbeatRunLauncher, beating
from runstate.defs.runs.liveness import (
    LivenessPolicy,
    beat,
    check_runs,
    heartbeat,
    judge,
    last_beats,
)
from runstate_tests.defs.conftest import started_run
from runstate_tests.devserver import poll

POLICY = LivenessPolicy(dead_after_s=20, start_grace_s=60)


@dg.op
def noop() -> None:
    pass


@dg.job
def tiny() -> None:
    noop()


@dg.op
def report_own_heartbeat(context) -> None:
    beats = last_beats(context.instance, [context.run_id])
    context.add_output_metadata({"beating": context.run_id in beats})


@dg.job(executor_def=beating(dg.in_process_executor))
def beating_job() -> None:
    report_own_heartbeat()


@pytest.fixture
def instance(bare_instance: dg.DagsterInstance) -> dg.DagsterInstance:
    return bare_instance  # not the WAL world's instance of this folder's conftest: no services needed


def record(instance: dg.DagsterInstance, run: dg.DagsterRun):
    return instance.get_run_record_by_id(run.run_id)


def test_a_started_run_is_alive_while_it_beats_and_dead_once_its_beat_is_stale(instance):
    run = started_run(instance, tiny)
    now = time.time()

    fresh = judge(record(instance, run), now - 5, now, POLICY)
    stale = judge(record(instance, run), now - 25, now, POLICY)

    assert fresh.alive and not fresh.dead
    assert not stale.alive and stale.dead and "heartbeat 25 s ago" in stale.describe()


def test_a_run_that_never_beat_gets_the_start_grace(instance):
    run = started_run(instance, tiny)
    started = record(instance, run).start_time

    assert judge(record(instance, run), None, started + 59, POLICY).alive
    assert judge(record(instance, run), None, started + 61, POLICY).dead


def test_a_run_still_launching_is_left_to_dagsters_start_timeout(instance):
    """Its worker loads the code location before it beats: a slow start is not a dead worker."""
    run = instance.create_run_for_job(tiny)  # NOT_STARTED: launched, its worker not yet running
    created = record(instance, run).create_timestamp.timestamp()

    assert judge(record(instance, run), None, created + 600, POLICY).alive


def test_a_finished_run_is_neither_alive_nor_reaped_and_its_last_beat_is_dropped(instance):
    done = tiny.execute_in_process(instance=instance).dagster_run
    beat(instance, done.run_id, now=time.time() - 600)  # the last beat of a worker that ended

    [verdict] = check_runs(instance, [record(instance, done)], policy=POLICY)

    assert (verdict.alive, verdict.dead) == (False, False)
    assert instance.get_run_by_id(done.run_id).status == dg.DagsterRunStatus.SUCCESS
    assert last_beats(instance, [done.run_id]) == {}


def test_check_runs_reports_a_dead_run_failed_and_leaves_a_live_one(instance):
    dead, live = started_run(instance, tiny), started_run(instance, tiny)
    beat(instance, dead.run_id, now=time.time() - 60)
    beat(instance, live.run_id)

    verdicts = check_runs(instance, [record(instance, dead), record(instance, live)], policy=POLICY)

    assert [v.status for v in verdicts] == [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED]
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.STARTED
    [failure] = instance.all_logs(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert re.search(r"no heartbeat for 6\d s", failure.message)


def test_the_heartbeat_thread_beats_until_the_block_ends_then_drops_the_key(instance):
    run = started_run(instance, tiny)

    with heartbeat(instance, run.run_id, ends_run=True):
        during = poll(lambda: last_beats(instance, [run.run_id]), timeout=30, every=0.1, what="a beat")

    assert run.run_id in during
    assert last_beats(instance, [run.run_id]) == {}


def test_a_job_with_the_beating_executor_beats_while_it_executes(instance):
    result = dg.execute_job(dg.reconstructable(beating_job), instance=instance)

    assert result.success
    [materialized] = [e for e in result.all_events if e.is_successful_output]
    assert materialized.event_specific_data.metadata["beating"].value is True


def test_the_launcher_answers_the_run_worker_health_check_from_the_heartbeat(instance):
    launcher = HeartbeatRunLauncher()
    launcher.register_instance(instance)
    run = started_run(instance, tiny)
    beat(instance, run.run_id)
    healthy = launcher.check_run_worker_health(run)
    beat(instance, run.run_id, now=time.time() - 600)
    gone = launcher.check_run_worker_health(run)

    assert launcher.supports_check_run_worker_health
    assert healthy.status.value == "RUNNING" and gone.status.value == "FAILED"
    assert re.search(r"heartbeat 6\d\d s ago", gone.msg)


def test_the_dead_bound_comes_from_the_environment_and_is_checked():
    assert LivenessPolicy.from_env({"RUNSTATE_RUN_DEAD_AFTER_S": "30"}).dead_after_s == 30
    assert LivenessPolicy.from_env({}).dead_after_s == 20
    for bad in ("0", "-1", "abc", "nan", "1e9"):
        with pytest.raises(ValueError, match="RUNSTATE_RUN_DEAD_AFTER_S"):
            LivenessPolicy.from_env({"RUNSTATE_RUN_DEAD_AFTER_S": bad})
