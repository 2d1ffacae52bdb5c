"""Run heartbeats and first sightings, stamped and aged by one clock: the run storage database's.

A heartbeat is a row of Dagster's key-value table (`kvs`, beside the runs it speaks for; no schema of
ours to migrate) whose value is the database's own time when it was written, and a reader asks the same
database how old it is. Neither the writer's clock nor the reader's enters: a pod whose clock is a
minute off, or a clock stepped forward, changes no verdict. A sighting is the same kind of row, written
by the first liveness check that finds a run in progress without a heartbeat: a run that never beats
gets its grace from there, again by the database's clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg
import sqlalchemy as sa
from dagster._core.storage.runs.schema import KeyValueStoreTable
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

BEAT_PREFIX = "runstate.heartbeat."
SEEN_PREFIX = "runstate.seen."
# Where a run's process runs (runstate.defs.runs.workers): its value is text, not a time.
WORKER_PREFIX = "runstate.worker."
AGE_PREFIXES = (BEAT_PREFIX, SEEN_PREFIX)
PREFIXES = (*AGE_PREFIXES, WORKER_PREFIX)


class db_epoch(FunctionElement):  # noqa: N801 - reads as the SQL function it compiles to
    """The database's current time in seconds since the epoch (fractional), in the database's own SQL."""

    type = sa.Float()
    inherit_cache = True


@compiles(db_epoch)
def _epoch_standard(element: db_epoch, compiler: Any, **kw: Any) -> str:  # Postgres and the SQL standard
    return "EXTRACT(EPOCH FROM CURRENT_TIMESTAMP)"


@compiles(db_epoch, "sqlite")
def _epoch_sqlite(element: db_epoch, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_epoch, "mysql")
def _epoch_mysql(element: db_epoch, compiler: Any, **kw: Any) -> str:
    return "UNIX_TIMESTAMP(CURRENT_TIMESTAMP(6))"


@dataclass(frozen=True)
class Ages:
    """How old a run's heartbeat and first sighting are, by the database's clock (None: there is none)."""

    beat_s: float | None = None
    seen_s: float | None = None


def _connect(instance: dg.DagsterInstance) -> Any:
    return instance.run_storage.connect()  # every SQL run storage (Postgres, MySQL, SQLite) has it


def _stamp(conn: Any, key: str, age_s: float, *, overwrite: bool) -> None:
    value = sa.cast(db_epoch() - age_s, sa.Text)
    if overwrite:
        updated = conn.execute(
            KeyValueStoreTable.update().where(KeyValueStoreTable.c.key == key).values(value=value)
        )
        if updated.rowcount:
            return
    try:
        conn.execute(KeyValueStoreTable.insert().values(key=key, value=value))
    except IntegrityError:  # another writer stamped it first: a beat overwrites, a sighting keeps the first
        if overwrite:
            conn.execute(
                KeyValueStoreTable.update().where(KeyValueStoreTable.c.key == key).values(value=value)
            )


def beat(instance: dg.DagsterInstance, run_id: str, *, age_s: float = 0.0) -> None:
    """Record that `run_id` is alive now (`age_s`: a beat that old, as a test of a stale run writes it)."""
    with _connect(instance) as conn:
        _stamp(conn, BEAT_PREFIX + run_id, age_s, overwrite=True)


def mark_seen(instance: dg.DagsterInstance, run_ids: Iterable[str], *, age_s: float = 0.0) -> None:
    """Record the first sighting of each run without a heartbeat; a run seen before keeps its first."""
    with _connect(instance) as conn:
        for run_id in run_ids:
            _stamp(conn, SEEN_PREFIX + run_id, age_s, overwrite=False)


def ages(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, Ages]:
    """The heartbeat and sighting ages of each run that has either (one query for all of them)."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return {}
    keys = [prefix + run_id for run_id in ids for prefix in AGE_PREFIXES]
    query = sa.select(KeyValueStoreTable.c.key, KeyValueStoreTable.c.value, db_epoch()).where(
        KeyValueStoreTable.c.key.in_(keys)
    )
    with _connect(instance) as conn:
        rows = conn.execute(query).fetchall()
    found: dict[str, dict[str, float]] = {}
    for key, value, now in rows:
        prefix = BEAT_PREFIX if key.startswith(BEAT_PREFIX) else SEEN_PREFIX
        try:
            found.setdefault(key[len(prefix) :], {})[prefix] = max(0.0, float(now) - float(value))
        except (TypeError, ValueError):  # a value not written by us: as if there were none
            continue
    return {run_id: Ages(v.get(BEAT_PREFIX), v.get(SEEN_PREFIX)) for run_id, v in found.items()}


def record_worker(instance: dg.DagsterInstance, run_id: str, worker: str) -> None:
    """Record where `run_id`'s process runs (written once, when it starts to beat)."""
    key = WORKER_PREFIX + run_id
    with _connect(instance) as conn:
        conn.execute(KeyValueStoreTable.delete().where(KeyValueStoreTable.c.key == key))
        conn.execute(KeyValueStoreTable.insert().values(key=key, value=worker))


def worker_of(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """What `record_worker` recorded for `run_id`, if anything."""
    return workers_of(instance, [run_id]).get(run_id)


def workers_of(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, str]:
    """What `record_worker` recorded for each of the runs that have a record (one query for all)."""
    keys = [WORKER_PREFIX + run_id for run_id in dict.fromkeys(run_ids)]
    if not keys:
        return {}
    query = sa.select(KeyValueStoreTable.c.key, KeyValueStoreTable.c.value).where(
        KeyValueStoreTable.c.key.in_(keys)
    )
    with _connect(instance) as conn:
        return {key[len(WORKER_PREFIX) :]: value for key, value in conn.execute(query).fetchall()}


def beat_ages(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, float]:
    """The age of each run's last heartbeat, for the runs that have one."""
    return {run_id: a.beat_s for run_id, a in ages(instance, run_ids).items() if a.beat_s is not None}


def forget(
    instance: dg.DagsterInstance, run_ids: Iterable[str], *, prefixes: tuple[str, ...] = PREFIXES
) -> None:
    """Drop the heartbeats and sightings of runs that ended, so the key-value table does not grow (or,
    with `prefixes`, only those rows: the sightings of runs back in the queue)."""
    keys = [prefix + run_id for run_id in run_ids for prefix in prefixes]
    if not keys:
        return
    with _connect(instance) as conn:
        conn.execute(KeyValueStoreTable.delete().where(KeyValueStoreTable.c.key.in_(keys)))


def tracked_run_ids(instance: dg.DagsterInstance, limit: int = 1000) -> list[str]:
    """Runs that have a heartbeat or a sighting row (for the sweep of the rows of runs that ended)."""
    query = (
        sa.select(KeyValueStoreTable.c.key)
        .where(sa.or_(*(KeyValueStoreTable.c.key.like(prefix + "%") for prefix in PREFIXES)))
        .limit(limit)
    )
    with _connect(instance) as conn:
        keys = [row[0] for row in conn.execute(query).fetchall()]
    return list(dict.fromkeys(key.split(".", 2)[2] for key in keys))
