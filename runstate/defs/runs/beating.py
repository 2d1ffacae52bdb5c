"""Where heartbeats are written and read inside Dagster: an executor wrapper and a run launcher.

- `beating(executor_def)`: the same executor, plus a heartbeat for the whole run, written from the run
  worker's own process while its steps execute (whatever the job and its ops), and the zombie fence
  around them (`runstate.defs.runs.heartbeat`); a run with a Spark step first makes sure the Spark pool
  has its limit (`runstate.defs.instance.pools`), so the cap holds from the first run of any instance.
- `HeartbeatRunLauncher`: Dagster's DefaultRunLauncher, which launches nothing differently but answers
  `check_run_worker_health` from the run's liveness. The default launcher has no such check, so run
  monitoring could only fail a run whose worker vanished at its `dagster/max_runtime`; with it, the
  daemon's monitoring (every `poll_interval_seconds`) fails such a run within seconds too. Under
  `runstate dev` it also launches nothing once the deployment has begun to stop.

CLI in-process runs beat through `runstate.commands.ticking` (execute_in_process replaces the executor).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.executor.base import Executor
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, LaunchRunContext, WorkerStatus

from runstate.config import ConfigError, settings
from runstate.defs.pool import bound_spark_pool
from runstate.defs.runs.heartbeat import heartbeat
from runstate.defs.runs.liveness import LivenessPolicy, end_worker, judge, observe
from runstate.defs.tags import SPARK_POOL
from runstate.services.dev import STOPPING_FILE_ENV


class HeartbeatExecutor(Executor):
    """Runs the wrapped executor while a daemon thread beats for the run, fenced at both ends."""

    def __init__(self, inner: Executor):
        self._inner = inner

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        # The worker reports the run's end after the executor returns: the last beat covers that moment.
        with heartbeat(plan_context.instance, plan_context.run_id, ends_run=False, worker=True) as beating:
            if beating is not None:  # a run reaped while it launched does nothing
                beating.check(full=True)
            if any(step.pool == SPARK_POOL for step in execution_plan.steps):
                bound_spark_pool(plan_context.instance, settings().spark_sessions)
            yield from self._inner.execute(plan_context, execution_plan)
            if beating is not None:  # the worker writes the run's success next: not after its failure
                beating.check()

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
    """DefaultRunLauncher whose run-worker health check reads the run's liveness."""

    def launch_run(self, context: LaunchRunContext) -> None:
        stopping = os.environ.get(STOPPING_FILE_ENV)
        if stopping and os.path.exists(stopping):
            # A run launched now would start in a deployment that is going away, and be killed before it
            # records its end; failed at launch, its work is requested again after the restart.
            raise DagsterLaunchFailedError(
                "not launched: the deployment is stopping (runstate dev was told to stop)"
            )
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        record = self._instance.get_run_record_by_id(run.run_id)
        if record is None:
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"run {run.run_id} not found")
        try:
            policy = LivenessPolicy.from_settings()
        except ConfigError as error:  # the daemon's environment, not the run's: say so, judge nothing
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, str(error))
        signs = observe(self._instance, [record], policy).get(run.run_id)
        verdict = judge(record, signs, policy) if signs is not None else None
        if verdict is None or verdict.alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, verdict.describe() if verdict else "")
        # The monitor fails the run (freeing its slots) on this answer: its processes end first.
        ended = end_worker(self._instance, run.run_id)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"{verdict.describe()}: {verdict.reason}{ended}")
