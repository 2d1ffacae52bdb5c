"""Dagster definitions for the runs domain."""

import dagster as dg

defs = dg.Definitions()
