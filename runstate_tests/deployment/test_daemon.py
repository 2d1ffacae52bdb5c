"""The deployment as users drive it: `runstate dev`'s daemon, run queue and default launcher, the UI's API.

Every assertion is an outcome a user can see (rows applied, what a reader gets, a run's status, the
events recorded), never which op ran or how many runs it took: flushes and maintenance may group
their work into fewer, bigger runs. Deadlines are generous and every wait polls.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runstate.config import Settings
from runstate.defs.tags import WAL_SHARD_TAG
from runstate.defs.wal.always_on import WAL_FLUSHER_TAG
from runstate.maintenance import CachedTable, MaintenanceStore
from runstate.wal.dataset_tables import NAMESPACE, VERSION_PROPERTY, table_name
from runstate.wal.shards import shard_of
from runstate_tests.deployment.gate import process_of_client
from runstate_tests.support.deployment import RUNS, Deployment, visible
from runstate_tests.support.devserver import poll
from runstate_tests.support.procfs import command_line

# The suite's 600 s per-test timeout would cut a wait short on a loaded machine; each wait has a deadline.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(2400)]

# The sensor's 30 s timer, the queue, a run worker's start and the flush, on a loaded 2-core machine.
FLUSH_DEADLINE_S = 400
RUN_DEADLINE_S = 400
# The merge sensor's timer (10 s here), a free Spark slot, a run worker and its JVM.
MERGE_DEADLINE_S = 600
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}

LAUNCH = """mutation($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
RUN_STATUS = "query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }"
BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  __typename ... on PartitionBackfill { status } } }"""


def run_status(deployment: Deployment, run_id: str) -> str:
    return deployment.graphql(RUN_STATUS, {"id": run_id})["runOrError"]["status"]


def finished(deployment: Deployment, run_id: str) -> str | None:
    status = run_status(deployment, run_id)
    return status if status in TERMINAL else None


def launch(deployment: Deployment, job: str, run_config: dict) -> str:
    selector = {"repositoryLocationName": "runstate", "repositoryName": "__repository__", "pipelineName": job}
    result = deployment.graphql(LAUNCH, {"params": {"selector": selector, "runConfigData": run_config}})
    launched = result["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def append_events_config(run_id: str, started: datetime | None = None) -> dict:
    emitted_at = (started or datetime.now(UTC)).isoformat()
    events = [
        {"event_type": "RunStarted", "emitted_at": emitted_at},
        {"event_type": "StepStarted", "step_id": "extract", "emitted_at": emitted_at},
        {"event_type": "StepCompleted", "step_id": "extract", "emitted_at": emitted_at},
        {"event_type": "RunCompleted", "emitted_at": emitted_at},
    ]
    return {"ops": {"append_events_op": {"config": {"run_id": run_id, "events": events}}}}


def test_wal_appends_are_flushed_by_the_daemons_sensor(deployment: Deployment):
    dataset = f"orders_{uuid.uuid4().hex[:8]}"

    for key, value in (("sku1", 1), ("sku2", 2), ("sku1", 3)):
        deployment.cli("wal", "append", "--dataset", dataset, "--upsert", f"{key}={json.dumps(value)}")

    version, state = poll(
        lambda: visible(deployment, dataset, 3), timeout=FLUSH_DEADLINE_S, every=2, what=f"{dataset} flushed"
    )
    assert (version, state) == (3, {"sku1": 3, "sku2": 2})
    # ... and the dataset_tables_sensor's merge run brings its Iceberg table to the same version and rows.
    catalog = lake_catalog(deployment)
    table = poll(
        lambda: merged_table(catalog, dataset, 3),
        timeout=MERGE_DEADLINE_S,
        every=3,
        what=f"{dataset} merged",
    )
    assert table == state


def merged_table(catalog: Any, dataset: str, version: int) -> dict | None:
    """The live rows of `lake.datasets.<dataset>` once it reached `version` (read by pyiceberg: no JVM)."""
    from pyiceberg.exceptions import NoSuchTableError
    from sqlalchemy.exc import ProgrammingError

    try:
        table = catalog.load_table(f"{NAMESPACE}.{table_name(dataset)}")
    except NoSuchTableError:
        return None
    except ProgrammingError:  # the deployment's Spark is still bringing the catalog's tables to V1
        return None
    if int(table.properties.get(VERSION_PROPERTY, 0)) < version:
        return None
    rows = table.scan(row_filter="deleted == false").to_arrow().to_pylist()
    return {json.loads(row["key"]): json.loads(row["value"]) for row in rows}


def test_a_flush_killed_mid_way_is_failed_and_a_later_run_applies_its_rows_once(deployment: Deployment):
    dataset = f"crash_{uuid.uuid4().hex[:8]}"
    # Hold the flush after its blob is committed, at the first "mark the rows Applied" write.
    marks_applied = lambda environ, body: (
        environ.get("HTTP_X_AMZ_TARGET", "").endswith(".UpdateItem")
        and f'"{dataset}"'.encode() in body
        and b'"Applied#' in body
    )
    deployment.moto.gate.arm(marks_applied)
    try:
        deployment.cli("wal", "append", "--dataset", dataset, "--upsert", "x=1")
        deployment.cli("wal", "append", "--dataset", dataset, "--upsert", "x=2")
        client_port = deployment.moto.gate.wait_for_held(timeout=FLUSH_DEADLINE_S)
        in_flight = started_flush_runs(deployment, dataset)
        killed = kill_run_processes(process_of_client(client_port, deployment.moto.port))
        # A later change: were the killed batch applied again after it, the reader would show x=2.
        deployment.cli("wal", "append", "--dataset", dataset, "--upsert", "x=3")
    finally:
        deployment.moto.gate.disarm()

    assert killed and in_flight
    statuses = [
        poll(
            lambda run_id=run_id: finished(deployment, run_id),
            timeout=RUN_DEADLINE_S,
            every=2,
            what=f"run {run_id} of the killed worker ends",
        )
        for run_id in in_flight
    ]
    assert "FAILURE" in statuses or "CANCELED" in statuses, statuses
    version, state = poll(
        lambda: visible(deployment, dataset, 3),
        timeout=FLUSH_DEADLINE_S,
        every=2,
        what=f"{dataset} flushed after the crash",
    )
    assert (version, state) == (3, {"x": 3})


def started_flush_runs(deployment: Deployment, dataset: str) -> list[str]:
    """The dataset's shard's flush runs in progress (always-on runs carry their shard as WAL_FLUSHER_TAG,
    on-demand ones as WAL_SHARD_TAG): always-on, the other shard's run lives on unharmed."""
    shard = str(shard_of(dataset, Settings.wal_flush_shards))
    found = []
    for tag in (WAL_FLUSHER_TAG, WAL_SHARD_TAG):
        tags = [{"key": tag, "value": shard}]
        runs = deployment.graphql(
            RUNS, {"filter": {"statuses": ["STARTED"], "pipelineName": "flush_wal", "tags": tags}}
        )
        found += [run["runId"] for run in runs["runsOrError"]["results"]]
    return found


