"""A Dagster home whose dagster.yaml holds only Postgres storage: a platform team's instance, as plain as it
gets (no run queue limits, no monitoring, no retries, Dagster's default launcher, no pool limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml


def storage_only_config(database_url: str) -> dict[str, Any]:
    """Storage in the `postgres_db` form of Dagster's docs, from which dagster-postgres builds a bare
    `postgresql://` URL: SQLAlchemy's default driver for that scheme is the one that must work."""
    url = urlsplit(database_url)
    db = {"username": url.username or "postgres", "hostname": url.hostname, "port": url.port or 5432}
    return {"storage": {"postgres": {"postgres_db": {**db, "db_name": url.path.lstrip("/")}}}}


def write_home(home: Path, config: dict[str, Any]) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home
