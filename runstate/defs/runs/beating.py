"""Where heartbeats are written and read inside Dagster: an executor wrapper and a run launcher.

- `beating(executor_def)`: the same executor, plus a heartbeat for the whole run, written from the run
  worker's own process while its steps execute (whatever the job and its ops).
- `HeartbeatRunLauncher`: Dagster's DefaultRunLauncher, which launches nothing differently but answers
  `check_run_worker_health` from the heartbeat. The default launcher has no such check, so run
  monitoring could only fail a run whose worker vanished at its `dagster/max_runtime`; with it, the
  daemon's monitoring (every `poll_interval_seconds`) fails such a run within seconds too.

CLI in-process runs beat through `runstate.defs.ticking` (execute_in_process replaces the executor).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.executor.base import Executor
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus

from runstate.defs.runs.liveness import LivenessPolicy, heartbeat, judge, last_beats


class HeartbeatExecutor(Executor):
    """Runs the wrapped executor while a daemon thread beats for the run."""

    def __init__(self, inner: Executor):
        self._inner = inner

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        # The worker reports the run's end after the executor returns: the last beat covers that moment.
        with heartbeat(plan_context.instance, plan_context.run_id, ends_run=False):
            yield from self._inner.execute(plan_context, execution_plan)

    @property
    def retries(self) -> Any:
        return self._inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self._inner.step_dependency_config


def beating(inner: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """`inner` with the same name, config and requirements, whose runs beat."""
    create = inner.executor_creation_fn
    if create is None:
        raise ValueError(f"executor {inner.name!r} has no creation function to wrap")
    return dg.ExecutorDefinition(
        name=inner.name,
        config_schema=inner.config_schema,
        requirements=inner.get_requirements,
        executor_creation_fn=lambda init_context: HeartbeatExecutor(create(init_context)),
        description=f"{inner.description or inner.name}, with a run heartbeat (runstate liveness).",
    )


class HeartbeatRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose run-worker health check reads the run's heartbeat."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        record = self._instance.get_run_record_by_id(run.run_id)
        if record is None:
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"run {run.run_id} not found")
        last = last_beats(self._instance, [run.run_id]).get(run.run_id)
        verdict = judge(record, last, time.time(), LivenessPolicy.from_env())
        status = WorkerStatus.RUNNING if verdict.alive else WorkerStatus.FAILED
        return CheckRunHealthResult(status, verdict.describe())
