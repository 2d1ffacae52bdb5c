"""The Spark pool `runstate_spark` in a plain (storage-only) instance: Dagster leaves an unset pool unbounded,
`runstate db upgrade` sets its limit, `spark_pool_sensor` sets it where nobody did and frees the slot of a
run killed while it held one, and a Spark step's JVM starts after its slot is taken and is gone before the
slot is freed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

from runstate.commands.ticking import execute_run
from runstate.config import settings
from runstate.defs.instance.pools import spark_pool_sensor, sweep_spark_pool
from runstate.defs.pool import spark_pool_limit
from runstate.defs.tags import SPARK_POOL
from runstate_tests.defs.instance_homes import storage_only_config, write_home

BIN = Path(sys.executable).parent
DEADLINE_S = 180


@pytest.fixture
def home(tmp_path: Path, fresh_database: str) -> Path:
    return write_home(tmp_path / "home", storage_only_config(fresh_database))


@pytest.fixture
def instance(home: Path):
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst


@dg.op(pool=SPARK_POOL)
def in_the_pool() -> None: ...


@dg.job
def pool_job() -> None:
    in_the_pool()


def _claims(instance: dg.DagsterInstance, steps: int, job: dg.JobDefinition = pool_job) -> list[bool]:
    """Each of `steps` runs of `job` tries to take a slot of its op's pool, as a run's executor does."""
    [op] = job.graph.iterate_op_defs()
    claimed = []
    for _ in range(steps):
        run = instance.create_run_for_job(job)
        with InstanceConcurrencyContext(instance, run) as context:
            claimed.append(context.claim(op.pool, op.name))
    return claimed


def test_an_unset_pool_is_unbounded_in_dagster_and_its_limit_bounds_it(instance):
    unbounded = _claims(instance, 3)
    instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 2)
    bounded = _claims(instance, 3)

    assert unbounded == [True, True, True]  # no limit row, no default_limit: every step runs at once
    assert bounded == [True, True, False]


@dg.op(pool="another_teams_pool")
def in_another_pool() -> None: ...


@dg.job
def another_job() -> None:
    in_another_pool()


def test_a_default_limit_bounds_every_pool_of_the_instance_and_the_sensor_leaves_it(tmp_path, fresh_database):
    """Why the project sets its own pool's limit rather than `concurrency: pools: default_limit`."""
    config = {**storage_only_config(fresh_database), "concurrency": {"pools": {"default_limit": 1}}}
    with dg.DagsterInstance.from_config(str(write_home(tmp_path, config))) as instance:
        sweep = sweep_spark_pool(instance, sessions=2)
        others = _claims(instance, 2, another_job)

        assert not sweep.limit_set and spark_pool_limit(instance) == 1  # the default holds; nothing set
        assert others == [True, False]  # another team's pool is bounded by it too


def _runstate(home: Path, database: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DAGSTER_HOME": str(home), "RUNSTATE_PG_URL": database, **env}
    return subprocess.run(
        [str(BIN / "runstate"), *args], env=environ, capture_output=True, text=True, timeout=300
    )


def test_db_upgrade_sets_the_pool_limit_in_a_storage_only_instance(home, fresh_database, instance):
    first = _runstate(home, fresh_database, "db", "upgrade", "--skip-aws", RUNSTATE_SPARK_SESSIONS="3")
    skipped = _runstate(
        home, fresh_database, "db", "upgrade", "--skip-aws", "--skip-dagster", RUNSTATE_SPARK_SESSIONS="5"
    )
    after_skip = spark_pool_limit(instance)
    default = _runstate(home, fresh_database, "db", "upgrade", "--skip-aws")

    assert first.returncode == 0, first.stderr[-2000:]
    assert "Dagster pool runstate_spark: at most 3 Spark session(s) at once (was unset)" in first.stdout
    assert skipped.returncode == 0 and "runstate_spark" not in skipped.stdout and after_skip == 3
    assert "at most 2 Spark session(s) at once (was 3)" in default.stdout
    assert spark_pool_limit(instance) == 2


def test_a_bad_session_count_is_one_error_line_and_leaves_the_limit(home, fresh_database, instance):
    instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 2)

    bad = _runstate(home, fresh_database, "db", "upgrade", "--skip-aws", RUNSTATE_SPARK_SESSIONS="0")

    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "Error: RUNSTATE_SPARK_SESSIONS must be a whole number from 1 to 64, got '0'"
    ]
    assert spark_pool_limit(instance) == 2


HOLDER = textwrap.dedent(
    """
    import sys, time
    import dagster as dg
    from runstate.defs.tags import SPARK_POOL
    from runstate.commands.ticking import execute_run

    @dg.op(pool=SPARK_POOL)
    def hold_a_slot() -> None:
        open(sys.argv[1], "w").close()
        time.sleep(600)  # the workload: a step that holds its slot until it is killed

    @dg.job
    def holder() -> None:
        hold_a_slot()

    with dg.DagsterInstance.get() as instance:
        execute_run(holder, instance)  # a run that beats, as the CLI's are
    """
)


