"""The code location: per-domain definitions merged into one. The only Dagster entry point."""

import dagster as dg

from runstate.defs import datasets, eventstore, maintenance, runs, wal
from runstate.defs.shared import shared_definitions

defs = datasets.link_to_maintenance(
    dg.Definitions.merge(
        shared_definitions(),
        eventstore.defs,
        wal.defs,
        datasets.defs,
        maintenance.defs,
        runs.defs,
    )
)
