"""The run state store's one frozen configuration, parsed once from the Settings (or from the Dagster
resource's fields): which backend, and where each backend's tables live. Each field's metadata hold its
description, which the Dagster resources, whose fields are derived from these, show.

Every backend's datastore is built from it (`runstate.backends`' `datastore` entries), so the CLI, the
Dagster resource and `runstate db` open the same connections with the same options. The Postgres tables
of the other domains live beside the event store's (RUNSTATE_PG_URL, RUNSTATE_SCHEMA): `runstate db`
migrates them through the same datastores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runstate import backends, defaults
from runstate.config import ARCHIVE_TARGETS, LAKE_NAMESPACE, Settings
from runstate.eventstore.snapshots import DEFAULT_SNAPSHOT_INTERVAL

# A wrong host or port should fail in seconds, not after the connector's default of two minutes.
SNOWFLAKE_LOGIN_TIMEOUT_S = 20
# Against a local emulator (plain http) only its own bugs answer HTTP 500, which the connector retries
# until network_timeout (unset: for ever): give up after a second rather than never.
SNOWFLAKE_HTTP_NETWORK_TIMEOUT_S = 1
SNOWFLAKE_SCHEMA = defaults.SNOWFLAKE_SCHEMA


@dataclass(frozen=True)
class SnowflakeConfig:
    """The SNOWFLAKE_* settings: what `snowflake.connector.connect()` is given, on every path."""

    account: str = field(metadata={"description": "Snowflake account identifier."})
    user: str | None = field(default=None, metadata={"description": "User name."})
    password: str | None = field(
        default=None, repr=False, metadata={"description": "Password (pass it as an EnvVar)."}
    )
    database: str | None = field(
        default=None, metadata={"description": "Database holding the event store schema."}
    )
    warehouse: str | None = field(default=None, metadata={"description": "Warehouse the queries run in."})
    role: str | None = field(default=None, metadata={"description": "Role the connection takes."})
    host: str | None = field(
        default=None, metadata={"description": "Endpoint host, when not the account's default."}
    )
    port: int | None = field(
        default=None, metadata={"description": "Endpoint port, when not the protocol's default."}
    )
    protocol: str | None = field(
        default=None, metadata={"description": "`https` (default) or `http` (a local endpoint)."}
    )
    network_timeout: int | None = field(
        default=None,
        metadata={"description": "Seconds before the connector gives up (default: for ever; 1 over http)."},
    )

    @classmethod
    def from_settings(cls, values: Mapping[str, str]) -> SnowflakeConfig | None:
        """From `Settings.snowflake` (SNOWFLAKE_ACCOUNT -> account, ...); None without an account."""
        if not values.get("account"):
            return None
        names = ("user", "password", "database", "warehouse", "role", "host", "protocol")
        text = {name: values.get(name) or None for name in names}
        numbers = {name: int(values[name]) for name in ("port", "network_timeout") if values.get(name)}
        return cls(account=values["account"], **text, **numbers)

    def connect_kwargs(self) -> dict[str, Any]:
        """The connector's arguments: the values that are set, plus the timeouts and session options
        every runstate connection takes."""
        names = ("account", "user", "password", "database", "warehouse", "role", "host", "port", "protocol")
        kwargs: dict[str, Any] = {name: getattr(self, name) for name in names if getattr(self, name)}
        if self.network_timeout:
            kwargs["network_timeout"] = self.network_timeout
        elif self.protocol == "http":
            kwargs["network_timeout"] = SNOWFLAKE_HTTP_NETWORK_TIMEOUT_S
        kwargs["login_timeout"] = SNOWFLAKE_LOGIN_TIMEOUT_S
        # Out-of-band telemetry posts to Snowflake's own endpoint: it has no business running from here.
        kwargs["session_parameters"] = {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False}
        return kwargs


def snowflake_config(s: Settings) -> SnowflakeConfig | None:
    """The snowflake backend's connection (its `runstate.backends` entry's `connection`): SNOWFLAKE_*."""
    return SnowflakeConfig.from_settings(s.backend_env.get("snowflake", {}))


@dataclass(frozen=True)
class EventStoreConfig:
    """The backend behind the store (RUNSTATE_EVENTSTORE), each backend's connection and schema, the
    snapshot interval, and where `archive` moves old runs (RUNSTATE_ARCHIVE_TO). `snowflake` is None when
    no Snowflake account is configured.

    `lake_namespace` and `lake_warehouse` say where runs archived to the lake are read back from: the run
    history's namespace (RUNSTATE_HISTORY_NAMESPACE) in the JDBC catalog of `pg_url`'s database, whose
    warehouse is `lake_warehouse` (None: RUNSTATE_WAREHOUSE's default).

    A backend whose connection needs values of its own has a field of its name holding its connection's
    config (`runstate.backends`: its entry's `connection` parses it from the Settings)."""

    backend: str = field(default=Settings.eventstore, metadata={"description": "`postgres` or `snowflake`."})
    pg_url: str = field(
        default=Settings.pg_url,
        metadata={
            "description": "Postgres DSN (postgres backend); pass it as an EnvVar when it holds a password."
        },
    )
    pg_schema: str = field(
        default=Settings.schema, metadata={"description": "Postgres schema holding the event tables."}
    )
    snowflake: SnowflakeConfig | None = field(
        default=None,
        metadata={
            "description": "Connection to Snowflake (snowflake backend, and the target of migrations)."
        },
    )
    snowflake_schema: str = field(
        default=SNOWFLAKE_SCHEMA, metadata={"description": "Snowflake schema holding the event tables."}
    )
    snapshot_interval: int = field(
        default=DEFAULT_SNAPSHOT_INTERVAL,
        metadata={"description": "Write a state snapshot every N events of a run."},
    )
    archive_to: str = field(
        default=Settings.archive_to,
        metadata={
            "description": "Where `archive` moves old runs: `postgres` (run_events_archive) or `lake` (dropped "
            "from Postgres once the run history in the lake has them; read back from there)."
        },
    )
    lake_namespace: str = field(
        default=Settings.history_namespace,
        metadata={
            "description": "The run history's namespace: runs archived to the lake are in "
            "lake.<namespace>.run_events."
        },
    )
    lake_warehouse: str | None = field(
        default=None,
        metadata={
            "description": "The Iceberg warehouse folder of the lake catalog (default: RUNSTATE_WAREHOUSE's "
            "default)."
        },
    )

    def __post_init__(self) -> None:
        if self.archive_to not in ARCHIVE_TARGETS:
            raise ValueError(
                f"RUNSTATE_ARCHIVE_TO must be one of {', '.join(ARCHIVE_TARGETS)}, got {self.archive_to!r}"
            )
        if not isinstance(self.lake_namespace, str) or not LAKE_NAMESPACE.match(self.lake_namespace):
            raise ValueError(
                f"RUNSTATE_HISTORY_NAMESPACE must be a lower-case identifier, got {self.lake_namespace!r}"
            )

    @classmethod
    def from_settings(cls, s: Settings) -> EventStoreConfig:
        return cls(
            backend=s.eventstore,
            pg_url=s.pg_url,
            pg_schema=s.schema,
            **cls.connections_from_settings(s),
            # SNOWFLAKE_SCHEMA: the schema of the Snowflake event store and its migrations.
            snowflake_schema=(s.snowflake.get("schema") or cls.snowflake_schema).upper(),
            archive_to=s.archive_to,
            lake_namespace=s.history_namespace,
            lake_warehouse=str(s.warehouse_dir),
        )

    @classmethod
    def connections_from_settings(cls, s: Settings) -> dict[str, Any]:
        """Each backend's connection config by its name, as the registry's entries parse them."""
        fields = {f.name for f in dataclasses.fields(cls)}
        connections = {}
        for entry in backends.with_connections():
            if entry.name not in fields:
                raise TypeError(f"backend {entry.name!r} has a connection: EventStoreConfig needs its field")
            connections[entry.name] = entry.connection_config(s)
        return connections
