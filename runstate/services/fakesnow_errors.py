"""fakesnow made faithful where it answers a failed statement: as Snowflake does, not with HTTP 500.

Snowflake answers a statement that fails (a lock conflict, an aborted transaction, an object that
already exists) with a statement error: HTTP 200, `success: false`, an error code and SQLSTATE. The
connector raises it at once. fakesnow translates some DuckDB errors that way, but answers the rest
(write-write conflicts, constraint violations, a transaction aborted by an earlier error) with HTTP
500, which the connector treats as a server fault: it sleeps a second and sends the same statement
again (fakesnow, unlike Snowflake, does not recognise the retry and runs it twice), until its
network timeout. Every failed statement cost a second and a second execution.

`answer_statement_errors_as_snowflake()` wraps fakesnow's DuckDB call so those errors become the
statement errors Snowflake would give. Both ways runstate starts fakesnow install it: the
`runstate services` server (`python -m runstate.services.fakesnow_server`) and the tests' fixture.
An unhandled fakesnow bug is still HTTP 500.
"""

from __future__ import annotations

import functools
from typing import Any

# (DuckDB exception class name, Snowflake errno, SQLSTATE): what Snowflake reports for the same event.
# A write that conflicts with a concurrent transaction, or a statement in a transaction an earlier
# error aborted: Snowflake's "transaction aborted / lock" family (000625, 57014) for retryable conflicts.
_CONFLICT = (625, "57014")
# A duplicate key: Snowflake does not enforce keys, fakesnow does; an integrity error is the closest.
_CONSTRAINT = (100072, "23000")
# Two concurrent CREATEs of one object: Snowflake lets one win and tells the other it already exists.
_EXISTS = (2002, "42710")


def answer_statement_errors_as_snowflake() -> None:
    """Install the translation into fakesnow's cursor (idempotent; call before the server starts)."""
    from fakesnow.cursor import FakeSnowflakeCursor

    execute = FakeSnowflakeCursor._execute  # noqa: SLF001 - the one place fakesnow runs DuckDB SQL
    if getattr(execute, "_runstate_faithful", False):
        return

    @functools.wraps(execute)
    def translated(self: Any, *args: Any, **kwargs: Any) -> Any:
        import duckdb
        import snowflake.connector

        try:
            return execute(self, *args, **kwargs)
        except (duckdb.TransactionException, duckdb.ConstraintException) as exc:
            msg, errno, sqlstate = _snowflake_error(exc)
            raise snowflake.connector.errors.ProgrammingError(
                msg=msg, errno=errno, sqlstate=sqlstate
            ) from exc

    translated._runstate_faithful = True  # type: ignore[attr-defined]
    FakeSnowflakeCursor._execute = translated  # noqa: SLF001


def _snowflake_error(exc: Exception) -> tuple[str, int, str]:
    """(message, errno, SQLSTATE); DuckDB's own words stay in the message."""
    import duckdb

    message = str(exc).split("\n")[0]
    if "write-write conflict on create" in message:
        return f"Object already exists ({message})", *_EXISTS
    if isinstance(exc, duckdb.ConstraintException):
        return message, *_CONSTRAINT
    return message, *_CONFLICT
