"""The deployment's Dagster instance, and the Dagster pool `runstate_spark`'s limit in it: `runstate db
upgrade`, `runstate services up` and `runstate dev` set it, so a pool that Dagster would leave unbounded is
not. Light on purpose: it loads the instance, never the code location's definitions."""

from __future__ import annotations

import os

from dagster import DagsterInstance

from runstate.config import Settings, settings
from runstate.services.dev import dagster_home


def default_instance() -> DagsterInstance:
    """The deployment's instance, the one the daemon uses: DAGSTER_HOME, else the checkout's dagster.yaml.

    Never an ephemeral instance: a tick must find the cursor the previous tick stored, the runs its
    run_keys already launched, and leave its runs where the UI shows them.
    """
    # dagster.yaml reads its storage URL from DAGSTER_PG_URL; the settings know its default.
    os.environ.setdefault("DAGSTER_PG_URL", settings().dagster_pg_url)
    return DagsterInstance.from_config(str(dagster_home(os.environ)))


def apply_spark_sessions(sessions: int) -> str:
    """The deployment's instance (DAGSTER_HOME, else the checkout's dagster.yaml) gets the pool limit
    `sessions`; says what it did. Where there is no instance (no DAGSTER_HOME and no dagster.yaml),
    nothing is written: Dagster would make a scratch one in the folder."""
    from runstate.defs.pool import set_spark_pool_limit
    from runstate.defs.tags import SPARK_POOL

    home = dagster_home(os.environ)
    if not os.environ.get("DAGSTER_HOME") and not (home / "dagster.yaml").exists():
        return f"Dagster pool {SPARK_POOL}: no Dagster instance here (set DAGSTER_HOME to set its limit)"
    with default_instance() as instance:
        return set_spark_pool_limit(instance, sessions)


def limit_spark_pool(sessions: int, error: type[Exception]) -> str:
    """`apply_spark_sessions`, with whatever the instance's storage driver raised turned into one
    `error` (the caller's domain error: one line, exit code 1)."""
    try:
        return apply_spark_sessions(sessions)
    except Exception as exc:  # the instance's storage driver's error, whatever it is
        raise error(f"Dagster instance (DAGSTER_HOME): {type(exc).__name__}: {exc}") from exc


def limit_spark_pool_at(dagster_pg_url: str) -> str:
    """After `services up` (and `runstate dev`'s): the pool's limit (RUNSTATE_SPARK_SESSIONS) in the
    instance whose storage is the database `up` chose (the caller's own DAGSTER_PG_URL when set)."""
    from runstate.services.state import ServiceError

    os.environ["DAGSTER_PG_URL"] = dagster_pg_url
    return limit_spark_pool(Settings.from_env().spark_sessions, ServiceError)
