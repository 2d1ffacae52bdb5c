"""Dagster definitions about the deployment's own runs: recorded in the run state store, and ended when dead."""

import dagster as dg

from runstate.defs.runs.sensors import run_liveness, run_recorder

defs = dg.Definitions(sensors=[run_recorder, run_liveness])
