"""`runstate services up` sets the Dagster pool runstate_spark's limit in a storage-only instance."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from services_helpers import clean_env

from runstate.defs.pool import spark_pool_limit


def test_up_sets_the_spark_pool_limit_in_the_instance_of_dagster_home(
    services_home, runstate_cli, fresh_database, tmp_path: Path, monkeypatch
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    storage = {"storage": {"postgres": {"postgres_url": {"env": "DAGSTER_PG_URL"}}}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(storage))
    dagster_url = fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    env = clean_env(
        services_home,
        RUNSTATE_PG_URL=fresh_database,
        DAGSTER_PG_URL=dagster_url,
        DAGSTER_HOME=str(home),
        RUNSTATE_SPARK_SESSIONS="3",
    )

    up = runstate_cli("services", "up", env=env)

    assert up.returncode == 0, up.stderr[-3000:]
    assert "Dagster pool runstate_spark: at most 3 Spark session(s) at once (was unset)" in up.stdout
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert spark_pool_limit(instance) == 3
