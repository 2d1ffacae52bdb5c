"""Health and audit history: `health_snapshots` (one row per analysis) and `orchestrator_runs`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from psycopg.rows import dict_row

from runstate.maintenance.db import Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.identifiers import parse_table_ref
from runstate.maintenance.models import HealthSnapshot, OrchestratorRun
from runstate.maintenance.validation import flag, non_empty_text, positive_int, recommended_actions

_HEALTH_VALUE_COLUMNS = tuple(
    f.name for f in fields(HealthSnapshot) if f.name not in ("database", "table", "id", "checked_at")
)
INSERT_HEALTH_SQL = (
    "INSERT INTO health_snapshots (database_name, table_name, checked_at, "
    + ", ".join(_HEALTH_VALUE_COLUMNS)
    + ") VALUES (%(database)s, %(table)s, COALESCE(%(checked_at)s, now()), "
    + ", ".join(f"%({name})s" for name in _HEALTH_VALUE_COLUMNS)
    + ") RETURNING id"
)
_HEALTH_SELECT = (
    'SELECT id, database_name AS database, table_name AS "table", checked_at, '
    + ", ".join(_HEALTH_VALUE_COLUMNS)
    + " FROM health_snapshots"
)
LATEST_HEALTH_SQL = (
    _HEALTH_SELECT + " WHERE database_name = %s AND table_name = %s ORDER BY checked_at DESC, id DESC LIMIT 1"
)
# Retention keeps the newest row of every table however old: cached health reads need one.
PRUNE_HEALTH_SQL = """
DELETE FROM health_snapshots h
WHERE h.checked_at < now() - make_interval(secs => %(keep_days)s * 86400)
  AND h.id NOT IN (
      SELECT DISTINCT ON (database_name, table_name) id FROM health_snapshots
      ORDER BY database_name, table_name, checked_at DESC, id DESC)
"""

_RUN_VALUE_COLUMNS = tuple(f.name for f in fields(OrchestratorRun) if f.name not in ("id", "created_at"))
INSERT_ORCHESTRATOR_RUN_SQL = (
    "INSERT INTO orchestrator_runs ("
    + ", ".join(_RUN_VALUE_COLUMNS)
    + ") VALUES ("
    + ", ".join(f"%({name})s" for name in _RUN_VALUE_COLUMNS)
    + ") RETURNING id"
)
ORCHESTRATOR_RUNS_SQL = (
    "SELECT id, created_at, " + ", ".join(_RUN_VALUE_COLUMNS) + " FROM orchestrator_runs"
    " ORDER BY started_at DESC, id DESC LIMIT %s"
)


class History:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_health_snapshot(self, snapshot: HealthSnapshot | Mapping[str, Any]) -> int:
        """Append one health row; returns its id. A mapping may use database/table or *_name keys."""
        if not isinstance(snapshot, HealthSnapshot):
            snapshot = _snapshot_from_mapping(snapshot)
        ref = snapshot.ref
        params = asdict(snapshot)
        params.update(
            database=ref.database,
            table=ref.table,
            needs_maintenance=flag(snapshot.needs_maintenance, "needs_maintenance"),
            recommended_actions=list(recommended_actions(snapshot.recommended_actions)),
        )
        params.pop("id")
        return int(self.db.fetchone(INSERT_HEALTH_SQL, params)[0])

    def latest_health(self, table_key: str) -> HealthSnapshot | None:
        ref = parse_table_ref(table_key)
        with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(LATEST_HEALTH_SQL, (ref.database, ref.table)).fetchone()
        if row is None:
            return None
        row["recommended_actions"] = tuple(row["recommended_actions"] or ())
        return HealthSnapshot(**row)

    def prune_health(self, keep_days: float) -> int:
        """Delete health rows older than keep_days, always keeping each table's newest row."""
        if (
            isinstance(keep_days, bool)
            or not isinstance(keep_days, (int, float))
            or not 0 <= keep_days <= 36500
        ):
            raise InvalidInput(f"keep_days must be a number of days from 0 to 36500, got {keep_days!r}")
        return self.db.rowcount(PRUNE_HEALTH_SQL, {"keep_days": float(keep_days)})

    def record_orchestrator_run(self, run: OrchestratorRun | None = None, **values: Any) -> int:
        """Append one orchestrator_runs row (a dataclass, or its fields as keywords); returns its id."""
        if run is None:
            run = OrchestratorRun(**values)
        elif values:
            raise InvalidInput("pass either an OrchestratorRun or keyword fields, not both")
        non_empty_text(run.status, "orchestrator run status")
        params = {name: getattr(run, name) for name in _RUN_VALUE_COLUMNS}
        return int(self.db.fetchone(INSERT_ORCHESTRATOR_RUN_SQL, params)[0])

    def orchestrator_runs(self, limit: int = 20) -> list[OrchestratorRun]:
        with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(ORCHESTRATOR_RUNS_SQL, (positive_int(limit, "limit"),)).fetchall()
        return [OrchestratorRun(**row) for row in rows]


def _snapshot_from_mapping(snapshot: Mapping[str, Any]) -> HealthSnapshot:
    values = dict(snapshot)
    values.setdefault("database", values.pop("database_name", None))
    values.setdefault("table", values.pop("table_name", None))
    unknown = set(values) - {f.name for f in fields(HealthSnapshot)}
    if unknown:
        raise InvalidInput(f"health snapshot has unknown column(s) {sorted(unknown)}")
    return HealthSnapshot(**values)
