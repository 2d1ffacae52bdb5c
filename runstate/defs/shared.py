"""Resources every domain shares, built from the runstate Settings."""

from __future__ import annotations

import json

import dagster as dg

from runstate.config import settings
from runstate.defs.spark import SparkResource


def spark_resource() -> SparkResource:
    s = settings()
    return SparkResource(
        master=s.spark_master,
        pg_url=s.pg_url,
        catalog_kind=s.iceberg_catalog,
        warehouse_dir=str(s.warehouse_dir),
        extra_conf_json=json.dumps(dict(s.spark_conf)),
    )


def shared_definitions() -> dg.Definitions:
    return dg.Definitions(resources={"spark": spark_resource()})
