"""A stopping run worker ends its run: an interrupt is not a fault to retry.

Dagster applies an op's retry policy to interrupts too: the SIGTERM that a run worker gets when the
deployment stops (a deploy, a reboot, `runstate dev` stopped) raises DagsterExecutionInterruptedError in
the op, and with a policy the step is re-executed in the same dying process, so the worker went on
flushing, merging or claiming work for as long as it was let live, and often died before it recorded
its run's end. `ends_run_when_interrupted` turns the interrupt into a Failure that bypasses the policy:
the worker records the run failed and exits, and after a restart the daemon's run retries (or the next
sensor tick) start the work again, which every write path makes safe to repeat.

An op blocked in Spark (a py4j call) does not see the interrupt until the JVM answers:
`runstate.spark_interrupts.spark_jobs_cancelled_on_interrupt` cancels its Spark jobs when the signal
comes, and its `check()` raises the KeyboardInterrupt that `ends_run_when_interrupted` turns into the
run's end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError

ComputeFn = TypeVar("ComputeFn", bound=Callable[..., Any])
INTERRUPTED = (
    "interrupted by a signal (the deployment is stopping): the run ends here, not retried in this "
    "process; its work is idempotent and is taken up again after the restart"
)


def ends_run_when_interrupted(compute_fn: ComputeFn) -> ComputeFn:
    """Wrap an op's or asset's compute function (under its decorator) so an interrupt fails it at once."""

    @functools.wraps(compute_fn)
    def compute(*args: Any, **kwargs: Any) -> Any:
        try:
            return compute_fn(*args, **kwargs)
        except (DagsterExecutionInterruptedError, KeyboardInterrupt) as interrupt:
            raise dg.Failure(description=INTERRUPTED, allow_retries=False) from interrupt

    return compute  # type: ignore[return-value]
