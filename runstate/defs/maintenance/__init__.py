"""Dagster definitions for the maintenance domain."""

import dagster as dg

defs = dg.Definitions()
