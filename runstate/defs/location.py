"""The code location: per-domain definitions merged into one. `runstate.definitions` (the entry point
that workspace.yaml and `dagster dev -m` load) builds it with the settings; `runstate.commands` builds it
for in-process runs."""

import dagster as dg

from runstate.defs import automation, dataset_tables, eventstore, instance, maintenance, runs, wal
from runstate.defs.resources import wal_resource
from runstate.defs.runs.beating import beating
from runstate.defs.shared import shared_definitions


def build_definitions(in_process_runs: bool = False) -> dg.Definitions:
    """The whole code location, its resources built from the settings as they are now.

    `in_process_runs` is for the CLI's ticks and the demo, which execute runs one after another in their
    own process: there a flush run saves no process start by lingering (or by holding its shard), and
    would only hold up the next;
    and the run interval, which spaces the run processes the daemon starts per shard, would only make the
    next tick wait (one live run per shard still holds).
    """
    wal_overrides = (
        {"flush_linger_s": 0, "min_run_interval_s": 0, "flush_always_on": False} if in_process_runs else {}
    )
    return dataset_tables.link_to_maintenance(
        dg.Definitions.merge(
            shared_definitions(),
            eventstore.build_defs(),
            eventstore.build_history_defs(),
            wal.build_defs(wal_resource(**wal_overrides)),
            dataset_tables.build_defs(),
            maintenance.build_defs(),
            runs.defs,
            instance.defs,
            automation.defs,
            # Every run of a job without an executor of its own beats (runstate.defs.runs.liveness), and
            # runs its ops in the run's own process: each job is one op or a short chain whose parallelism
            # lives inside its ops (thread pools, Spark), so a step process per op would only add a second
            # Python start (about 3 s of CPU loading the code location) to every run, sweeps every 5 min
            # included.
            dg.Definitions(executor=beating(dg.in_process_executor)),
        )
    )
