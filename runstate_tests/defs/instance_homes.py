"""A Dagster home whose dagster.yaml holds only Postgres storage: a platform team's instance, as plain as it
gets (no run queue limits, no monitoring, no retries, Dagster's default launcher, no pool limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def storage_only_config(database_url: str) -> dict[str, Any]:
    url = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return {"storage": {"postgres": {"postgres_url": url}}}


def write_home(home: Path, config: dict[str, Any]) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home
