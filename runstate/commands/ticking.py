"""Tick a sensor or a schedule now: one tick in-process, as the daemon would, for the CLI, the demo and tests.

A tick evaluates the sensor once with its stored cursor, stores the new cursor, skips run requests
whose run_key already has a run (the daemon's rule) and executes the rest in-process. The cursor is
stored before the runs execute, as the daemon commits it with the runs it submits: a tick killed
mid-run must not leave the next one asking for the same run keys again.

Every in-process run beats (`runstate.defs.runs.heartbeat`) and carries a `dagster/max_runtime`, so a
run whose process is killed is ended by whoever looks next, like a daemon run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg
from dagster import DagsterInstance, RunsFilter
from dagster._core.execution.resources_init import get_transitive_required_resource_keys
from dagster._core.utils import make_new_run_id

from runstate.commands.instance import default_instance
from runstate.config import settings
from runstate.defs.runs.heartbeat import heartbeat
from runstate.defs.tags import MAX_RUNTIME_TAG, SPARK_POOL

CURSOR_KEY = "runstate.tick_cursor.{}"
# The backstop for an in-process run that beats but never ends (a hung worker): run monitoring fails it.
IN_PROCESS_MAX_RUNTIME_S = 4 * 3600
# How often an in-process run with a Spark step frees the pool slots of dead holders (spark_pool_sensor: 15).
SPARK_POOL_SWEEP_S = 5.0
log = logging.getLogger(__name__)


@dataclass
class TickResult:
    requested: int = 0
    skipped_run_keys: list[str] = field(default_factory=list)
    results: list[dg.ExecuteInProcessResult] = field(default_factory=list)
    skip_reason: str | None = None

    @property
    def succeeded(self) -> int:
        return sum(1 for r in self.results if r.success)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.success)


def default_defs() -> dg.Definitions:
    """The code location for in-process runs, built now so its resources follow the current settings."""
    from runstate.defs.location import build_definitions  # the whole code location: only when asked

    return build_definitions(in_process_runs=True)


def _run_key_taken(instance: DagsterInstance, origin_tag: str, origin: str, run_key: str) -> bool:
    runs = instance.get_runs(
        filters=RunsFilter(tags={"dagster/run_key": run_key, origin_tag: origin}), limit=1
    )
    return bool(runs)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) reached this process while it executed a run. Dagster's own handler took the
    signal and ended the run (failed, by runstate/defs/runs/interrupts.py) instead of raising, so a
    caller looping over shards went on to the next one: this stops it, as a KeyboardInterrupt would."""

    def __init__(self, result: dg.ExecuteInProcessResult) -> None:
        outcome = "succeeded" if result.success else "failed"
        super().__init__(f"{result.job_def.name} run {result.run_id} {outcome}; nothing after it was started")
        self.result = result


@contextmanager
def _spark_pool_kept(instance: DagsterInstance, job: dg.JobDefinition) -> Iterator[None]:
    """While a run with a Spark step executes, sweep the Spark pool every few seconds, as the daemon's
    spark_pool_sensor does: a CLI-only setup has no daemon, and a step waiting for a slot that a killed
    command still holds would wait for ever. A slot is freed once its holder is found dead."""
    if not any(op.pool == SPARK_POOL for op in job.graph.iterate_op_defs()):
        yield
        return
    from runstate.defs.instance.pools import sweep_spark_pool

    done = threading.Event()

    def keep() -> None:
        while True:
            try:
                sweep_spark_pool(instance, settings().spark_sessions)
            except Exception as error:  # noqa: BLE001 - a missed sweep is retried; the run must go on
                log.warning("Spark pool not swept: %s", error)
            if done.wait(SPARK_POOL_SWEEP_S):
                return

    keeper = threading.Thread(target=keep, name="spark-pool-keeper", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join(timeout=10)


@contextmanager
def _signals_seen() -> Iterator[Callable[[], bool]]:
    """Whether SIGINT or SIGTERM reached this process inside the block, whichever handler took it: the
    interpreter writes each signal's number to its wakeup fd before any Python handler runs."""
    if threading.current_thread() is not threading.main_thread():  # only there do signals arrive
        yield lambda: False
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield lambda: bool({signal.SIGINT, signal.SIGTERM} & set(_drained(read_end)))
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)


def _drained(fd: int) -> bytes:
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 512):
            data += chunk
    return data