def kill_run_processes(pid: int) -> list[int]:
    """SIGKILL the process holding the request and its ancestors up to the code server that spawned the run.

    With the multiprocess executor the flush op runs in a step process under the run worker; with the
    in-process one it is the run worker itself. Either way the whole run dies at once, as in a crash.
    """
    chain = [pid]
    while len(chain) < 4:
        parent = _parent(chain[-1])
        command = command_line(parent)
        if "api grpc" in command or parent <= 1:
            break
        chain.append(parent)
    for member in chain:
        assert not any(
            name in command_line(member) for name in ("dagster dev", "dagster-daemon", "webserver")
        ), chain
    for member in reversed(chain):
        os.kill(member, signal.SIGKILL)
    return chain


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_launchpad_run_of_append_events_and_a_run_snapshots_backfill(deployment: Deployment):
    workflow_run = f"wf-{uuid.uuid4().hex[:8]}"
    started = datetime.now(UTC)
    store = deployment.event_store()

    run_id = launch(deployment, "append_events", append_events_config(workflow_run, started))
    status = poll(lambda: finished(deployment, run_id), timeout=RUN_DEADLINE_S, every=2, what="append_events")

    assert status == "SUCCESS", deployment.log_tail()
    assert [e.event_type for e in store.fetch(workflow_run)] == [
        "RunStarted",
        "StepStarted",
        "StepCompleted",
        "RunCompleted",
    ]
    assert workflow_run in store.stale_runs()

    # The partition of the run's start day: read from the clock again, it would be the next day when the
    # run crossed midnight (UTC), and that partition holds no run of this test.
    day = started.strftime("%Y-%m-%d")
    params = {"assetSelection": [{"path": ["run_snapshots"]}], "partitionNames": [day], "fromFailure": False}
    launched = deployment.graphql(BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill = poll(
        lambda: backfill_done(deployment, launched["backfillId"]),
        timeout=RUN_DEADLINE_S,
        every=2,
        what="run_snapshots backfill",
    )

    assert backfill in ("COMPLETED", "COMPLETED_SUCCESS"), backfill
    assert workflow_run not in store.stale_runs()
    assert store.project(workflow_run).status == "COMPLETED"


def backfill_done(deployment: Deployment, backfill_id: str) -> str | None:
    status = deployment.graphql(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]["status"]
    return None if status in ("REQUESTED", "CANCELING", "FAILING") else status


def test_a_maintenance_job_submitted_from_the_cli_is_run_by_the_daemon(deployment: Deployment):
    table = f"events_{uuid.uuid4().hex[:8]}"
    create_iceberg_table(deployment, "lakedb", table, snapshots=3)

    # The catalog cache as `maintenance sync` leaves it (that command is tested in-process on the worker's
    # Spark session, test_maintenance_cli.py): here it would only start one more JVM.
    with MaintenanceStore(deployment.pg_url, schema="runstate") as store:
        store.cache.replace_table_cache([CachedTable("lakedb", table, True, {})])
    job_id = deployment.cli(
        "maintenance", "submit", f"lakedb.{table}", "-a", "rewrite_manifests"
    ).stdout.strip()
    status = poll(
        lambda: maintenance_job_finished(deployment, job_id),
        timeout=900,
        every=5,
        what=f"maintenance job {job_id}",
    )

    assert status == "completed", deployment.log_tail()
    # The module's last test: every run the deployment finished by now (flushes, merges, the launchpad's,
    # the backfill's, maintenance) is recorded in the event store by the run recorder's sensor.
    every_finished_run_is_recorded(deployment)


def create_iceberg_table(deployment: Deployment, namespace: str, table: str, snapshots: int) -> None:
    """A small table in the deployment's `lake` catalog (pyiceberg writes the catalog tables Spark reads)."""
    import pyarrow as pa

    catalog = lake_catalog(deployment)
    catalog.create_namespace_if_not_exists(namespace)
    schema = pa.schema([("id", pa.int64()), ("kind", pa.string())])
    created = catalog.create_table(f"{namespace}.{table}", schema=schema)
    for n in range(snapshots):
        created.append(pa.table({"id": [n], "kind": ["click"]}))


def lake_catalog(deployment: Deployment) -> Any:
    """The deployment's `lake` catalog through pyiceberg, which reads and writes the tables Spark uses."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import IntegrityError

    warehouse = deployment.home / ".runstate" / "warehouse"  # where the deployment's Spark looks
    warehouse.mkdir(parents=True, exist_ok=True)
    uri = deployment.pg_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    try:
        return SqlCatalog("lake", uri=uri, warehouse=warehouse.as_uri())
    except IntegrityError:
        # pyiceberg creates the catalog's tables when they are missing, and so does the deployment's Spark
        # at the same moment: the CREATE TABLE that loses fails in Postgres's own catalog (pg_type), and
        # a second try finds the tables there.
        return SqlCatalog("lake", uri=uri, warehouse=warehouse.as_uri())


def maintenance_job_finished(deployment: Deployment, job_id: str) -> str | None:
    job = json.loads(deployment.cli("maintenance", "status", job_id, "--json").stdout)["job"]
    return job["status"] if job["status"] in ("completed", "failed", "cancelled") else None


def every_finished_run_is_recorded(deployment: Deployment) -> None:
    """Each run finished by now has its terminal event (RunCompleted, RunFailed, RunCancelled) in the store."""
    runs = deployment.graphql(RUNS, {"filter": {"statuses": ["SUCCESS", "FAILURE", "CANCELED"]}})
    done = {run["runId"]: run["status"] for run in runs["runsOrError"]["results"]}
    store = deployment.event_store()
    terminal = {"SUCCESS": "RunCompleted", "FAILURE": "RunFailed", "CANCELED": "RunCancelled"}

    def unrecorded() -> dict[str, str] | None:
        missing = {
            run_id: status
            for run_id, status in done.items()
            if terminal[status] not in {event.event_type for event in store.fetch(run_id)}
        }
        return missing or None

    assert done
    poll(lambda: unrecorded() is None, timeout=RUN_DEADLINE_S, every=3, what="every finished run recorded")
