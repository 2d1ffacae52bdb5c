"""The `spark` resource every domain shares: dagster-pyspark's LazyPySparkResource.

The session is built on first use of `.spark_session` (a run that never touches Spark never starts
a JVM). Its `spark_config` comes from `runstate.spark.spark_config`, the one mapping from settings
to Spark, so the resource, the CLI, the tests and the benchmarks configure the same session.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster_pyspark import LazyPySparkResource

from runstate.spark import SparkSettings, spark_config, use_this_python_for_tasks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SETTINGS_FIELDS = (
    "master",
    "pg_url",
    "catalog_kind",
    "warehouse_dir",
    "extra_conf",
    "app_name",
    "driver_host",
)


class SparkResource(LazyPySparkResource):
    """A lazily built SparkSession with the Iceberg runtime and the `lake` catalog.

    `SparkResource(spark_config={...})` takes a ready configuration; `SparkResource(master=...,
    pg_url=..., warehouse_dir=...)` is shorthand for `from_settings(SparkSettings(...))`.
    """

    def __init__(self, **fields: Any) -> None:
        shorthand = {name: fields.pop(name) for name in SETTINGS_FIELDS if name in fields}
        if shorthand:
            if "warehouse_dir" in shorthand:
                shorthand["warehouse_dir"] = Path(shorthand["warehouse_dir"])
            fields["spark_config"] = spark_config(SparkSettings(**shorthand))
        super().__init__(**fields)

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> SparkResource:
        return cls(spark_config=spark_config(settings))

    def _init_session(self) -> None:
        use_this_python_for_tasks()
        super()._init_session()

    def get_session(self) -> SparkSession:
        """The session (built on first call); the name the domains' ops use."""
        return self.spark_session
