"""The Spark session resource shared by the domains."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from runstate.spark import SparkSettings, build_session


class SparkResource(dg.ConfigurableResource):
    """A lazily built SparkSession with the Iceberg runtime and the `lake` catalog."""

    master: str = "local[2]"
    pg_url: str = "postgresql://postgres@127.0.0.1:5432/runstate"
    catalog_kind: str = "jdbc"
    warehouse_dir: str = ".runstate/warehouse"
    extra_conf_json: str = "{}"

    _session = PrivateAttr(default=None)

    def spark_settings(self) -> SparkSettings:
        return SparkSettings(
            master=self.master,
            pg_url=self.pg_url,
            catalog_kind=self.catalog_kind,
            warehouse_dir=Path(self.warehouse_dir),
            extra_conf=json.loads(self.extra_conf_json),
        )

    def get_session(self):
        if self._session is None:
            self._session = build_session(self.spark_settings())
        return self._session
