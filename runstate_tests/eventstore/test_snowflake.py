"""Snowflake-only behaviour, through fakesnow's server and the real connector."""

from __future__ import annotations

import re

import pytest

from runstate import sqlfiles
from runstate.eventstore import EventType, SnowflakeEventStore
from runstate.migrations import discover
from runstate_tests.support.events import ev


def test_ensure_schema_is_idempotent_and_creates_the_tables(sf_store, snowflake_schema):
    import snowflake.connector

    sf_store.ensure_schema()
    kwargs, schema = snowflake_schema
    conn = snowflake.connector.connect(**kwargs)
    cur = conn.cursor()
    cur.execute(
        "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1", (schema,)
    )
    tables = {r[0] for r in cur.fetchall()}
    conn.close()
    assert {
        "RUN_EVENTS",
        "RUN_SNAPSHOTS",
        "RUN_STATE_SNAPSHOTS",
        "RUN_STREAMS",
        "RUN_EVENTS_ARCHIVE",
    } <= tables


def test_ddl_clusters_run_events_by_run_and_persisted_at():
    ddl = (sqlfiles.folder("snowflake", "eventstore") / "001_eventstore.sql").read_text()

    assert re.search(r"ENGINE_RUN_REF\s+VARIANT\s*\)\s*CLUSTER BY \(RUN_ID, PERSISTED_AT\)", ddl)
    assert "EVENT_DATA          VARIANT" in ddl


def test_stored_procedure_ships_but_is_not_applied():
    text = (sqlfiles.folder("snowflake", "eventstore") / "procedures" / "append_event.sql").read_text()

    assert "append_event" not in {m.name for m in discover("snowflake", "eventstore")}
    assert "UNTESTED" in text
    assert re.search(r"INSERT INTO RUN_EVENTS \([^)]*\)\s*SELECT[^;]*PARSE_JSON", text)
    assert not re.search(r"VALUES\s*\([^)]*PARSE_JSON", text)


def test_fakesnow_cannot_merge_inside_a_transaction_so_the_anti_join_runs(sf_store):
    sf_store.append(ev("r1", EventType.RUN_STARTED))

    assert sf_store.backend.merge_in_transactions is False  # probed against the live server, not assumed
    assert sf_store.append(ev("r1", EventType.RUN_STARTED)).idempotent


def test_needs_exactly_one_way_to_connect(snowflake_schema):
    with pytest.raises(ValueError, match="exactly one"):
        SnowflakeEventStore(schema="X")
    with pytest.raises(ValueError):
        SnowflakeEventStore(connect_kwargs={}, schema="bad-name")
