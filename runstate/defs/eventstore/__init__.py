"""Dagster definitions for the eventstore domain: the event store resource, append/archive jobs,
the run_snapshots asset (daily partitions by run start day), its sensor and the archival schedule."""

import dagster as dg

from runstate.defs.eventstore.assets import run_events, run_snapshots, run_snapshots_job
from runstate.defs.eventstore.history import build_history_defs as build_history_defs
from runstate.defs.eventstore.jobs import append_events, archive_events
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.eventstore.schedules import archive_events_schedule
from runstate.defs.eventstore.sensors import run_snapshots_sensor
from runstate.defs.resources import event_store_resource


def build_defs(event_store: EventStoreResource | None = None) -> dg.Definitions:
    """The eventstore domain; tests pass an EventStoreResource of their own database."""
    return dg.Definitions(
        assets=[run_events, run_snapshots],
        jobs=[append_events, archive_events, run_snapshots_job],
        schedules=[archive_events_schedule],
        sensors=[run_snapshots_sensor],
        resources={"event_store": event_store or event_store_resource()},
    )


defs = build_defs()
