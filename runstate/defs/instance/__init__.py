"""Dagster definitions for this code location's place in its Dagster instance: the Spark pool's upkeep
(`spark_pool_sensor`) and the check of the instance settings runstate relies on (`runstate_instance_check`)."""

import dagster as dg

from runstate.defs.instance.checks import runstate_instance_check
from runstate.defs.instance.pools import spark_pool_sensor

defs = dg.Definitions(sensors=[spark_pool_sensor, runstate_instance_check])