def execute_run(
    job: dg.JobDefinition,
    instance: DagsterInstance,
    *,
    run_config: dict | None = None,
    tags: dict[str, str] | None = None,
    partition_key: str | None = None,
    run_id: str | None = None,
) -> dg.ExecuteInProcessResult:
    """Execute `job` in this process as one run that beats while it executes and has a max runtime
    (`run_id`: the id it is known by beforehand, e.g. to name it in a lock's holder).

    RunInterrupted when Ctrl-C or SIGTERM came while it executed: the caller runs nothing after it."""
    run_id = run_id or make_new_run_id()
    tags = {MAX_RUNTIME_TAG: str(IN_PROCESS_MAX_RUNTIME_S), **(tags or {})}
    with (
        heartbeat(instance, run_id, ends_run=True),
        _spark_pool_kept(instance, job),
        _signals_seen() as interrupted,
    ):
        result = job.execute_in_process(
            run_config=run_config,
            instance=instance,
            tags=tags,
            partition_key=partition_key,
            run_id=run_id,
            raise_on_error=False,
        )
        if interrupted():
            raise RunInterrupted(result)
    return result


def _execute(
    defs: dg.Definitions,
    instance: DagsterInstance,
    requests: list[dg.RunRequest],
    default_job: str | None,
    origin_tag: str,
    origin: str,
    result: TickResult,
    run_log_level: str | None = None,
) -> None:
    for request in requests:
        result.requested += 1
        if request.run_key and _run_key_taken(instance, origin_tag, origin, request.run_key):
            result.skipped_run_keys.append(request.run_key)
            continue
        job = defs.resolve_job_def(request.job_name or default_job)
        tags = {**(request.tags or {}), origin_tag: origin}
        if request.run_key:
            tags["dagster/run_key"] = request.run_key
        run_config = dict(request.run_config or {})
        if run_log_level:
            run_config["loggers"] = {"console": {"config": {"log_level": run_log_level}}}
        result.results.append(
            execute_run(job, instance, run_config=run_config, tags=tags, partition_key=request.partition_key)
        )


def _apply_dynamic_partitions_requests(instance: DagsterInstance, requests: list) -> None:
    """As the daemon does before launching: add (or delete) the dynamic partitions a sensor asked for."""
    for request in requests:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        elif isinstance(request, dg.DeleteDynamicPartitionsRequest):
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)


def tick_sensor(
    sensor_name: str,
    *,
    defs: dg.Definitions | None = None,
    instance: DagsterInstance | None = None,
    run_log_level: str | None = None,
) -> TickResult:
    defs = defs or default_defs()
    instance = instance or default_instance()
    sensor = defs.resolve_sensor_def(sensor_name)
    key = CURSOR_KEY.format(sensor_name)
    cursor = instance.run_storage.get_cursor_values({key}).get(key)
    # definitions= lets a sensor yield partitioned run requests (dagster resolves the job from them).
    with dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        sensor_name=sensor_name,
        resources=_required_resources(defs, sensor.required_resource_keys),
        definitions=defs,
    ) as ctx:
        data = sensor.evaluate_tick(ctx)
    result = TickResult(skip_reason=str(data.skip_message) if data.skip_message else None)
    _apply_dynamic_partitions_requests(
        instance, list(getattr(data, "dynamic_partitions_requests", None) or [])
    )
    if data.cursor is not None:
        instance.run_storage.set_cursor_values({key: data.cursor})
    default_job = sensor.job_name if sensor.has_jobs else None
    _execute(
        defs,
        instance,
        list(data.run_requests or []),
        default_job,
        "dagster/sensor_name",
        sensor_name,
        result,
        run_log_level,
    )
    return result


def _required_resources(defs: dg.Definitions, keys: set[str]) -> dict:
    """The resources a sensor or schedule requires, with those they require: what the daemon's code
    server builds for a tick. Building every resource of the definitions cost 35 to 50 ms of CPU more
    a tick (Dagster infers each resource class's config schema again at each build)."""
    resources = defs.get_repository_def().get_top_level_resources()
    needed = get_transitive_required_resource_keys(keys, resources)
    return {key: resource for key, resource in (defs.resources or {}).items() if key in needed}


def tick_schedule(
    schedule_name: str,
    *,
    defs: dg.Definitions | None = None,
    instance: DagsterInstance | None = None,
    at: datetime | None = None,
    run_log_level: str | None = None,
) -> TickResult:
    defs = defs or default_defs()
    instance = instance or default_instance()
    schedule = defs.resolve_schedule_def(schedule_name)
    when = at or datetime.now(UTC)
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        resources=_required_resources(defs, schedule.required_resource_keys),
    ) as ctx:
        data = schedule.evaluate_tick(ctx)
    result = TickResult(skip_reason=str(data.skip_message) if data.skip_message else None)
    _execute(
        defs,
        instance,
        list(data.run_requests or []),
        schedule.job_name,
        "dagster/schedule_name",
        schedule_name,
        result,
        run_log_level,
    )
    return result
