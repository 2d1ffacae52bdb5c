"""Dagster in the test processes."""

from __future__ import annotations

from typing import Any


def load_alembic_scripts_once() -> None:
    """Dagster's SQLite storage (each test's own instance, and each run's event log database in it) checks
    its schema against alembic's migration scripts, which alembic reads from their files at every check:
    about half the CPU of a new instance (0.45 of 1.0 s) and of a run (0.13 of 0.25 s). The scripts do not
    change while the suite runs, so a test process loads each folder of them once. (A deployment on
    Postgres storage checks once per process; the CLI and the deployment's processes are left as they are.)
    """
    from alembic.script import ScriptDirectory

    loaded: dict[tuple[str | None, str | None], ScriptDirectory] = {}
    load = ScriptDirectory.from_config.__func__

    def from_config(cls: type[ScriptDirectory], config: Any) -> ScriptDirectory:
        key = (config.config_file_name, config.get_alembic_option("script_location"))
        if key not in loaded:
            loaded[key] = load(cls, config)
        return loaded[key]

    ScriptDirectory.from_config = classmethod(from_config)
