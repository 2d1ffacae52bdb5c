"""`PooledPostgresStorage`: Dagster's Postgres storage, keeping a few connections open.

dagster-postgres opens a new connection for every statement (SQLAlchemy's NullPool) in every process
but the webserver. A new connection is a new Postgres server process, which authenticates, warms its
catalog caches and answers psycopg2's hstore probe before the statement runs; and each of the three
storages looks for its tables on two more whenever an instance is made (a code server makes one per
sensor tick). docs/OPERATIONS.md (Dagster) has what this cost an idle `runstate dev`, and what it costs
with this storage.

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
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
    retry_pg_connection_fn,
)
from sqlalchemy import inspect as db_inspect
from sqlalchemy.engine import make_url

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

    def optimize_for_webserver(self, statement_timeout: int, pool_recycle: int, max_overflow: int) -> None:
        # The webserver gives each storage a pool of its own: the shared one's connection is closed.
        shared = self._engine
        super().optimize_for_webserver(statement_timeout, pool_recycle, max_overflow)
        shared.dispose()


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
        # storage would look for its tables on two new connections of its own: one look through the
        # pool tells whether they must (an empty database), and otherwise they skip it.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        engine = _pooled_engine(postgres_url, token_provider)
        create = should_autocreate_tables and not _has_tables(engine)
        self._run_storage = _PoolClosingRunStorage(postgres_url, create, token_provider=token_provider)
        self._event_log_storage = PostgresEventLogStorage(postgres_url, create, token_provider=token_provider)
        self._schedule_storage = PostgresScheduleStorage(postgres_url, create, token_provider=token_provider)
        DagsterStorage.__init__(self)
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


def _has_tables(engine: Any) -> bool:
    """Whether the tables each storage creates when it finds none are all there (dagster-postgres's tests
    for them: runs and instance_info, event_logs, jobs or the older schedules)."""
    tables = set(retry_pg_connection_fn(lambda: db_inspect(engine).get_table_names()))
    return {"runs", "instance_info", "event_logs"} <= tables and bool({"jobs", "schedules"} & tables)


def _pooled_engine(postgres_url: str, token_provider: Any) -> Any:
    kwargs: dict[str, Any] = {
        "isolation_level": "AUTOCOMMIT",
        "pool_size": POOL_SIZE,
        "max_overflow": MAX_OVERFLOW,
        "pool_recycle": POOL_RECYCLE_S,
        "pool_pre_ping": True,
    }
    options = make_url(postgres_url).query.get("options")
    if options:  # as dagster-postgres passes a URL's `options` (statement_timeout, say)
        kwargs["connect_args"] = {"options": options}
    return create_pg_engine(postgres_url, token_provider, **kwargs)
