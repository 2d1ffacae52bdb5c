"""One `runstate dev` (webserver + daemon) for the deployment tests, started once, driven as a user would.

It has a home, a DAGSTER_HOME with its own dagster.yaml, and two databases of its own, and reaches AWS
through a moto server held by this process (see gate.py). Its tests carry the xdist group
"deployment", so one worker runs them all against this one deployment.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate.services.http import http_answers
from runstate_tests.deployment.gate import GatedMotoServer
from runstate_tests.support.databases import create_database, drop_database, unique
from runstate_tests.support.deployment import STARTUP_S, Deployment, deployment_env
from runstate_tests.support.deployment import location_loaded as _location_loaded
from runstate_tests.support.deployment import stop_dev as _stop
from runstate_tests.support.devserver import (
    RUNSTATE,
    free_port,
    graphql_version,
    launch_dev,
    poll,
    wait_for_graphql,
)

# The one test of the shared deployment about its run history exports: it runs first, and then stops the
# sensor (test_run_history.py), so the deployment's other tests do not start an export JVM every minute.
EXPORTS_RUN_HISTORY = "test_appended_events_reach_the_lake_within_the_bound"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The run history test before the shared deployment's other tests (the root conftest's sort by rank
    is stable and keeps this order)."""
    items.sort(key=lambda item: item.name != EXPORTS_RUN_HISTORY)


@pytest.fixture(scope="package")
def deployment() -> Iterator[Deployment]:
    """Package-scoped, not session: it stops once the group's last test is done, instead of keeping its
    daemon's schedules launching runs beside the rest of the suite until the session ends."""
    home = Path(tempfile.mkdtemp(prefix="runstate-deployment-"))
    databases = [unique("rs_deploy"), unique("rs_deploy_dagster")]
    pg_url, dagster_url = (create_database(name) for name in databases)
    moto = GatedMotoServer()
    # moto imports its backends on the first request: seconds under load, and `services up` gives the
    # endpoint one second to answer. That first request is ours (should it fail, `services up` says so).
    http_answers(moto.url, timeout=STARTUP_S)
    env = deployment_env(
        home,
        pg_url,
        dagster_url,
        moto.url,
        # A merge every 10 s instead of every minute: the wait for a dataset's table is the sensor's timer.
        RUNSTATE_DATASET_MERGE_INTERVAL_S="10",
        # The same for the run history's export (test_run_history.py, which then stops its sensor).
        RUNSTATE_HISTORY_EXPORT_INTERVAL_S="10",
    )
    log = home / "dev.log"
    for _ in range(3):  # a port another process took before our webserver bound it: another port
        port = free_port()
        dev = launch_dev(port, env, log, start_new_session=True)
        if wait_for_graphql(port, dev, timeout=STARTUP_S):
            break
        _stop(dev)
    deployment = Deployment(port, env, home, pg_url, moto, log)
    try:
        assert dev.poll() is None and graphql_version(port), deployment.log_tail()
        poll(lambda: _location_loaded(deployment), timeout=STARTUP_S, every=2, what="code location loaded")
        yield deployment
    finally:
        _stop(dev)
        subprocess.run([RUNSTATE, "services", "down"], env=env, capture_output=True, timeout=120)
        moto.stop()
        for name in databases:
            drop_database(name)
        shutil.rmtree(home, ignore_errors=True)
