"""A run declared dead ends with its processes: a frozen worker's Spark JVM does not outlive its slot.

The worker of the main test is a real process with a real PySpark JVM below it, running a Spark job, and
frozen with SIGSTOP past the dead bound; the liveness check that fails its run ends both first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import dagster as dg

from runstate.defs.runs.beating import HeartbeatRunLauncher
from runstate.defs.runs.beats import beat, beat_ages, record_worker, worker_of
from runstate.defs.runs.liveness import LivenessPolicy, check_runs
from runstate.defs.runs.workers import WorkerProcess, end_process, host_key, this_process
from runstate_tests.defs.fence_child import marking_job
from runstate_tests.deployment.sampling import spark_jvms
from runstate_tests.support.devserver import poll
from runstate_tests.support.runs import started_run

DEAD_AFTER_S = 6


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_frozen_worker_declared_dead_is_ended_with_its_spark_jvm_before_its_run_is_failed(bare_instance):
    run = started_run(bare_instance, marking_job)
    env = {**os.environ, "RUNSTATE_RUN_DEAD_AFTER_S": str(DEAD_AFTER_S)}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runstate_tests.defs.spark_worker_child",
            bare_instance.root_directory,
            run.run_id,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    jvms: set[int] = set()
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "SPARK"
        jvms = spark_jvms(child.pid)
        assert len(jvms) == 1
        assert WorkerProcess.from_text(worker_of(bare_instance, run.run_id) or "").pid == child.pid

        child.send_signal(signal.SIGSTOP)
        policy = LivenessPolicy(dead_after_s=DEAD_AFTER_S)
        poll(
            lambda: beat_ages(bare_instance, [run.run_id])[run.run_id] >= DEAD_AFTER_S,
            timeout=30,
            every=0.2,
            what="a stale heartbeat",
        )
        [verdict] = check_runs(bare_instance, [bare_instance.get_run_record_by_id(run.run_id)], policy=policy)

        assert verdict.status == dg.DagsterRunStatus.FAILURE
        assert not any(alive(pid) for pid in jvms)  # gone before the run (and its slot) was freed
        assert child.wait(timeout=10) == -signal.SIGKILL
        [event] = bare_instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
        ).records
        assert f"its process {child.pid} and the" in event.event_log_entry.dagster_event.message
    finally:
        for pid in (child.pid, *jvms):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait(timeout=10)


def test_a_process_recorded_on_another_host_or_since_reused_is_left_alone():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        mine = this_process()
        assert mine is not None and mine.host == host_key()
        started = WorkerProcess.from_text(this_process_of(sleeper.pid))
        other_host = WorkerProcess("elsewhere/boot/pid:[1]", sleeper.pid, started.started)
        reused = WorkerProcess(started.host, sleeper.pid, started.started + 1)

        assert "another host" in end_process(other_host)
        assert "already ended" in end_process(reused)
        assert "already ended" in end_process(mine)  # never the caller itself
        assert alive(sleeper.pid)

        assert f"its process {sleeper.pid} and the 0 below it" in end_process(started)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()


def this_process_of(pid: int) -> str:
    """The record `pid` would make of itself."""
    with open(f"/proc/{pid}/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19])
    return WorkerProcess(host_key() or "", pid, started).as_text()


def test_the_launchers_health_check_ends_the_process_of_a_run_it_answers_failed(bare_instance):
    """Run monitoring fails the run (and frees its slots) on a FAILED answer: the process ends first."""
    launcher = HeartbeatRunLauncher()
    launcher.register_instance(bare_instance)
    run = started_run(bare_instance, marking_job)
    worker = subprocess.Popen(["sleep", "60"])
    try:
        record_worker(bare_instance, run.run_id, this_process_of(worker.pid))
        beat(bare_instance, run.run_id)
        healthy = launcher.check_run_worker_health(run)
        assert healthy.status.value == "RUNNING" and alive(worker.pid)

        beat(bare_instance, run.run_id, age_s=600)
        gone = launcher.check_run_worker_health(run)

        assert gone.status.value == "FAILED" and f"its process {worker.pid} and the 0 below it" in gone.msg
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait()


def test_a_run_worker_records_its_process(bare_instance):
    """The beating executor (a run worker's) records the worker: its pid, on this host."""
    run = bare_instance.create_run_for_job(marking_job)
    bare_instance.handle_run_event(
        run.run_id, dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name=run.job_name)
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runstate_tests.defs.fence_child",
            "execute",
            bare_instance.root_directory,
            run.run_id,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=120)

    assert child.returncode == 0 and "RETURNED" in out
    recorded = WorkerProcess.from_text(worker_of(bare_instance, run.run_id) or "")
    assert recorded is not None and recorded.pid == child.pid and recorded.host == host_key()
