"""`PooledPostgresStorage`: Dagster's Postgres storage, keeping a few connections open.

dagster-postgres opens a new connection for every statement (SQLAlchemy's NullPool) in every process
but the webserver. A new connection is a new Postgres server process, which authenticates, warms its
catalog caches and answers psycopg2's hstore probe before the statement runs. An idle `runstate dev`
measured 24 new connections a second from its daemon and 8 from its code server, and Postgres spent
16 CPU-s a minute on them.

Here the run, event log and schedule storages of one instance share one engine with a small pool:
connections are checked before use (`pool_pre_ping`), so one broken by a Postgres restart is replaced
instead of failing a daemon's statement. The webserver still swaps in its own pool
(`optimize_for_webserver`). Everything else (tables, migrations, the event watcher's LISTEN connection,
the configuration block) is dagster-postgres's own. An instance's pool is closed when the instance is
disposed; the instance disposes its run storage, which holds the engine for the three.
"""

from __future__ import annotations

from typing import Any

from dagster._core.storage.base_storage import DagsterStorage
from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

# Connections each instance keeps open, and how many more it opens while more threads query at once
# (the daemon evaluates sensors and dequeues runs on threads of its own); the extra ones close on return.
POOL_SIZE = 2
MAX_OVERFLOW = 10
# Reopened hourly, as the webserver's pool does by default.
POOL_RECYCLE_S = 3600


class _PoolClosingRunStorage(PostgresRunStorage):
    def dispose(self) -> None:
        super().dispose()
        self._engine.dispose()


class PooledPostgresStorage(DagsterPostgresStorage):
    """The `storage: postgres:` block's storage, on one pooled engine for its three storages."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
    ):
        # The parent's own construction, with a run storage that closes the pool when disposed. Each
        # storage creates its tables (if asked) on its own NullPool engine first.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        self._run_storage = _PoolClosingRunStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        self._event_log_storage = PostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        self._schedule_storage = PostgresScheduleStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        DagsterStorage.__init__(self)
        engine = _pooled_engine(postgres_url, token_provider, self._run_storage._engine.url.query)
        for storage in (self._run_storage, self._event_log_storage, self._schedule_storage):
            storage._engine.dispose()
            storage._engine = engine

    @classmethod
    def from_config_value(  # ty: ignore[invalid-method-override]
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> PooledPostgresStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )


def _pooled_engine(postgres_url: str, token_provider: Any, query: Any) -> Any:
    kwargs: dict[str, Any] = {
        "isolation_level": "AUTOCOMMIT",
        "pool_size": POOL_SIZE,
        "max_overflow": MAX_OVERFLOW,
        "pool_recycle": POOL_RECYCLE_S,
        "pool_pre_ping": True,
    }
    if query.get("options"):  # as dagster-postgres passes a URL's `options` (statement_timeout, say)
        kwargs["connect_args"] = {"options": query["options"]}
    return create_pg_engine(postgres_url, token_provider, **kwargs)
