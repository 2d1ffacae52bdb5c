"""Dagster definitions that make the deployment record its own runs in the run state store."""

import dagster as dg

from runstate.defs.runs.sensors import run_recorder

defs = dg.Definitions(sensors=[run_recorder])
