"""A run declared dead changes nothing more: its own process stops, with one line and exit code 1.

Each test runs the process of a run in a child (`fence_child`) against an on-disk instance that this
test shares, declares the run dead the way another process would (or pauses the child past the bound
with SIGSTOP), and reads how the child ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg

from runstate.defs.runs.beats import beat_ages
from runstate_tests.defs.fence_child import marking_job
from runstate_tests.support.devserver import poll
from runstate_tests.support.runs import started_run

DEAD_AFTER_S = 6


def child(mode: str, instance: dg.DagsterInstance, run_id: str) -> subprocess.Popen:
    env = {**os.environ, "RUNSTATE_RUN_DEAD_AFTER_S": str(DEAD_AFTER_S)}
    return subprocess.Popen(
        [sys.executable, "-m", "runstate_tests.defs.fence_child", mode, instance.root_directory, run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def ended(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error: ")]


def beating_child(instance: dg.DagsterInstance) -> tuple[dg.DagsterRun, subprocess.Popen]:
    run = started_run(instance, marking_job)
    process = child("beat", instance, run.run_id)
    assert process.stdout is not None and process.stdout.readline().strip() == "BEATING"
    poll(lambda: beat_ages(instance, [run.run_id]), timeout=60, every=0.1, what="the child's first beat")
    return run, process


def test_a_process_whose_run_is_reported_failed_stops_at_its_next_beat(bare_instance):
    run, process = beating_child(bare_instance)

    bare_instance.report_run_failed(
        bare_instance.get_run_by_id(run.run_id), "declared dead by another process"
    )
    code, _, err = ended(process)

    assert code == 1
    [line] = error_lines(err)
    assert line.startswith(f"Error: run {run.run_id} was declared dead (it is FAILURE)")


def test_a_process_paused_past_the_bound_stops_by_its_own_clock_when_it_resumes(bare_instance):
    """Nobody has looked yet: the run still reads STARTED, but another process may fail it any moment, so
    the resumed process must not go on (a beat is stamped after it is sent)."""
    run, process = beating_child(bare_instance)

    process.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    time.sleep(DEAD_AFTER_S + 2)
    process.send_signal(signal.SIGCONT)
    code, _, err = ended(process)

    assert code == 1 and time.monotonic() - paused >= DEAD_AFTER_S
    [line] = error_lines(err)
    assert line.startswith(
        f"Error: run {run.run_id} may have been declared dead: this process could not beat"
    )
    assert bare_instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED  # left to be reaped


def test_a_worker_that_starts_after_its_run_was_reaped_while_launching_does_nothing(bare_instance):
    """The worker read its run as STARTING before the reap, so Dagster lets it start, and its RUN_START
    overwrites the reaped status: the reap is still in the run's event log, and the executor reads it."""
    run = bare_instance.create_run_for_job(marking_job)
    bare_instance.report_run_failed(run, "declared dead while launching")
    bare_instance.handle_run_event(
        run.run_id, dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=run.job_name)
    )

    code, out, err = ended(child("execute", bare_instance, run.run_id))

    assert code == 1 and "RETURNED" not in out
    [line] = error_lines(err)
    assert line.startswith(f"Error: run {run.run_id} was declared dead before its worker started")
    assert not (Path(bare_instance.root_directory) / f"ran-{run.run_id}").exists()
    kinds = [e.dagster_event_type for e in bare_instance.all_logs(run.run_id) if e.dagster_event_type]
    assert dg.DagsterEventType.STEP_START not in kinds and dg.DagsterEventType.RUN_SUCCESS not in kinds
    assert bare_instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE  # put back


def test_a_run_that_fails_by_itself_in_process_is_no_zombie_of_its_own(bare_instance):
    """The CLI beats until `execute_in_process` returns, after the run's own failure is stored: that
    failure is its end, not a verdict of another process."""
    run_id = str(uuid.uuid4())

    code, out, err = ended(child("fail", bare_instance, run_id))

    assert (code, out.strip().splitlines()[-1]) == (0, "ALIVE"), err[-2000:]
    assert bare_instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
