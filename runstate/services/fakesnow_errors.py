"""fakesnow made faithful where it answers a failed statement: as Snowflake does, not with HTTP 500.

Snowflake answers a statement that fails (a lock conflict, an aborted transaction, an object that
already exists) with a statement error: HTTP 200, `success: false`, an error code and SQLSTATE. The
connector raises it at once. fakesnow translates some DuckDB errors that way, but answers the rest
(write-write conflicts, constraint violations, a transaction aborted by an earlier error) with HTTP
500, which the connector treats as a server fault: it sleeps a second and sends the same statement
again (fakesnow, unlike Snowflake, does not recognise the retry and runs it twice), until its
network timeout. Every failed statement cost a second and a second execution.

`answer_statement_errors_as_snowflake()` wraps fakesnow's DuckDB call so those errors become the
statement errors Snowflake would give, and runs a CREATE, DROP or ALTER that raced another session's
change of the same object again after a pause, as Snowflake's waiting on that object's lock would.
Both ways runstate starts fakesnow install it: the
`runstate services` server (`python -m runstate.services.fakesnow_server`) and the tests' fixture.
An unhandled fakesnow bug is still HTTP 500.
"""

from __future__ import annotations

import functools
import time
from typing import Any

# (Snowflake errno, SQLSTATE) for what DuckDB reports. A write that conflicts with a concurrent
# transaction (DuckDB fails it at once, where Snowflake makes it wait on the lock and gives up after a
# while), or a statement in a transaction an earlier error aborted: Snowflake's lock error, 000625
# (57014), which callers retry.
_CONFLICT = (625, "57014")
# A duplicate key: Snowflake does not enforce keys, fakesnow does; an integrity error is the closest.
_CONSTRAINT = (100072, "23000")
# DDL on an object another session is changing: Snowflake serialises the two (the second waits for the
# first's lock); DuckDB fails the second at once. Run it again after a pause, as a waiter would, this
# many times (about 2 s in all) before answering with the lock error.
_DDL_WAITS = 100
_DDL_PAUSE_S = 0.02


def answer_statement_errors_as_snowflake() -> None:
    """Install the translation into fakesnow's cursor (idempotent; call before the server starts)."""
    from fakesnow.cursor import FakeSnowflakeCursor

    execute = FakeSnowflakeCursor._execute  # noqa: SLF001 - the one place fakesnow runs DuckDB SQL
    if getattr(execute, "_runstate_faithful", False):
        return

    @functools.wraps(execute)
    def translated(self: Any, transformed: Any, *args: Any, **kwargs: Any) -> Any:
        import duckdb
        import snowflake.connector

        waits = 0
        while True:
            try:
                return execute(self, transformed, *args, **kwargs)
            except (duckdb.TransactionException, duckdb.ConstraintException) as exc:
                if waits < _DDL_WAITS and _ddl_racing_ddl(exc, transformed):
                    waits += 1
                    time.sleep(_DDL_PAUSE_S)
                    continue
                errno, sqlstate = _CONSTRAINT if isinstance(exc, duckdb.ConstraintException) else _CONFLICT
                raise snowflake.connector.errors.ProgrammingError(
                    msg=str(exc).split("\n")[0], errno=errno, sqlstate=sqlstate
                ) from exc

    translated._runstate_faithful = True  # type: ignore[attr-defined]
    FakeSnowflakeCursor._execute = translated  # noqa: SLF001


def _ddl_racing_ddl(exc: Exception, transformed: Any) -> bool:
    """A CREATE, DROP or ALTER that met another session's change of the same catalog entry."""
    from sqlglot import exp

    return "Catalog write-write conflict" in str(exc) and isinstance(
        transformed, (exp.Create, exp.Drop, exp.Alter)
    )
