"""The SQL files shipped with runstate: versioned DDL and named queries, read with importlib.resources.

The repository keeps them in the top-level `sql/`, which the build maps onto the package
`runstate._sql` (pyproject.toml, setup.py): a wheel carries the same files as a checkout, and nothing
here reads a path relative to the source tree. The layout is one folder per backend and domain:

    sql/<backend>/<domain>/NNN_snake_name.sql   a migration: applied once, recorded in the domain's ledger
    sql/<backend>/<domain>/<name>.sql           named queries, one file per concern (append.sql, queue.sql)
    sql/<backend>/<domain>/<folder>/            reference material (never applied)

Named-query files hold blocks introduced by a `-- name:` line, in the style of procrastinate and aiosql:

    -- name: claim_job
    -- Claim the oldest ready job; the comment lines under the name are its documentation.
    UPDATE job_queue SET ... WHERE ... RETURNING job_id;

    -- name: release_lock
    DELETE FROM table_locks WHERE ...

A name is `[a-z_][a-z0-9_]*` and appears once per file. A query runs from the line after its comment
lines to the next `-- name:` line; one trailing `;` is dropped, so the text can go straight to
`cursor.execute`. Parameters stay in the driver's own style (`%s` / `%(name)s` for psycopg and the
Snowflake connector): queries bind parameters, they are never formatted with values. The one
exception is a multi-row VALUES whose row count varies (Snowflake's batch insert): its `{rows}` is
replaced by that many groups of placeholders, and the values are still bound. Text before the first name
may only be comments. `queries(backend, domain, file)` returns a file's queries as a read-only mapping
whose missing keys raise an error naming the file; `named(backend, domain, file)` is a module's lookup.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

PACKAGE = "runstate._sql"
_NAME_LINE = re.compile(r"^--\s*name:\s*(\S+)\s*$")
_QUERY_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class SqlFileError(RuntimeError):
    """The shipped SQL is missing or malformed; the message names the file."""


def root() -> Traversable:
    """The shipped `sql/` folder; an install without it is broken, and says so."""
    try:
        folder = resources.files(PACKAGE)
    except ModuleNotFoundError as exc:
        raise SqlFileError(
            f"the SQL files (package {PACKAGE}) are not installed with runstate ({exc}): reinstall it "
            "(`pip install .`, or `make setup` in a checkout)"
        ) from exc
    return folder


def folder(backend: str, domain: str) -> Traversable:
    """`sql/<backend>/<domain>`; missing means the install is incomplete, never 'nothing to do'."""
    found = root() / backend / domain
    if not found.is_dir():
        raise SqlFileError(f"sql/{backend}/{domain}: no such folder in the installed runstate")
    return found


def domains(backend: str) -> list[str]:
    """The domains that ship SQL for `backend`, sorted."""
    base = root() / backend
    if not base.is_dir():
        raise SqlFileError(f"sql/{backend}: no such folder in the installed runstate")
    return sorted(entry.name for entry in base.iterdir() if entry.is_dir() and not entry.name.startswith("_"))


def sql_files(backend: str, domain: str) -> Iterator[Traversable]:
    """Every `.sql` file directly in the domain's folder, sorted by name."""
    entries = [e for e in folder(backend, domain).iterdir() if e.is_file() and e.name.endswith(".sql")]
    return iter(sorted(entries, key=lambda entry: entry.name))


class Queries(Mapping[str, str]):
    """The named queries of one file; a missing name raises KeyError naming the file."""

    def __init__(self, where: str, queries: dict[str, str]) -> None:
        self.where = where
        self._queries = queries

    def __getitem__(self, name: str) -> str:
        try:
            return self._queries[name]
        except KeyError:
            raise KeyError(f"no query {name!r} in {self.where}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


@cache
def queries(backend: str, domain: str, file: str) -> Queries:
    """The named queries of `sql/<backend>/<domain>/<file>`, parsed once per process."""
    where = f"sql/{backend}/{domain}/{file}"
    resource = folder(backend, domain) / file
    if not resource.is_file():
        raise SqlFileError(f"{where}: no such file in the installed runstate")
    return Queries(where, parse_queries(resource.read_text(encoding="utf-8"), where))


def named(backend: str, domain: str, file: str) -> Callable[[str], str]:
    """A module's `_sql(name)`: one query of `sql/<backend>/<domain>/<file>`. The file is read on the
    first lookup, not at import, and every lookup returns the same string (psycopg prepares statements
    by their text)."""

    def lookup(name: str) -> str:
        return queries(backend, domain, file)[name]

    return lookup


def parse_queries(text: str, where: str) -> dict[str, str]:
    """`-- name:` blocks to {name: query}; see the module's docstring for the format."""
    parsed: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _NAME_LINE.match(line.strip())
        if match:
            name = match.group(1)
            if not _QUERY_NAME.match(name):
                raise SqlFileError(f"{where}:{number}: query name {name!r} must match {_QUERY_NAME.pattern}")
            if name in parsed:
                raise SqlFileError(f"{where}:{number}: query {name!r} is defined twice")
            current = parsed[name] = []
        elif current is not None:
            stripped = line.strip()
            if current or (stripped and not stripped.startswith("--")):  # skip the doc lines under the name
                current.append(line)
        elif line.strip() and not line.strip().startswith("--"):
            raise SqlFileError(f"{where}:{number}: SQL before the first `-- name:` line")
    result = {}
    for name, lines in parsed.items():
        body = "\n".join(lines).strip()
        body = body[:-1].rstrip() if body.endswith(";") else body
        if not body:
            raise SqlFileError(f"{where}: query {name!r} is empty")
        result[name] = body
    return result
