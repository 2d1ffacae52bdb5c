"""The run history through `runstate dev`: events appended from the CLI reach the lake by the daemon's
run_history_sensor and the export run it launches, within the freshness bound, and read back as fetch
gives them (through pyiceberg: no JVM in the test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from runstate.eventstore.lake import HistoryCatalog, LakeRunReader
from runstate_tests.support.deployment import Deployment
from runstate_tests.support.devserver import poll

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

# The bound the run history promises (RUNSTATE_HISTORY_MAX_LAG_MINUTES, 10 by default): the sensor's
# timer, a free Spark slot, a run worker and its JVM, and the export itself, on a loaded machine.
HISTORY_DEADLINE_S = 600


def runs_row(catalog: HistoryCatalog, run_id: str) -> dict | None:
    from pyiceberg.expressions import EqualTo

    table = catalog.load("runstate", "runs")
    if table is None:
        return None
    rows = table.scan(row_filter=EqualTo("run_id", run_id)).to_arrow().to_pylist()
    return rows[0] if rows else None


SENSOR_STATE = """query($name: String!) { sensorOrError(sensorSelector: {repositoryLocationName: "runstate",
  repositoryName: "__repository__", sensorName: $name}) { ... on Sensor { sensorState { id status } } } }"""
STOP_SENSOR = """mutation($id: String!) { stopSensor(id: $id) { __typename
  ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } } }"""


@pytest.fixture
def stopped_after(deployment: Deployment) -> Iterator[None]:
    """After the test, run_history_sensor stopped as the UI's Stop button does. This test runs first on
    the shared deployment (conftest.py), whose other tests are not about exports: a running sensor would
    start an export JVM in each minute in which another of their runs ran."""
    yield
    state = deployment.graphql(SENSOR_STATE, {"name": "run_history_sensor"})["sensorOrError"]["sensorState"]
    stopped = deployment.graphql(STOP_SENSOR, {"id": state["id"]})["stopSensor"]
    assert stopped.get("instigationState", {}).get("status") == "STOPPED", stopped


def test_appended_events_reach_the_lake_within_the_bound(deployment: Deployment, stopped_after: None):
    run_id = f"hist-{uuid.uuid4().hex[:8]}"
    for args in (
        ("--type", "RunStarted"),
        ("--type", "StepStarted", "--step", "extract"),
        ("--type", "StepFailed", "--step", "extract", "--data", '{"error": "boom"}'),
        ("--type", "RunFailed"),
    ):
        deployment.cli("events", "append", "--run-id", run_id, *args)
    events = deployment.event_store().fetch(run_id)
    catalog = HistoryCatalog(deployment.pg_url, deployment.home / ".runstate" / "warehouse")
    reader = LakeRunReader(catalog)

    def caught_up() -> dict | None:
        """The run's row of `runs` once both tables have every event. An export commits the events, then
        merges `runs` in a second commit: between the two, run_events can be whole while `runs` still
        holds the run as an earlier export left it."""
        if len(reader.read_run(run_id)) != len(events):
            return None
        row = runs_row(catalog, run_id)
        return row if row is not None and row["last_seq"] == events[-1].run_seq else None

    try:
        row = poll(caught_up, timeout=HISTORY_DEADLINE_S, every=3, what=f"run {run_id} in the lake")
        lake_events = reader.read_run(run_id)
    finally:
        catalog.close()

    assert lake_events == events
    assert (row["status"], row["event_count"], row["failed_steps"], row["last_seq"]) == (
        "FAILED",
        4,
        ["extract"],
        4,
    )
