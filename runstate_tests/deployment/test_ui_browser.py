"""The Dagster UI, opened in headless Chromium, shows runstate's assets, sensors and schedules.

It looks at the deployment tests' `runstate dev` (xdist group "deployment"): starting a deployment
costs minutes on a loaded machine, and this one is what a user would open.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runstate_tests.support.deployment import Deployment

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

# Run first in its group, it waits for the deployment to start: more than the suite-wide 600 s under load.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("deployment"),
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="chromium is missing: make test installs it (apt)"
    ),
]


@pytest.fixture
def dagster_ui(deployment: Deployment) -> str:
    """The deployment's UI: the one `runstate dev` of the deployment tests, not one of its own."""
    return f"http://127.0.0.1:{deployment.port}"


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
