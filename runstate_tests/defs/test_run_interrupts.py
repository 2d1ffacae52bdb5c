"""A run worker that gets SIGTERM ends its run at once, instead of retrying its step in a dying process.

Each test runs a job in a child Python process the way a run worker does (interrupts captured, so a
SIGTERM raises inside the running op), sends it SIGTERM while the op works, and reads what happened
from the JSON line the child prints last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

WORKER = textwrap.dedent(
    """
    import json, sys, time
    import dagster as dg
    from dagster._utils.interrupts import capture_interrupts
    from runstate.defs.runs.interrupts import ends_run_when_interrupted

    def long_work() -> None:
        print("working", flush=True)
        while True:
            time.sleep(0.1)

    compute = ends_run_when_interrupted(long_work) if sys.argv[1] == "wrapped" else long_work
    op = dg.op(name="long_work", retry_policy=dg.RetryPolicy(max_retries=3, delay=0.1))(compute)

    @dg.job
    def job() -> None:
        op()

    with capture_interrupts():  # as a run worker does
        result = job.execute_in_process(raise_on_error=False)
    kinds = [event.event_type_value for event in result.all_events]
    failure = next((e.step_failure_data for e in result.all_events if e.is_step_failure), None)
    user = failure.user_failure_data if failure is not None else None
    print(json.dumps({
        "success": result.success,
        "retries": kinds.count("STEP_UP_FOR_RETRY"),
        "failure": user.description if user is not None else None,
    }), flush=True)
    """
)


SPARK_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import dagster as dg
    from dagster._utils.interrupts import capture_interrupts
    from pyspark.sql import SparkSession
    from runstate.defs.runs.interrupts import ends_run_when_interrupted
    from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")

    def sleepy(rows):
        import time
        time.sleep(300)
        yield from rows

    def merge_like() -> None:
        with spark_jobs_cancelled_on_interrupt(spark) as interrupt:
            print("working", flush=True)
            try:  # a py4j call that blocks the main thread for five minutes, as a big merge does
                spark.sparkContext.parallelize([1], 1).mapPartitions(sleepy).collect()
            except Exception:  # the merge op's handling of one dataset's failure
                interrupt.check()
                raise

    op = dg.op(name="merge_like", retry_policy=dg.RetryPolicy(max_retries=3, delay=0.1))(
        ends_run_when_interrupted(merge_like)
    )

    @dg.job
    def job() -> None:
        op()

    with capture_interrupts():
        result = job.execute_in_process(raise_on_error=False)
    failure = next((e.step_failure_data for e in result.all_events if e.is_step_failure), None)
    user = failure.user_failure_data if failure is not None else None
    print(json.dumps({
        "success": result.success,
        "retries": [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY"),
        "failure": user.description if user is not None else None,
    }), flush=True)
    """
)


def run_and_interrupt(mode: str, deadline_s: float = 60, script: str = WORKER) -> tuple[dict | None, float]:
    """Start the worker, SIGTERM it once its op works; returns its last JSON line (None if it never
    ended by itself) and the seconds from the signal to its exit."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DAGSTER_HOME": ""},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "working"
    time.sleep(3 if script is SPARK_WORKER else 0.5)  # the Spark job's task is running by then
    child.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        out, _ = child.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return None, time.monotonic() - signalled
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), time.monotonic() - signalled


def test_an_interrupted_op_fails_its_run_once_without_its_retry_policy():
    report, seconds = run_and_interrupt("wrapped")
    assert report is not None, f"the worker did not end within {seconds:.0f} s of SIGTERM"
    assert report["success"] is False
    assert report["retries"] == 0
    assert "interrupted by a signal" in report["failure"]


def test_without_it_dagster_retries_the_interrupted_step():
    """What the wrapper is for: Dagster applies the retry policy to the interrupt, and the step runs again
    in the process that was told to stop (here it then works on until killed)."""
    report, _ = run_and_interrupt("plain", deadline_s=10)
    assert report is None


@pytest.mark.spark
def test_an_op_blocked_in_a_spark_job_ends_its_run_at_once_on_sigterm():
    """Issue 42.9: a merge in a py4j call never saw the interrupt (Python runs signal handlers in the main
    thread, which waited for the JVM), so a stopping deployment killed it with its run left STARTED.
    Its Spark jobs are cancelled on the signal, and the run fails as interrupted, without a retry."""
    report, seconds = run_and_interrupt("spark", deadline_s=120, script=SPARK_WORKER)

    assert report is not None, f"the worker did not end within {seconds:.0f} s of SIGTERM"
    assert report["success"] is False and report["retries"] == 0
    assert "interrupted by a signal" in report["failure"]  # within 120 s: its task sleeps for 300