def _wait_for(what: str, condition) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_sensor_sets_an_unset_limit_and_frees_the_slot_of_a_run_killed_holding_it(
    home, instance, tmp_path, monkeypatch
):
    monkeypatch.setenv("RUNSTATE_RUN_DEAD_AFTER_S", "6")  # the liveness bound the sensor judges with
    marker = tmp_path / "claimed"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    first = sweep_spark_pool(instance, sessions=2)  # no limit yet: the sensor sets it
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(marker)], env=env)
    try:
        _wait_for("the holder's step to start", marker.exists)
        [claim] = instance.event_log_storage.get_concurrency_info(SPARK_POOL).claimed_slots
        while_alive = sweep_spark_pool(instance, sessions=2)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    def freed() -> bool:
        result = spark_pool_sensor(dg.build_sensor_context(instance=instance))
        return "freed the slots of 1 ended run(s)" in result.skip_message

    _wait_for("the sensor to free the killed run's slot", freed)

    assert first.limit_set and first.limit == 2 and first.holders == []
    assert not while_alive.limit_set and while_alive.freed_runs == []
    assert [holder.alive for holder in while_alive.holders] == [True]
    assert instance.get_run_by_id(claim.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.event_log_storage.get_concurrency_info(SPARK_POOL).claimed_slots == []


SPARK_STEPS = textwrap.dedent(
    """
    import json, os, sys
    import dagster as dg
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from runstate.defs.spark import SparkResource, ends_spark_session
    from runstate.defs.tags import SPARK_POOL

    CONF = {"spark.master": "local[1]", "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", "spark.driver.memory": "512m"}
    seen = {}

    @dg.op(pool=SPARK_POOL)
    @ends_spark_session
    def use_spark(context: dg.OpExecutionContext, spark: SparkResource) -> None:
        info = context.instance.event_log_storage.get_concurrency_info(SPARK_POOL)
        seen["slot_before_jvm"] = [slot.run_id for slot in info.claimed_slots] == [context.run_id]
        seen["jvm_before_step"] = SparkContext._gateway is not None
        seen["rows"] = spark.get_session().range(3).count()
        seen["jvm_pid"] = SparkContext._gateway.proc.pid if SparkContext._gateway.proc else None

    @dg.job
    def spark_job() -> None:
        use_spark()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] != "Z"

    with dg.DagsterInstance.get() as instance:
        instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
        spark_job.execute_in_process(instance=instance, resources={"spark": SparkResource(spark_config=CONF)})
        owned = dict(seen, jvm_alive_after=alive(seen["jvm_pid"]), gateway_after=SparkContext._gateway is not None)
        builder = SparkSession.builder
        for key, value in CONF.items():
            builder = builder.config(key, value)
        shared = builder.getOrCreate()  # a session of the process's own, as a test's or the demo's
        spark_job.execute_in_process(instance=instance, resources={"spark": SparkResource(spark_config=CONF)})
        joined = dict(seen, jvm_alive_after=alive(seen["jvm_pid"]), shared_still_works=shared.range(2).count())
        print(json.dumps({"owned": owned, "joined": joined}))
    """
)


@pytest.mark.spark
def test_a_spark_step_starts_its_jvm_after_taking_its_slot_and_ends_it_before_freeing_it(home):
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_STEPS], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    owned, joined = result["owned"], result["joined"]
    assert owned["slot_before_jvm"] and not owned["jvm_before_step"] and owned["rows"] == 3
    assert owned["jvm_pid"] and not owned["jvm_alive_after"] and not owned["gateway_after"]
    # A session the process already had is left running: the step did not launch its JVM.
    assert joined["jvm_before_step"] and joined["jvm_alive_after"] and joined["shared_still_works"] == 2


def test_a_command_waiting_for_the_slot_of_a_killed_command_gets_it_without_a_daemon(
    home, instance, tmp_path, monkeypatch
):
    # A CLI-only setup: `runstate wal merge` killed mid-merge, then run again, with no daemon to free
    # the slot. The second command's own keeper frees it once the first is found dead.
    monkeypatch.setenv("RUNSTATE_RUN_DEAD_AFTER_S", "6")
    monkeypatch.setenv("RUNSTATE_SPARK_SESSIONS", "1")
    settings.cache_clear()
    instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
    marker = tmp_path / "claimed"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(marker)], env={**os.environ, "DAGSTER_HOME": str(home)}
    )
    try:
        _wait_for("the holder's step to start", marker.exists)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    try:
        result = execute_run(pool_job, instance)
    finally:
        settings.cache_clear()

    assert result.success
    assert instance.event_log_storage.get_concurrency_info(SPARK_POOL).claimed_slots == []
