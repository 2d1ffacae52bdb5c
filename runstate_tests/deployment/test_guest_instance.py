"""runstate as a guest: plain `dagster dev -m runstate.definitions` on a dagster.yaml that holds only Postgres
storage, as a platform team's instance might. Nothing of the project's dagster.yaml is there, and
`runstate db upgrade --skip-dagster` migrates runstate's own schema without touching the instance.

- `spark_pool_sensor` gives the pool runstate_spark its limit (RUNSTATE_SPARK_SESSIONS=1 here).
- Real `table_inventory_job` runs, more than the limit: while the pool is closed (limit 0) the run queue holds
  them all; once it opens they are all ready at once, yet no more JVMs than the limit are alive at once
  (sampled from the processes under the deployment) and every run succeeds.
- `runstate_instance_check` names the missing settings on its tick (the UI) and in the daemon's log.
- The freshness daemon evaluates table_inventory's FreshnessPolicy, and `runstate_automation` (the
  AutomationConditions' sensor) ticks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest

from runstate.defs.pool import spark_pool_limit
from runstate.defs.tags import SPARK_POOL
from runstate_tests.defs.instance_homes import storage_only_config, write_home
from runstate_tests.deployment.sampling import spark_jvms
from runstate_tests.support.databases import create_database, drop_database, unique
from runstate_tests.support.deployment import HOURLY_EXPORTS
from runstate_tests.support.deployment import stop_dev as _stop
from runstate_tests.support.devserver import RUNSTATE, free_port, graphql, poll, wait_for_graphql

# In the deployment group: one deployment on these two cores at a time (its run workers and JVMs beside
# another deployment's slowed both past their deadlines' margins). Each wait has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

DAGSTER = str(Path(sys.executable).parent / "dagster")
STRIPPED = ("RUNSTATE_", "DAGSTER_", "SNOWFLAKE_")
STARTUP_S = 300
# Three run workers loading the code location on a loaded 2-core machine, then one JVM after another.
RUNS_DEADLINE_S = 900
SPARK_RUNS = 3
SESSIONS = 1
LAUNCH = """mutation($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
RUN_STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
SENSOR_TICKS = """query($location: String!, $name: String!) { sensorOrError(sensorSelector: {
  repositoryLocationName: $location, repositoryName: "__repository__", sensorName: $name}) { __typename
  ... on Sensor { sensorState { status ticks(limit: 5) { status skipReason } } } } }"""
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name
  locationOrLoadError { __typename } } } } }"""
FRESHNESS = """query($path: [String!]!) { assetNodes(assetKeys: [{path: $path}]) {
  freshnessStatusInfo { freshnessStatus } } }"""


@dataclass
class Guest:
    port: int
    home: Path
    log: Path
    dev: subprocess.Popen
    instance: dg.DagsterInstance
    location: str = ""  # `dagster dev -m MODULE` names the code location after the module

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        return graphql(self.port, query, variables)


@pytest.fixture(scope="module")
def guest(moto_endpoint: str) -> Iterator[Guest]:
    home = Path(tempfile.mkdtemp(prefix="runstate-guest-"))
    databases = [unique("rs_guest"), unique("rs_guest_dagster")]
    pg_url, dagster_url = (create_database(name) for name in databases)
    write_home(home, storage_only_config(dagster_url))
    suffix = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED)}
    env.update(
        RUNSTATE_HOME=str(home),
        DAGSTER_HOME=str(home),
        RUNSTATE_PG_URL=pg_url,
        RUNSTATE_AWS_ENDPOINT_URL=moto_endpoint,
        RUNSTATE_WAL_TABLE=f"guest_wal_{suffix}",
        RUNSTATE_BLOB_BUCKET=f"guest-blobs-{suffix}",
        RUNSTATE_SPARK_SESSIONS=str(SESSIONS),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        DAGSTER_TELEMETRY_ENABLED="false",
        **HOURLY_EXPORTS,  # only the Spark runs this module launches take the pool
    )
    upgrade = subprocess.run(
        [RUNSTATE, "db", "upgrade", "--skip-dagster"], env=env, capture_output=True, text=True, timeout=300
    )
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]
    port, log = free_port(), home / "dagster-dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen(
            [DAGSTER, "dev", "-h", "127.0.0.1", "-p", str(port), "-m", "runstate.definitions"],
            cwd=home,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert wait_for_graphql(port, dev, timeout=STARTUP_S), log.read_text(errors="replace")[-3000:]
        guest = Guest(port, home, log, dev, instance)
        guest.location = poll(lambda: _loaded_location(guest), timeout=STARTUP_S, what="the code location")
        poll(lambda: _sensor(guest, "spark_pool_sensor")["ticks"], timeout=STARTUP_S, what="the sensors tick")
        yield guest
    finally:
        instance.dispose()
        _stop(dev)
        for name in databases:
            drop_database(name)
        shutil.rmtree(home, ignore_errors=True)


def _loaded_location(guest: Guest) -> str | None:
    entries = guest.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
    loaded = [
        e["name"]
        for e in entries
        if (e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"
    ]
    return loaded[0] if loaded else None


def _sensor(guest: Guest, name: str) -> dict:
    found = guest.graphql(SENSOR_TICKS, {"location": guest.location, "name": name})["sensorOrError"]
    assert "sensorState" in found, found  # the sensor exists in the loaded code location
    return found["sensorState"]


@dataclass
class Samples:
    """What a sampler saw every 0.2 s: the live JVMs (pids) and the pool's claimed slots."""

    jvms: list[set[int]] = field(default_factory=list)
    claimed: list[int] = field(default_factory=list)


