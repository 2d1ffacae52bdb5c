"""One connection owner per backend, built once and injected (the shape of eventsourcing's datastores).

- `PostgresDatastore(dsn, schema=...)`: a psycopg_pool.ConnectionPool of autocommit connections whose
  search_path is the schema, `connection()`, `transaction(pipeline=...)`, `connect()` for a
  connection of one's own; fork-safe. `pipelined_transaction(conn)`: BEGIN..COMMIT in one flight.
- `SnowflakeDatastore(connect_kwargs | connection_factory, schema=...)`: a small pool of
  snowflake-connector connections, `connection()`, `cursor()`, `transaction()`, `connect()`.

`runstate.wiring` builds them from the settings (`runstate.backends` names the builder of each
backend); the event store, the maintenance queue and the migrations take them. Neither imports a
domain, and both let the driver's errors through: each domain translates them into its own error root.
"""

from typing import TYPE_CHECKING, Protocol

from runstate.datastore.names import InvalidSchemaName, check_schema_name
from runstate.datastore.urls import redact
from runstate.lazy import lazy_exports

if TYPE_CHECKING:
    from runstate.datastore.postgres import PostgresDatastore, pipelined_transaction
    from runstate.datastore.snowflake import SnowflakeDatastore

# Each datastore loads its driver (psycopg and its pool, the Snowflake connector): imported on first use,
# so that `runstate.config`, which checks RUNSTATE_SCHEMA by names.py's rule, loads no driver.
__getattr__ = lazy_exports(
    __name__,
    {
        "PostgresDatastore": "runstate.datastore.postgres",
        "pipelined_transaction": "runstate.datastore.postgres",
        "SnowflakeDatastore": "runstate.datastore.snowflake",
    },
)


class Datastore(Protocol):
    """What every backend's connection owner has: its backend's name (runstate.backends), its schema."""

    backend: str
    schema: str

    def close(self) -> None: ...


__all__ = [
    "Datastore",
    "InvalidSchemaName",
    "PostgresDatastore",
    "SnowflakeDatastore",
    "check_schema_name",
    "pipelined_transaction",
    "redact",
]
