"""Helpers shared by the services tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

RUNSTATE = str(Path(sys.executable).parent / "runstate")

# Endpoints a developer's shell may carry; each test decides its own.
SERVICE_VARS = (
    "RUNSTATE_PG_URL",
    "DAGSTER_PG_URL",
    "RUNSTATE_AWS_ENDPOINT_URL",
    "RUNSTATE_SCHEMA",
    "RUNSTATE_HOME",
    "RUNSTATE_PG_BIN",
    "DAGSTER_HOME",
)


def clean_env(home: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS and not k.startswith("SNOWFLAKE_")}
    env.update(RUNSTATE_HOME=str(home), DAGSTER_TELEMETRY_ENABLED="false", **overrides)
    return env
