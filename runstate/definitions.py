"""The code location: per-domain definitions merged into one. The only Dagster entry point."""

import dagster as dg

from runstate.defs import datasets, eventstore, maintenance, runs, wal
from runstate.defs.shared import shared_definitions


def build_definitions() -> dg.Definitions:
    """The whole code location, its resources built from the settings as they are now."""
    return datasets.link_to_maintenance(
        dg.Definitions.merge(
            shared_definitions(),
            eventstore.build_defs(),
            wal.build_defs(),
            datasets.build_defs(),
            maintenance.build_defs(),
            runs.defs,
        )
    )


defs = build_definitions()
