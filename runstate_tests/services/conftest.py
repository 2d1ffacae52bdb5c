"""Fixtures for the services tests: a RUNSTATE_HOME of the test's own and the real `runstate` command."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from services_helpers import RUNSTATE, clean_env


@pytest.fixture
def services_home() -> Iterator[Path]:
    """A home the `postgres` OS user can enter too (initdb runs as that user when we are root)."""
    home = Path(tempfile.mkdtemp(prefix="runstate-home-"))
    home.chmod(0o755)
    yield home
    # Whatever a test left running in this home is stopped by pid, like a user would.
    subprocess.run([RUNSTATE, "services", "down"], env=clean_env(home), capture_output=True, timeout=120)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def runstate_cli() -> Callable[..., subprocess.CompletedProcess]:
    def run(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([RUNSTATE, *args], env=env, capture_output=True, text=True, timeout=timeout)

    return run
