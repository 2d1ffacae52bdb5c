"""Dagster definitions for the wal domain."""

import dagster as dg

defs = dg.Definitions()
