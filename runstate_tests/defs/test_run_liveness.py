"""Run liveness on a real instance: the verdicts by the database's clock, the reaping, the beat writers."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster._core.errors import DagsterInvariantViolationError, DagsterLaunchFailedError
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._grpc.server import GrpcServerProcess

from runstate.cli import main
from runstate.config import ConfigError, Settings, settings
from runstate.defs.runs.beating import HeartbeatRunLauncher, beating
from runstate.defs.runs.beats import ages, beat, beat_ages, forget, mark_seen, record_worker
from runstate.defs.runs.heartbeat import heartbeat
from runstate.defs.runs.liveness import (
    NEVER_HANDED,
    NOT_RUN,
    LivenessPolicy,
    RunLiveness,
    Signs,
    check_runs,
    judge,
    sweep_rows,
)
from runstate.defs.runs.workers import WorkerProcess, host_key, this_process
from runstate.procfs import stat_fields
from runstate.services.dev import STOPPING_FILE_ENV
from runstate_tests.support.devserver import poll
from runstate_tests.support.runs import started_run

POLICY = LivenessPolicy(dead_after_s=20, start_grace_s=60, launch_grace_s=300, ask_server_after_s=10)


@dg.op
def noop() -> None:
    pass


@dg.job
def tiny() -> None:
    noop()


@dg.op
def report_own_heartbeat(context) -> None:
    context.add_output_metadata({"beating": context.run_id in beat_ages(context.instance, [context.run_id])})


@dg.job(executor_def=beating(dg.in_process_executor))
def beating_job() -> None:
    report_own_heartbeat()


@pytest.fixture
def instance(bare_instance: dg.DagsterInstance) -> dg.DagsterInstance:
    return bare_instance  # not the WAL world's instance of this folder's conftest: no services needed


def record(instance: dg.DagsterInstance, run: dg.DagsterRun):
    return instance.get_run_record_by_id(run.run_id)


def seen_ago(instance: dg.DagsterInstance, run_id: str, seconds: float) -> None:
    """As if the first liveness check had seen the run `seconds` ago."""
    forget(instance, [run_id])
    mark_seen(instance, [run_id], age_s=seconds)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_a_started_run_is_alive_while_it_beats_and_dead_once_its_beat_is_stale(instance):
    run = started_run(instance, tiny)

    fresh = judge(record(instance, run), Signs(beat_age_s=5), POLICY)
    stale = judge(record(instance, run), Signs(beat_age_s=25), POLICY)

    assert fresh.alive and not fresh.dead
    assert not stale.alive and stale.dead and "heartbeat 25 s ago" in stale.describe()
    assert stale.reason == "no heartbeat for 25 s (the bound is 20 s)"


def test_a_run_in_progress_is_described_since_its_start_and_an_ended_one_by_when_it_started():
    at = 1_700_000_000.0  # 22:13:20 UTC
    running = RunLiveness("1a2b3c4d", dg.DagsterRunStatus.STARTED, at, 2.0, True)

    assert running.describe() == "run 1a2b3c4d, STARTED since 22:13:20 UTC, heartbeat 2 s ago"
    assert running.ended(dg.DagsterRunStatus.FAILURE).describe() == (
        "run 1a2b3c4d, FAILURE, started 22:13:20 UTC, heartbeat 2 s ago"
    )


def test_a_run_that_never_beat_gets_its_grace_from_its_first_sighting(instance):
    started, launching = started_run(instance, tiny), instance.create_run_for_job(tiny)

    assert judge(record(instance, started), Signs(seen_age_s=59), POLICY).alive
    assert judge(record(instance, started), Signs(seen_age_s=61), POLICY).dead
    assert judge(record(instance, launching), Signs(seen_age_s=299), POLICY).alive  # loading its code
    assert judge(record(instance, launching), Signs(seen_age_s=301), POLICY).dead


def test_a_launching_run_whose_code_server_does_not_run_it_is_dead(instance):
    run = instance.create_run_for_job(tiny)

    verdict = judge(record(instance, run), Signs(seen_age_s=11, worker=False, worker_note=NOT_RUN), POLICY)

    assert verdict.dead and verdict.reason == NOT_RUN


def test_a_queued_run_waits_for_the_queue_and_is_never_reaped():
    queued = SimpleNamespace(
        dagster_run=SimpleNamespace(run_id="q", status=dg.DagsterRunStatus.QUEUED),
        start_time=None,
        create_timestamp=None,
    )

    assert judge(queued, Signs(seen_age_s=10_000), POLICY).alive


def test_a_finished_run_is_neither_alive_nor_reaped_and_its_last_beat_is_dropped(instance):
    done = tiny.execute_in_process(instance=instance).dagster_run
    beat(instance, done.run_id, age_s=600)  # the last beat of a worker that ended

    [verdict] = check_runs(instance, [record(instance, done)], policy=POLICY)

    assert (verdict.alive, verdict.dead) == (False, False)
    assert instance.get_run_by_id(done.run_id).status == dg.DagsterRunStatus.SUCCESS
    assert beat_ages(instance, [done.run_id]) == {}  # a finished run's row goes when someone looks


def test_check_runs_reports_a_dead_run_failed_and_leaves_a_live_one(instance):
    dead, live = started_run(instance, tiny), started_run(instance, tiny)
    beat(instance, dead.run_id, age_s=60)
    beat(instance, live.run_id)

    verdicts = check_runs(instance, [record(instance, dead), record(instance, live)], policy=POLICY)

    assert [v.status for v in verdicts] == [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED]
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.STARTED
    [failure] = instance.all_logs(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert re.search(r"no heartbeat for 6\d s", failure.message)


def test_a_beating_run_whose_process_on_this_machine_ended_is_dead_at_once(instance):
    """A deployment SIGKILLed and restarted: its old workers' heartbeats are still fresh, but their
    processes are gone, and their shards must go to new runs now, not a heartbeat bound later. A process
    that lives (frozen or not), or one recorded on another machine, is judged by its heartbeat still."""
    ended_run, live_run, elsewhere_run = (started_run(instance, tiny) for _ in range(3))
    ended_process = subprocess.Popen([sys.executable, "-c", "pass"])
    ended_process.wait()
    live_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ended_worker = WorkerProcess(host_key(), ended_process.pid, this_process().started)
        live_worker = WorkerProcess(host_key(), live_process.pid, int(stat_fields(live_process.pid)[19]))
        elsewhere_worker = WorkerProcess("other-host/boot/ns", ended_process.pid, 1)
        runs = [(ended_run, ended_worker), (live_run, live_worker), (elsewhere_run, elsewhere_worker)]
        for run, worker in runs:
            beat(instance, run.run_id)
            record_worker(instance, run.run_id, worker.as_text())

        verdicts = check_runs(instance, [record(instance, run) for run, _ in runs], policy=POLICY)

        assert [v.status for v in verdicts] == [
            dg.DagsterRunStatus.FAILURE,
            dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.STARTED,
        ]
        assert verdicts[0].reason == f"its process {ended_process.pid} on this machine has ended"
    finally:
        live_process.kill()
        live_process.wait()


def test_a_reader_whose_clock_is_a_minute_ahead_fails_no_beating_run(instance, monkeypatch):
    """Ages come from the database's clock at write and at read: neither process's clock enters."""
    ahead, behind = started_run(instance, tiny), started_run(instance, tiny)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 60)  # a writer a minute behind
    beat(instance, ahead.run_id)
    beat(instance, behind.run_id)
    monkeypatch.setattr(time, "time", lambda: real_time() + 60)  # a reader a minute ahead

    verdicts = check_runs(instance, [record(instance, ahead), record(instance, behind)], policy=POLICY)

    assert [v.status for v in verdicts] == [dg.DagsterRunStatus.STARTED] * 2
    assert all(v.alive and v.beat_age_s < 5 for v in verdicts)


def test_a_started_run_that_never_beats_is_failed_once_seen_for_longer_than_its_grace(instance):
    run = started_run(instance, tiny)

    [first] = check_runs(instance, [record(instance, run)], policy=POLICY)
    seen_first = ages(instance, [run.run_id])[run.run_id].seen_s
    mark_seen(instance, [run.run_id], age_s=600)  # a second sighting keeps the first one's time
    [again] = check_runs(instance, [record(instance, run)], policy=POLICY)

    assert first.alive and seen_first is not None and seen_first < 5
    assert again.alive
    seen_ago(instance, run.run_id, 600)
    [late] = check_runs(instance, [record(instance, run)], policy=POLICY)
    assert late.status == dg.DagsterRunStatus.FAILURE and "first seen STARTED" in late.reason


def test_a_launching_run_is_failed_once_its_code_server_address_is_closed(instance):
    """As after a deployment killed and started again: the code server that launched it is gone."""
    run = instance.create_run_for_job(tiny)
    instance.handle_run_event(
        run.run_id, dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=tiny.name)
    )
    instance.add_run_tags(
        run.run_id, {GRPC_INFO_TAG: json.dumps({"host": "127.0.0.1", "port": closed_port()})}
    )
    mark_seen(instance, [run.run_id])

    [asked_too_soon] = check_runs(instance, [record(instance, run)], policy=POLICY)
    seen_ago(instance, run.run_id, 11)
    [asked] = check_runs(instance, [record(instance, run)], policy=POLICY)

    assert asked_too_soon.alive  # a launch tags the run a moment before its server registers it
    assert asked.status == dg.DagsterRunStatus.FAILURE and asked.reason == NOT_RUN


def test_a_live_code_server_that_does_not_know_a_run_fails_it_while_it_launches_but_not_once_started(
    instance, tmp_path
):
    """A real code server that never launched either run. A launching run it does not know is dead (a
    deployment restarted on the same address); a started one waits for its grace, as after a reload of
    the code location the server asked is not the one that runs it."""
    (tmp_path / "location.py").write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    origin = LoadableTargetOrigin(python_file=str(tmp_path / "location.py"), attribute="defs")
    with GrpcServerProcess(instance_ref=None, loadable_target_origin=origin, force_port=True) as server:
        address = {GRPC_INFO_TAG: json.dumps({"host": "127.0.0.1", "port": server.port})}
        assert server.create_client().ping("up")["echo"] == "up"  # it waited for the server to listen
        launching = instance.create_run_for_job(tiny, tags=address)
        instance.handle_run_event(
            launching.run_id,
            dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=tiny.name),
        )
        started = started_run(instance, tiny, tags=address)
        for run in (launching, started):
            seen_ago(instance, run.run_id, 11)

        verdicts = check_runs(
            instance, [record(instance, launching), record(instance, started)], policy=POLICY
        )

    assert [verdict.status for verdict in verdicts] == [
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.STARTED,
    ]
    assert verdicts[0].reason == NOT_RUN and verdicts[1].alive


def test_a_launching_run_the_default_launcher_never_handed_to_a_code_server_is_failed(instance):
    """Killed between its STARTING and its launch: no code server was ever asked to run it."""
    run = instance.create_run_for_job(tiny)
    instance.handle_run_event(
        run.run_id, dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=tiny.name)
    )
    seen_ago(instance, run.run_id, 11)

    [verdict] = check_runs(instance, [record(instance, run)], policy=POLICY)

    assert isinstance(instance.run_launcher, DefaultRunLauncher)  # what an instance without a launcher has
    assert verdict.status == dg.DagsterRunStatus.FAILURE and verdict.reason == NEVER_HANDED


def test_a_run_put_back_in_the_queue_gets_a_new_grace_when_it_is_launched_again(instance):
    """The queue re-enqueues a run whose launch could not reach its code server (a restart, a reload):
    the sighting of that first STARTING is not the age of the next one."""
    run = instance.create_run_for_job(tiny)
    starting = dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=tiny.name)
    instance.handle_run_event(run.run_id, starting)
    seen_ago(instance, run.run_id, 11)
    # Back in the queue (a run of a job without a code location cannot be QUEUED in storage).
    back = SimpleNamespace(run_id=run.run_id, status=dg.DagsterRunStatus.QUEUED, is_finished=False)

    [queued] = check_runs(instance, [SimpleNamespace(dagster_run=back, start_time=None)], policy=POLICY)
    [launching] = check_runs(instance, [record(instance, run)], policy=POLICY)

    assert queued.status == dg.DagsterRunStatus.QUEUED and queued.alive
    assert launching.status == dg.DagsterRunStatus.STARTING and launching.alive, launching.reason


def test_the_sweep_drops_the_rows_of_runs_that_ended_and_keeps_the_live_ones(instance):
    live = started_run(instance, tiny)
    done = tiny.execute_in_process(instance=instance).dagster_run
    for run_id in (live.run_id, done.run_id, "gone-run"):
        beat(instance, run_id)

    dropped = sweep_rows(instance)

    assert dropped == 2
    assert set(beat_ages(instance, [live.run_id, done.run_id, "gone-run"])) == {live.run_id}


def test_the_heartbeat_thread_beats_until_the_block_ends_then_drops_the_row(instance):
    run = started_run(instance, tiny)

    with heartbeat(instance, run.run_id, ends_run=True):
        during = poll(lambda: beat_ages(instance, [run.run_id]), timeout=30, every=0.1, what="a beat")

    assert run.run_id in during
    assert beat_ages(instance, [run.run_id]) == {}


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
    beat(instance, run.run_id, age_s=600)
    gone = launcher.check_run_worker_health(run)

    assert launcher.supports_check_run_worker_health
    assert healthy.status.value == "RUNNING" and gone.status.value == "FAILED"
    assert re.search(r"heartbeat 6\d\d s ago", gone.msg) and "the bound is" in gone.msg


def test_the_dead_bound_is_a_setting_with_bounds():
    def policy(raw: str | None) -> LivenessPolicy:
        environ = {} if raw is None else {"RUNSTATE_RUN_DEAD_AFTER_S": raw}
        return LivenessPolicy.from_settings(Settings.from_env(environ))

    assert policy("30").dead_after_s == 30 and policy(None).dead_after_s == 20
    assert policy("600").launch_grace_s == 600  # a run never gets less than the bound
    for bad in ("abc", "1", "0", "-5", "nan", "1e9", "inf"):
        with pytest.raises(ConfigError, match="RUNSTATE_RUN_DEAD_AFTER_S must be a number of seconds from 6"):
            policy(bad)


@pytest.mark.parametrize("raw", ["abc", "1", "0", "-5", "nan", "1e9"])
def test_a_bad_dead_bound_is_one_error_line_on_wal_status(raw, tmp_path):
    """Issue 42.4: these passed `runstate wal status` with exit 0."""
    result = CliRunner().invoke(
        main, ["wal", "status"], env={"RUNSTATE_HOME": str(tmp_path), "RUNSTATE_RUN_DEAD_AFTER_S": raw}
    )
    settings.cache_clear()

    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: RUNSTATE_RUN_DEAD_AFTER_S must be a number of seconds from 6 to 3600, got {raw!r}"
    ]


def test_the_liveness_sensor_fails_a_dead_run_of_any_job_of_the_code_location_and_only_those(instance):
    """Issue 39.1: a killed table_inventory_job stayed STARTED for good: no shard sensor looks at it."""
    from runstate.commands.ticking import tick_sensor
    from runstate.definitions import defs

    inventory = started_run(instance, defs.resolve_job_def("table_inventory_job"))
    elsewhere = started_run(instance, tiny)  # a job of another code location, with the same instance
    for run in (inventory, elsewhere):
        beat(instance, run.run_id, age_s=60)

    tick = tick_sensor("run_liveness", defs=defs, instance=instance)

    assert instance.get_run_by_id(inventory.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(elsewhere.run_id).status == dg.DagsterRunStatus.STARTED
    assert f"1 found dead and failed: {inventory.run_id}" in tick.skip_reason


def test_the_launcher_launches_nothing_once_runstate_dev_is_stopping(instance, tmp_path, monkeypatch):
    """Issue 42.9: a flush run launched while `runstate dev` shut down started after its daemon had
    stopped, and was killed STARTED. Once the stop begins, launches fail at once (the sensors ask again
    after the restart)."""
    launcher = HeartbeatRunLauncher()
    launcher.register_instance(instance)
    run = instance.create_run_for_job(tiny)
    stopping = tmp_path / "stopping"
    monkeypatch.setenv(STOPPING_FILE_ENV, str(stopping))
    with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):  # Dagster's own launch
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))

    stopping.touch()
    with pytest.raises(DagsterLaunchFailedError, match="the deployment is stopping"):
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
