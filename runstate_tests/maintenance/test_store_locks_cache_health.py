"""Table locks, the catalog cache, health snapshots and the orchestrator audit on a real Postgres."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from runstate.maintenance import (
    CachedTable,
    HealthSnapshot,
    InvalidIdentifier,
    MaintenanceStore,
    OrchestratorRun,
    TableRef,
    UnknownAction,
)
from runstate_tests.support.maintenance import store_sql as _sql


def _expire_lock(store: MaintenanceStore, table_key: str) -> None:
    _sql(
        store,
        "UPDATE table_locks SET expires_at = now() - interval '1 second' WHERE table_key = %s",
        table_key,
    )


# -------------------------------------------------------------------------------------------- locks


def test_live_lock_blocks_others_and_the_holder_can_extend_it(store: MaintenanceStore) -> None:
    assert store.acquire_table_lock("db.t", "job-a", 60)
    assert store.acquire_table_lock("db.t", "job-b", 60) is False
    assert store.acquire_table_lock("db.t", "job-a", 600)  # the holder extends its own lock
    lock = store.locks.table_lock(TableRef("db", "t"))
    assert lock is not None and lock["holder"] == "job-a" and lock["live"]
    assert lock["expires_at"] - lock["acquired_at"] > timedelta(seconds=500)


def test_only_an_expired_lock_can_be_taken_over(store: MaintenanceStore) -> None:
    assert store.acquire_table_lock("db.t", "job-a", 60)
    _expire_lock(store, "db.t")
    assert store.acquire_table_lock("db.t", "job-b", 60)
    assert store.locks.table_lock(TableRef("db", "t"))["holder"] == "job-b"  # type: ignore[index]
    assert store.release_table_lock("db.t", "job-a") is False  # the old holder cannot free it any more
    assert store.locks.table_lock(TableRef("db", "t"))["holder"] == "job-b"  # type: ignore[index]


def test_a_zero_ttl_lock_can_be_taken_over_at_once(store: MaintenanceStore) -> None:
    assert store.acquire_table_lock("db.t", "job-a", 0)
    assert store.acquire_table_lock("db.t", "job-b", 60)
    assert store.locks.table_lock(TableRef("db", "t"))["holder"] == "job-b"  # type: ignore[index]


def test_only_the_holder_releases(store: MaintenanceStore) -> None:
    assert store.acquire_table_lock("db.t", "job-a", 60)
    assert store.release_table_lock("db.t", "job-b") is False
    assert store.release_table_lock("db.t", "job-a") is True
    assert store.locks.table_lock(TableRef("db", "t")) is None
    assert store.acquire_table_lock("db.t", "job-b", 60)


def test_sweep_clears_only_expired_locks(store: MaintenanceStore) -> None:
    assert store.acquire_table_lock("db.old", "job-a", 60)
    assert store.acquire_table_lock("db.live", "job-b", 60)
    _expire_lock(store, "db.old")
    assert store.locks.sweep_expired_locks() == 1
    assert store.locks.table_lock(TableRef("db", "old")) is None
    assert store.locks.table_lock(TableRef("db", "live")) is not None
    assert store.locks.sweep_expired_locks() == 0


def test_concurrent_acquires_have_one_winner(store: MaintenanceStore) -> None:
    barrier = threading.Barrier(8)
    wins: list[str] = []

    def grab(holder: str) -> None:
        barrier.wait()
        if store.acquire_table_lock("db.hot", holder, 60):
            wins.append(holder)

    threads = [threading.Thread(target=grab, args=(f"job-{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
    assert store.locks.table_lock(TableRef("db", "hot"))["holder"] == wins[0]  # type: ignore[index]


@pytest.mark.parametrize(
    "key, holder, ttl", [("db.t;", "a", 60), ("dbt", "a", 60), ("db.t", "", 60), ("db.t", "a", -1)]
)
def test_bad_lock_arguments_are_rejected(store: MaintenanceStore, key: str, holder: str, ttl: float) -> None:
    with pytest.raises(ValueError):
        store.acquire_table_lock(key, holder, ttl)
    assert _sql(store, "SELECT count(*) FROM table_locks") == [(0,)]


# -------------------------------------------------------------------------------------------- cache


def test_replace_table_cache_swaps_the_inventory_and_stamps_the_sync(store: MaintenanceStore) -> None:
    assert store.cache.last_synced_at() is None
    assert (
        store.cache.replace_table_cache(
            [CachedTable("db", "a", True, {"location": "file:/a"}), CachedTable("db", "b")]
        )
        == 2
    )
    first_sync = store.cache.last_synced_at()
    assert first_sync is not None
    assert store.cache.replace_table_cache([CachedTable("db", "c", False), CachedTable("db", "d", True)]) == 2
    assert [(t.table_key, t.maintenance_enabled) for t in store.cache.cached_tables()] == [
        ("db.c", False),
        ("db.d", True),
    ]
    assert [t.table_key for t in store.cache.cached_tables(enabled_only=True)] == ["db.d"]
    assert store.cache.last_synced_at() >= first_sync  # type: ignore[operator]
    assert _sql(store, "SELECT count(*) FROM table_cache_meta") == [(1,)]


def test_bad_inventory_writes_nothing(store: MaintenanceStore) -> None:
    store.cache.replace_table_cache([CachedTable("db", "a", True, {"k": 1})])
    for bad in (
        [CachedTable("db", "ok"), CachedTable("db", "x'y")],
        [CachedTable("db", "ok"), CachedTable("db", "ok")],
        [CachedTable("db", "ok", "yes")],  # type: ignore[arg-type]
        [CachedTable("db", "ok", None, {"k": object()})],
    ):
        with pytest.raises(ValueError):
            store.cache.replace_table_cache(bad)
    assert [(t.table_key, t.payload) for t in store.cache.cached_tables()] == [("db.a", {"k": 1})]


def test_one_table_is_added_between_inventories_and_the_next_one_decides(store: MaintenanceStore) -> None:
    store.cache.replace_table_cache([CachedTable("db", "a", True)])
    synced = store.cache.last_synced_at()
    store.cache.add_cached_table(CachedTable("db", "b", True, {"added_by": "test"}))
    store.cache.add_cached_table(CachedTable("db", "a", False))  # refreshes the row, keeps one
    for bad in (
        CachedTable("db", "x'y"),
        CachedTable("db", "c", "yes"),
        CachedTable("db", "c", None, {"k": object()}),
    ):  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.cache.add_cached_table(bad)

    assert [(t.table_key, t.maintenance_enabled, t.payload) for t in store.cache.cached_tables()] == [
        ("db.a", False, {}),
        ("db.b", True, {"added_by": "test"}),
    ]
    assert store.cache.last_synced_at() == synced  # not an inventory
    store.cache.replace_table_cache([CachedTable("db", "a", True)])
    assert [t.table_key for t in store.cache.cached_tables()] == ["db.a"]


def test_readers_see_the_old_or_the_new_inventory_never_a_mix(store: MaintenanceStore) -> None:
    old = [CachedTable("old", f"t{i}") for i in range(200)]
    new = [CachedTable("new", f"t{i}") for i in range(200)]
    store.cache.replace_table_cache(old)
    seen: set[tuple[int, frozenset[str]]] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            tables = store.cache.cached_tables()
            seen.add((len(tables), frozenset(t.database for t in tables)))

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(5):
        store.cache.replace_table_cache(new)
        store.cache.replace_table_cache(old)
    stop.set()
    reader.join()
    assert seen <= {(200, frozenset({"old"})), (200, frozenset({"new"}))}


# ------------------------------------------------------------------------------------------- health


def _snapshot(table: str = "t", **values: object) -> HealthSnapshot:
    base: dict = dict(
        database="db",
        table=table,
        needs_maintenance=True,
        total_data_files=40,
        total_delete_files=3,
        total_size_bytes=4_000_000,
        avg_file_size_bytes=100_000.0,
        small_file_count=40,
        small_file_pct=100.0,
        snapshot_count=12,
        manifest_count=12,
        maintenance_enabled=True,
        maintenance_cadence_hours=6,
        recommended_actions=("rewrite_position_delete_files", "rewrite_data_files"),
        error=None,
        total_records=1000,
        snapshot_id=1234567890123,
        health_status="Unhealthy",
        hours_since_last_snapshot=0.5,
        oldest_snapshot_age_hours=30.0,
    )
    base.update(values)
    return HealthSnapshot(**base)


def test_health_snapshot_round_trips_every_column(store: MaintenanceStore) -> None:
    snapshot_id = store.history.insert_health_snapshot(_snapshot())
    latest = store.history.latest_health(TableRef("db", "t"))
    assert latest is not None and latest.id == snapshot_id and latest.checked_at is not None
    expected = _snapshot(recommended_actions=("rewrite_data_files", "rewrite_position_delete_files"))
    assert {**latest.__dict__, "id": None, "checked_at": None} == expected.__dict__


def test_latest_health_is_the_newest_row(store: MaintenanceStore) -> None:
    now = datetime.now(UTC)
    store.history.insert_health_snapshot(_snapshot(checked_at=now - timedelta(hours=2), total_data_files=40))
    store.history.insert_health_snapshot(
        _snapshot(checked_at=now, total_data_files=1, needs_maintenance=False)
    )
    store.history.insert_health_snapshot(_snapshot(table="other", checked_at=now + timedelta(seconds=1)))
    latest = store.history.latest_health(TableRef("db", "t"))
    assert latest is not None and latest.total_data_files == 1 and latest.needs_maintenance is False
    assert store.history.latest_health(TableRef("db", "none")) is None


def test_health_snapshot_accepts_a_row_mapping(store: MaintenanceStore) -> None:
    store.history.insert_health_snapshot(
        {"database_name": "db", "table_name": "t", "needs_maintenance": False}
    )
    latest = store.history.latest_health(TableRef("db", "t"))
    assert latest is not None and latest.health_status == "Unknown" and latest.recommended_actions == ()


@pytest.mark.parametrize(
    "bad",
    [{"table": "t; --"}, {"recommended_actions": ("vacuum",)}, {"needs_maintenance": None}, {"bogus": 1}],
)
def test_bad_health_rows_write_nothing(store: MaintenanceStore, bad: dict) -> None:
    row = {"database": "db", "table": "t", "needs_maintenance": True, **bad}
    with pytest.raises((ValueError, TypeError, InvalidIdentifier, UnknownAction)):
        store.history.insert_health_snapshot(row)
    assert _sql(store, "SELECT count(*) FROM health_snapshots") == [(0,)]


def test_prune_health_keeps_recent_rows_and_each_tables_newest(store: MaintenanceStore) -> None:
    now = datetime.now(UTC)
    store.history.insert_health_snapshot(_snapshot("a", checked_at=now - timedelta(days=40)))
    store.history.insert_health_snapshot(_snapshot("a", checked_at=now - timedelta(days=31)))
    store.history.insert_health_snapshot(_snapshot("a", checked_at=now - timedelta(days=1)))
    store.history.insert_health_snapshot(_snapshot("b", checked_at=now - timedelta(days=50)))
    store.history.insert_health_snapshot(_snapshot("b", checked_at=now - timedelta(days=45)))
    assert store.history.prune_health(30) == 3
    left = _sql(
        store,
        "SELECT table_name, round(extract(epoch FROM now() - checked_at) / 86400)"
        " FROM health_snapshots ORDER BY 1",
    )
    assert [(table, int(days)) for table, days in left] == [("a", 1), ("b", 45)]
    with pytest.raises(ValueError):
        store.history.prune_health(-1)


# ------------------------------------------------------------------------------------- orchestrator


def test_orchestrator_run_records_every_counter(store: MaintenanceStore) -> None:
    started = datetime.now(UTC) - timedelta(seconds=5)
    run = OrchestratorRun(
        started_at=started,
        completed_at=started + timedelta(seconds=4),
        status="success",
        tables_assessed=9,
        tables_skipped=3,
        tables_healthy=4,
        jobs_submitted=2,
        jobs_completed=1,
        jobs_failed=1,
        dry_run=True,
        error=None,
    )
    run_id = store.history.record_orchestrator_run(run)
    [stored] = store.history.orchestrator_runs()
    assert stored.id == run_id and stored.created_at is not None
    assert {**stored.__dict__, "id": None, "created_at": None} == run.__dict__
    second = store.history.record_orchestrator_run(
        started_at=started, completed_at=started, status="failed", error="catalog down"
    )
    assert [r.id for r in store.history.orchestrator_runs()] == [
        second,
        run_id,
    ]  # newest first, id breaks the tie
    with pytest.raises(ValueError):
        store.history.record_orchestrator_run(started_at=started, completed_at=started, status="")


def test_the_history_queries_name_every_field_of_their_rows():
    """history.sql spells its columns out; they must stay the fields of HealthSnapshot and OrchestratorRun."""
    from dataclasses import fields

    from runstate import sqlfiles
    from runstate.maintenance.models import HealthSnapshot, OrchestratorRun

    queries = sqlfiles.queries("postgres", "maintenance", "history.sql")
    health = {f.name for f in fields(HealthSnapshot)}
    runs = {f.name for f in fields(OrchestratorRun)}

    def parameters(name: str) -> set[str]:
        return set(re.findall(r"%\((\w+)\)s", queries[name]))

    def selected(name: str) -> set[str]:
        columns = queries[name].split("SELECT", 1)[1].split("FROM", 1)[0].split(",")
        return {column.split(" AS ")[-1].strip().strip('"') for column in columns}

    assert parameters("insert_health") == health - {"id"}
    assert selected("latest_health") == health
    assert parameters("insert_orchestrator_run") == runs - {"id", "created_at"}
    assert selected("orchestrator_runs") == runs
