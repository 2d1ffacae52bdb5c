"""Health and audit history: `health_snapshots` (one row per analysis) and `orchestrator_runs`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from psycopg.rows import dict_row

from runstate import sqlfiles
from runstate.maintenance.db import Database
from runstate.maintenance.errors import InvalidInput
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import HealthSnapshot, OrchestratorRun
from runstate.maintenance.validation import flag, non_empty_text, positive_int, recommended_actions

_sql = sqlfiles.named("postgres", "maintenance", "history.sql")


_RUN_VALUE_COLUMNS = tuple(f.name for f in fields(OrchestratorRun) if f.name not in ("id", "created_at"))


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
        return int(self.db.fetchone(_sql("insert_health"), params)[0])

    def latest_health(self, ref: TableRef) -> HealthSnapshot | None:
        with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(_sql("latest_health"), (ref.database, ref.table)).fetchone()
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
        return self.db.rowcount(_sql("prune_health"), {"keep_days": float(keep_days)})

    def record_orchestrator_run(self, run: OrchestratorRun | None = None, **values: Any) -> int:
        """Append one orchestrator_runs row (a dataclass, or its fields as keywords); returns its id."""
        if run is None:
            run = OrchestratorRun(**values)
        elif values:
            raise InvalidInput("pass either an OrchestratorRun or keyword fields, not both")
        non_empty_text(run.status, "orchestrator run status")
        params = {name: getattr(run, name) for name in _RUN_VALUE_COLUMNS}
        return int(self.db.fetchone(_sql("insert_orchestrator_run"), params)[0])

    def orchestrator_runs(self, limit: int = 20) -> list[OrchestratorRun]:
        with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(_sql("orchestrator_runs"), (positive_int(limit, "limit"),)).fetchall()
        return [OrchestratorRun(**row) for row in rows]


def _snapshot_from_mapping(snapshot: Mapping[str, Any]) -> HealthSnapshot:
    values = dict(snapshot)
    values.setdefault("database", values.pop("database_name", None))
    values.setdefault("table", values.pop("table_name", None))
    unknown = set(values) - {f.name for f in fields(HealthSnapshot)}
    if unknown:
        raise InvalidInput(f"health snapshot has unknown column(s) {sorted(unknown)}")
    return HealthSnapshot(**values)
