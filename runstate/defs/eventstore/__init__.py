"""Dagster definitions for the eventstore domain."""

import dagster as dg

defs = dg.Definitions()
