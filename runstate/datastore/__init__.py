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

from typing import Protocol

from runstate.datastore.names import InvalidSchemaName, check_schema_name
from runstate.datastore.postgres import PostgresDatastore, pipelined_transaction, redact
from runstate.datastore.snowflake import SnowflakeDatastore


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
