"""`runstate dev` on the project's own dagster.yaml: the instance check finds nothing missing, the Spark pool
has its limit from `services up`, the freshness daemon evaluates the assets' policies and the AutomationConditions'
sensor runs."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.defs.pool import spark_pool_limit
from runstate_tests.support.deployment import Deployment
from runstate_tests.support.devserver import poll

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(1200)]

TICKS_S = 400  # the daemon's first pass, on a loaded machine
SENSOR = """query($name: String!) { sensorOrError(sensorSelector: {repositoryLocationName: "runstate",
  repositoryName: "__repository__", sensorName: $name}) { __typename ... on Sensor { sensorState { status
  ticks(limit: 1) { status skipReason } } } } }"""
FRESHNESS = """query($path: [String!]!) { assetNodes(assetKeys: [{path: $path}]) {
  freshnessStatusInfo { freshnessStatus } } }"""


def latest_tick(deployment: Deployment, name: str) -> dict | None:
    """The sensor's latest finished tick. A tick is recorded as it starts (STARTED, no skip reason yet); a
    tick without a skip reason, most likely one in progress, failed the test once on a loaded machine."""
    found = deployment.graphql(SENSOR, {"name": name})["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    ticks = found["sensorState"]["ticks"]
    return ticks[0] if ticks and ticks[0]["status"] != "STARTED" else None


def test_the_projects_instance_lacks_nothing_and_has_the_spark_pool_limit(
    deployment: Deployment, monkeypatch
):
    monkeypatch.setenv("DAGSTER_PG_URL", deployment.env["DAGSTER_PG_URL"])
    tick = poll(lambda: latest_tick(deployment, "runstate_instance_check"), timeout=TICKS_S, what="a check")

    assert tick["skipReason"] == "this Dagster instance has every setting runstate relies on", tick
    with dg.DagsterInstance.from_config(deployment.env["DAGSTER_HOME"]) as instance:
        assert (
            spark_pool_limit(instance) == 2
        )  # RUNSTATE_SPARK_SESSIONS, set by `runstate dev`'s `services up`


def test_freshness_and_automation_are_evaluated_by_the_daemon(deployment: Deployment, monkeypatch):
    monkeypatch.setenv("DAGSTER_PG_URL", deployment.env["DAGSTER_PG_URL"])
    with dg.DagsterInstance.from_config(deployment.env["DAGSTER_HOME"]) as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("table_inventory"))

    def fresh() -> str | None:
        nodes = deployment.graphql(FRESHNESS, {"path": ["table_inventory"]})["assetNodes"]
        status = nodes[0]["freshnessStatusInfo"]["freshnessStatus"]
        return status if status == "HEALTHY" else None

    assert poll(fresh, timeout=TICKS_S, every=5, what="table_inventory's freshness") == "HEALTHY"
    assert poll(
        lambda: latest_tick(deployment, "runstate_automation"), timeout=TICKS_S, what="an automation tick"
    )
