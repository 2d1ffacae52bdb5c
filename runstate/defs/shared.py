"""Resources every domain shares, built from the runstate Settings."""

from __future__ import annotations

import dagster as dg

from runstate.defs.spark import SparkResource
from runstate.spark import settings_from_runstate


def spark_resource() -> SparkResource:
    """dagster-pyspark's lazy session, configured from RUNSTATE_SPARK_MASTER / RUNSTATE_SPARK_CONF."""
    return SparkResource.from_settings(settings_from_runstate())


def shared_definitions() -> dg.Definitions:
    return dg.Definitions(resources={"spark": spark_resource()})
