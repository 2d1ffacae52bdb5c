"""runstate.backends: a backend is its module and one registry entry; everything that chooses a backend
asks the registry (here with the in-memory backend of runstate_tests/eventstore/memory_backend.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from runstate import backends, migrations, wiring
from runstate.config import ConfigError, Settings
from runstate.eventstore import NewEvent
from runstate.eventstore.config import EventStoreConfig
from runstate_tests.eventstore.memory_backend import MEMORY
from runstate_tests.support.databases import unique


def test_a_registered_backend_is_a_setting_that_wiring_builds():
    schema = unique("m")
    with backends.registered(MEMORY):
        s = Settings.from_env({"RUNSTATE_EVENTSTORE": "memory", "RUNSTATE_SCHEMA": schema})
        config = EventStoreConfig.from_settings(s)
        wiring.require_schema("eventstore", "memory", config)  # it keeps no schema: always current
        with wiring.event_store(config) as store:
            store.append(NewEvent("r1", "RunStarted", datetime(2026, 1, 1, tzinfo=UTC)))
        with wiring.event_store(config) as again:  # another store on the same schema's tables
            stored = again.fetch("r1")
        datastore = backends.get("memory").build_datastore(config)
        upgraded, status = migrations.upgrade_all(datastore), migrations.status(datastore, "eventstore")

    assert s.eventstore == "memory"
    assert [(e.run_seq, e.event_type) for e in stored] == [(1, "RunStarted")]
    assert upgraded == {} and status == []


def test_an_unregistered_backend_is_refused_naming_the_known_ones():
    with pytest.raises(
        ConfigError, match="RUNSTATE_EVENTSTORE must be one of postgres, snowflake, got 'memory'"
    ):
        Settings.from_env({"RUNSTATE_EVENTSTORE": "memory"})
    with pytest.raises(backends.UnknownBackend, match="one of postgres, snowflake, got 'oracle'"):
        wiring.event_store(EventStoreConfig(), "oracle")


def test_a_registration_for_a_block_leaves_the_registry_as_it_was():
    with backends.registered(MEMORY):
        assert backends.names() == ("postgres", "snowflake", "memory")

    assert backends.names() == ("postgres", "snowflake")


def test_reading_the_registry_imports_no_database_driver():
    code = (
        "import sys\n"
        "from runstate import backends, config\n"
        "assert backends.names() == ('postgres', 'snowflake')\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool', 'runstate')]\n"
        "assert not [m for m in loaded if not m.startswith('runstate')], loaded\n"
        "assert 'runstate.eventstore' not in loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
