"""The one validator for names that end up inside SQL text (Spark `CALL` arguments, table refs).

Bound parameters cannot carry identifiers, so every database, table and action name passes
here before it is interpolated anywhere. Each part must match `[A-Za-z_][A-Za-z0-9_]{0,127}`;
anything else (quotes, `;`, whitespace, dots inside a part, NUL, an empty part) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runstate.maintenance.errors import InvalidIdentifier, UnknownAction

IDENTIFIER_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
_IDENTIFIER_RE = re.compile(IDENTIFIER_PATTERN, re.ASCII)

# Execution order, chosen so each step works on what the previous one left:
# 1. rewrite_data_files compacts small files and folds position deletes into the rewritten files;
# 2. rewrite_position_delete_files compacts the delete files that are still live after that;
# 3. rewrite_manifests regroups manifests around the final data-file set;
# 4. expire_snapshots then drops the snapshots those rewrites superseded (and the files only they held);
# 5. remove_orphan_files goes last, so it compares storage with the final set of referenced files.
ACTIONS: tuple[str, ...] = (
    "rewrite_data_files",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
    "remove_orphan_files",
)
_ACTION_RANK = {name: rank for rank, name in enumerate(ACTIONS)}
# A request that names no action (the CLI's submit, the launchpad's submit_maintenance) gets every
# action but remove_orphan_files: deleting files is only done when asked for.
DEFAULT_ACTIONS: tuple[str, ...] = tuple(name for name in ACTIONS if name != "remove_orphan_files")

# Applying a merge-on-read table's delete files: every data file with deletes is rewritten with them
# applied (and small files compacted), then the delete files left dangling are dropped. A job of these
# actions alone may come as often as a table's merges need it: the orchestrator's cadence ignores it.
APPLY_DELETES_ACTIONS: tuple[str, ...] = ("rewrite_data_files", "rewrite_position_delete_files")
APPLY_DELETES_OPTIONS: dict[str, int] = {"delete_file_threshold": 1}


def validate_identifier(value: object, what: str = "identifier") -> str:
    """Return `value` unchanged when it is one safe identifier part, else raise InvalidIdentifier."""
    if not isinstance(value, str):
        raise InvalidIdentifier(f"{what} must be a string, got {type(value).__name__}")
    # fullmatch, not match+$: `$` would accept a trailing newline.
    if not _IDENTIFIER_RE.fullmatch(value):
        raise InvalidIdentifier(
            f"{what} {value!r} is not a valid identifier (each part must match {IDENTIFIER_PATTERN})"
        )
    return value


@dataclass(frozen=True)
class TableRef:
    """A validated `database.table` pair; constructing one validates both parts."""

    database: str
    table: str

    def __post_init__(self) -> None:
        validate_identifier(self.database, "database name")
        validate_identifier(self.table, "table name")

    @property
    def key(self) -> str:
        """`db.table`: the table_locks key and the `table =>` argument of Iceberg procedures."""
        return f"{self.database}.{self.table}"

    @property
    def quoted(self) -> str:
        """`` `db`.`table` `` for Spark SQL text."""
        return f"`{self.database}`.`{self.table}`"

    def in_catalog(self, catalog: str) -> str:
        """`` catalog.`db`.`table` ``, e.g. for `SELECT ... FROM lake.`db`.`t`.files`."""
        return f"{validate_identifier(catalog, 'catalog name')}.{self.quoted}"

    def __str__(self) -> str:
        return self.key


def parse_table_ref(value: object) -> TableRef:
    """Parse `"db.table"` into a TableRef; exactly two valid parts, nothing else."""
    if not isinstance(value, str):
        raise InvalidIdentifier(
            f"table reference must be a string 'database.table', got {type(value).__name__}"
        )
    parts = value.split(".")
    if len(parts) != 2:
        raise InvalidIdentifier(f"table reference {value!r} must be exactly 'database.table'")
    return TableRef(parts[0], parts[1])


def validate_actions(actions: Iterable[str] | str) -> tuple[str, ...]:
    """Known actions, deduplicated, in `ACTIONS` order. A string is read as a comma-separated list."""
    if actions is None or isinstance(actions, (bytes, Mapping)):
        raise UnknownAction(f"actions must be a list of names, got {type(actions).__name__}")
    if isinstance(actions, str):
        names = [part.strip() for part in actions.split(",") if part.strip()]
    else:
        try:
            names = list(actions)
        except TypeError:
            raise UnknownAction(f"actions must be a list of names, got {type(actions).__name__}") from None
    if not names:
        raise UnknownAction(f"no maintenance action given; choose from {', '.join(ACTIONS)}")
    unknown = [name for name in names if not isinstance(name, str) or name not in _ACTION_RANK]
    if unknown:
        shown = ", ".join(repr(name) for name in unknown[:5])
        raise UnknownAction(f"unknown maintenance action(s) {shown}; choose from {', '.join(ACTIONS)}")
    return tuple(sorted(set(names), key=_ACTION_RANK.__getitem__))
