"""fakesnow's Snowflake-compatible HTTP server on a free loopback port, detached from the CLI.

fakesnow keeps its databases in memory, so a restarted server starts empty: `up` creates the
database and applies the Snowflake migrations every time it starts one.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping

from runstate import migrations
from runstate.datastore import SnowflakeDatastore, check_schema_name
from runstate.services.http import http_answers
from runstate.services.state import (
    LOOPBACK,
    ServiceRecord,
    embedded_service,
    external_record,
    port_answers,
    require_module,
)

# Not "RUNSTATE": fakesnow (duckdb) finds RUNSTATE.RUNSTATE ambiguous once the schema shares the name.
DATABASE = "RUNSTATE_DEV"
FAKE_CREDENTIALS = {"SNOWFLAKE_ACCOUNT": "fakesnow", "SNOWFLAKE_USER": "fake", "SNOWFLAKE_PASSWORD": "snow"}


def healthy(url: str) -> bool:
    return http_answers(url)


def fakesnow_argv(port: int) -> list[str]:
    """fakesnow's server with its failed statements answered as Snowflake answers them."""
    return [
        sys.executable,
        "-m",
        "runstate.services.fakesnow_server",
        "-s",
        "--host",
        LOOPBACK,
        "-p",
        str(port),
    ]


def ensure_fakesnow(
    caller_env: Mapping[str, str], previous: ServiceRecord | None, *, port: int | None = None
) -> ServiceRecord:
    if caller_env.get("SNOWFLAKE_HOST"):
        host = caller_env["SNOWFLAKE_HOST"]
        remote_port = int(caller_env.get("SNOWFLAKE_PORT") or 443)
        protocol = caller_env.get("SNOWFLAKE_PROTOCOL", "https")
        return external_record(
            "fakesnow",
            f"{protocol}://{host}:{remote_port}",
            answers=port_answers(remote_port, host=host, timeout=3),
            fix=f"SNOWFLAKE_HOST={host}:{remote_port} does not answer. Fix SNOWFLAKE_HOST/"
            "SNOWFLAKE_PORT, or unset them to let `runstate services up` start fakesnow.",
        )
    require_module("fakesnow", ("fakesnow", "uvicorn", "starlette"), "fakesnow[server]")
    return embedded_service(
        "fakesnow", previous, port=port, port_option="--fakesnow-port", argv=fakesnow_argv, healthy=healthy
    )


def connection_kwargs(port: int, database: str = DATABASE) -> dict:
    return dict(
        host=LOOPBACK,
        port=port,
        protocol="http",
        account=FAKE_CREDENTIALS["SNOWFLAKE_ACCOUNT"],
        user=FAKE_CREDENTIALS["SNOWFLAKE_USER"],
        password=FAKE_CREDENTIALS["SNOWFLAKE_PASSWORD"],
        database=database,
        network_timeout=10,
        session_parameters={"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False},
    )


def prepare_database(port: int, schema: str, database: str = DATABASE) -> list[migrations.Migration]:
    """CREATE DATABASE IF NOT EXISTS, then the Snowflake migrations into `schema`."""
    import snowflake.connector

    with contextlib.closing(snowflake.connector.connect(**connection_kwargs(port, database))) as conn:
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {check_schema_name(database)}")
    store = SnowflakeDatastore(connection_kwargs(port, database), schema=schema, pool_size=1)
    try:
        return [m for applied in migrations.upgrade_all(store).values() for m in applied]
    finally:
        store.close()
