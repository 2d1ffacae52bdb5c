"""The Dagster UI, opened in headless Chromium, shows runstate's assets, sensors and schedules."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runstate_tests.devserver import free_port, wait_for_graphql

RUNSTATE = str(Path(sys.executable).parent / "runstate")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
    "--disable-background-networking",
    "--disable-component-update",
]
ASSETS = ("run_snapshots", "dataset_snapshots", "table_health", "table_inventory")
SENSORS = ("wal_sensor", "maintenance_queue_sensor", "run_recorder")
SCHEDULES = ("maintenance_orchestrator",)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="chromium is missing: make test installs it (apt)"
    ),
]


@pytest.fixture
def dagster_ui(fresh_database: str, moto_endpoint: str, tmp_path: Path):
    """`runstate dev` on a free loopback port; its daemon's sensors and storage use the test's own database."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "RUNSTATE_HOME")}
    env.update(
        RUNSTATE_HOME=str(tmp_path),
        RUNSTATE_PG_URL=fresh_database,
        RUNSTATE_AWS_ENDPOINT_URL=moto_endpoint,
        DAGSTER_PG_URL=fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1),
    )
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen(
            [RUNSTATE, "dev", "--no-services", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_for_graphql(port, dev), log.read_text()[-3000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=120)
        except subprocess.TimeoutExpired:
            dev.kill()


@pytest.fixture
def page(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def test_ui_lists_assets_sensors_and_schedules(dagster_ui: str, page, tmp_path: Path):
    page.goto(f"{dagster_ui}/assets")
    for asset in ASSETS:
        page.get_by_text(asset, exact=True).first.wait_for()
    page.screenshot(path=str(tmp_path / "assets.png"), full_page=True)

    page.goto(f"{dagster_ui}/automation")
    for name in SENSORS + SCHEDULES:
        page.get_by_text(name, exact=True).first.wait_for()
    page.screenshot(path=str(tmp_path / "automation.png"), full_page=True)

    assert (tmp_path / "assets.png").stat().st_size > 0
    assert (tmp_path / "automation.png").stat().st_size > 0