def sample_until(guest: Guest, done: threading.Event, samples: Samples) -> None:
    while not done.is_set():
        info = guest.instance.event_log_storage.get_concurrency_info(SPARK_POOL)
        samples.claimed.append(len(info.claimed_slots))
        samples.jvms.append(spark_jvms(guest.dev.pid))
        time.sleep(0.2)


def launch_inventory(guest: Guest) -> str:
    selector = {
        "repositoryLocationName": guest.location,
        "repositoryName": "__repository__",
        "pipelineName": "table_inventory_job",
    }
    launched = guest.graphql(LAUNCH, {"params": {"selector": selector, "runConfigData": {}}})
    launched = launched["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def finished(guest: Guest, run_ids: list[str]) -> list[str] | None:
    """The runs' statuses once every one has ended."""
    found = [guest.graphql(RUN_STATUS, {"id": run_id})["runOrError"]["status"] for run_id in run_ids]
    return found if all(status in {"SUCCESS", "FAILURE", "CANCELED"} for status in found) else None


def test_the_pool_sensor_gives_the_spark_pool_its_limit_in_a_storage_only_instance(guest):
    assert poll(lambda: spark_pool_limit(guest.instance), timeout=120, what="the pool's limit") == SESSIONS


def queue_passes(guest: Guest) -> int:
    """How many times the run queue's daemon has looked at the queued runs (it logs each pass)."""
    return guest.log.read_text(errors="replace").count("checking tag concurrency limits for queued runs")


def queued(guest: Guest, run_ids: list[str]) -> bool:
    return all(
        guest.graphql(RUN_STATUS, {"id": run_id})["runOrError"]["status"] == "QUEUED" for run_id in run_ids
    )


def test_more_spark_runs_than_the_limit_never_have_more_jvms_alive_than_the_limit(guest):
    poll(lambda: spark_pool_limit(guest.instance) is not None, timeout=120, what="the pool's limit")
    storage = guest.instance.event_log_storage
    storage.set_concurrency_slots(SPARK_POOL, 0)  # closed, so that every run is ready when it opens
    samples, done = Samples(), threading.Event()
    sampler = threading.Thread(target=sample_until, args=(guest, done, samples), daemon=True)
    sampler.start()
    try:
        run_ids = [launch_inventory(guest) for _ in range(SPARK_RUNS)]
        passes = queue_passes(guest)
        poll(lambda: queue_passes(guest) >= passes + 2, timeout=120, what="two passes of the run queue")
        held_in_queue = queued(guest, run_ids)  # the queue launches no run whose Spark step has no slot
        storage.set_concurrency_slots(SPARK_POOL, SESSIONS)
        final = poll(
            lambda: finished(guest, run_ids),
            timeout=RUNS_DEADLINE_S,
            every=2,
            what="the Spark runs to finish",
        )
    finally:
        done.set()
        sampler.join()

    assert held_in_queue
    assert final == ["SUCCESS"] * SPARK_RUNS, guest.log.read_text(errors="replace")[-3000:]
    assert max(samples.claimed) == SESSIONS
    assert max(len(jvms) for jvms in samples.jvms) == SESSIONS, samples.jvms  # the cap, and it was reached
    assert len(set().union(*samples.jvms)) == SPARK_RUNS  # one JVM in each run, one after another
    assert spark_jvms(guest.dev.pid) == set()


def test_the_instance_check_names_the_missing_settings_in_the_ui_and_the_daemon_log(guest):
    ticks = poll(
        lambda: _sensor(guest, "runstate_instance_check")["ticks"], timeout=STARTUP_S, what="a check tick"
    )
    reason = ticks[0]["skipReason"]
    log = guest.log.read_text(errors="replace")

    assert "setting(s) missing from this Dagster instance" in reason
    for named in ("runstate/wal_shard", "run_monitoring", "run_retries", "HeartbeatRunLauncher"):
        assert named in reason, reason
    assert "Sensor runstate_instance_check skipped: runstate:" in log


def test_the_daemons_evaluate_freshness_and_automation(guest):
    poll(lambda: _sensor(guest, "runstate_automation")["ticks"], timeout=STARTUP_S, what="an automation tick")
    if not guest.instance.get_latest_materialization_event(dg.AssetKey("table_inventory")):
        guest.instance.report_runless_asset_event(dg.AssetMaterialization("table_inventory"))

    def freshness() -> str | None:
        nodes = guest.graphql(FRESHNESS, {"path": ["table_inventory"]})["assetNodes"]
        status = nodes[0]["freshnessStatusInfo"]["freshnessStatus"]
        return status if status == "HEALTHY" else None

    assert _sensor(guest, "runstate_automation")["status"] == "RUNNING"
    assert poll(freshness, timeout=STARTUP_S, every=5, what="table_inventory's freshness") == "HEALTHY"
