"""The child process of the zombie-fence tests (`python -m runstate_tests.defs.fence_child MODE HOME RUN_ID`).

- `beat`: beat for RUN_ID on the instance at HOME, print BEATING, then work forever (until its fence
  stops it);
- `execute`: execute RUN_ID (a run of `marking_job`) as a run worker does; its op writes a marker file
  next to HOME if it ever runs;
- `fail`: execute `failing_job` in-process as RUN_ID while beating for it, as the CLI does, then check the
  fence once more (the run is FAILURE by its own hand), and print ALIVE.
"""

import sys
import time
from pathlib import Path

import dagster as dg
from dagster._core.execution.api import execute_run

from runstate.defs.runs.beating import beating
from runstate.defs.runs.heartbeat import heartbeat


@dg.op
def mark(context: dg.OpExecutionContext) -> None:
    (Path(context.instance.root_directory) / f"ran-{context.run_id}").write_text("ran")


@dg.job(executor_def=beating(dg.in_process_executor))
def marking_job() -> None:
    mark()


@dg.op
def fail() -> None:
    raise RuntimeError("this run fails by itself")


@dg.job
def failing_job() -> None:
    fail()


def main(mode: str, home: str, run_id: str) -> None:
    with dg.DagsterInstance.from_config(home) as instance:
        if mode == "beat":
            with heartbeat(instance, run_id, ends_run=False):
                print("BEATING", flush=True)
                while True:
                    time.sleep(0.05)
        if mode == "fail":
            with heartbeat(instance, run_id, ends_run=True) as beating_run:
                failing_job.execute_in_process(instance=instance, run_id=run_id, raise_on_error=False)
                beating_run.check()
            print("ALIVE", flush=True)
            return
        run = instance.get_run_by_id(run_id)
        execute_run(dg.reconstructable(marking_job), run, instance)  # as `dagster api execute_run` does
        print("RETURNED", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
