"""Tick the maintenance queue sensor now (`runstate maintenance tick`): its worker runs in-process."""

from __future__ import annotations

import dagster as dg

from runstate.commands.ticking import TickResult, tick_sensor
from runstate.defs.maintenance import build_defs
from runstate.defs.shared import shared_definitions

SENSOR_NAME = "maintenance_queue_sensor"


def tick_maintenance() -> TickResult:
    """One tick of maintenance_queue_sensor on the maintenance definitions alone (no WAL, no dataset
    tables: the queue's worker runs need nothing else), built now, not at import, so the resources
    follow the current settings (RUNSTATE_* variables)."""
    defs = dg.Definitions.merge(shared_definitions(), build_defs())
    return tick_sensor(SENSOR_NAME, defs=defs)
