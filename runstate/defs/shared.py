"""Resources every domain shares (today: the Spark session), built by `runstate.defs.resources`."""

from __future__ import annotations

import dagster as dg

from runstate.defs.resources import spark_resource


def shared_definitions() -> dg.Definitions:
    return dg.Definitions(resources={"spark": spark_resource()})
