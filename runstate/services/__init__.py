"""The embedded dev services behind `runstate services up|down|status` (no Dagster here).

`up` chooses or starts Postgres, a moto server and a fakesnow server, creates the databases,
applies the migrations, and writes the chosen endpoints to a block of the project's `.env` (read by
`runstate.config` and by Dagster's CLI) and the pids to `.runstate/services.json`. It is idempotent: healthy
services
are reused. `down` stops only what `up` started, by recorded pid and start time.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runstate import defaults
from runstate.config import Settings, state_dir
from runstate.services import fakesnow, moto, postgres, spark_cluster
from runstate.services.env_file import remove_env_block, user_env_values, write_env_file
from runstate.services.state import (
    EMBEDDED,
    EXTERNAL,
    SERVICE_NAMES,
    ServiceError,
    ServiceRecord,
    is_running,
    load_records,
    require_free_port,
    save_records,
    services_file,
    services_lock,
    stop_process,
)

__all__ = [
    "ServiceError",
    "ServiceRecord",
    "UpReport",
    "StatusRow",
    "up",
    "down",
    "status",
    "caller_environment",
]


# Where an older `up` wrote the endpoints, before they moved to the project's `.env`.
def LEGACY_ENV_FILE() -> Path:  # noqa: N802
    return state_dir() / "env"


# Postgres shuts down fast (rolls back, closes clients) on SIGINT; SIGTERM would wait for every client.
STOP_SIGNALS = {"postgres": signal.SIGINT, "moto": signal.SIGTERM, "fakesnow": signal.SIGTERM}


@dataclass
class UpReport:
    records: dict[str, ServiceRecord]
    env: dict[str, str]
    env_path: Path
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StatusRow:
    name: str
    kind: str
    url: str
    healthy: bool
    pid: int | None
    detail: str = ""


def caller_environment(previous: Mapping[str, ServiceRecord] | None = None) -> dict[str, str]:
    """The environment, minus variables that merely point at services we started ourselves.

    Such values reach the environment when `.env` is loaded (the CLI loads it at start);
    they must not turn our own moto into an "external" one that `down` would leave running, nor
    pin the machine's Postgres once it stops answering.
    """
    previous = load_records() if previous is None else previous
    ours: dict[str, str] = {}
    if "postgres" in previous and previous["postgres"].kind != EXTERNAL:  # ours, or the machine's we chose
        ours["RUNSTATE_PG_URL"] = previous["postgres"].url
        ours["DAGSTER_PG_URL"] = postgres.default_dagster_url({}, previous["postgres"].url)
    if _ours(previous, "moto"):
        ours["RUNSTATE_AWS_ENDPOINT_URL"] = previous["moto"].url
    if _ours(previous, "fakesnow"):
        ours["SNOWFLAKE_PORT"] = str(previous["fakesnow"].port)
    # The user's own lines of `.env` count as their choice even when the CLI has not loaded the file.
    chosen = {**user_env_values(), **os.environ}
    env = {key: value for key, value in chosen.items() if ours.get(key) != value}
    if "SNOWFLAKE_PORT" in ours and "SNOWFLAKE_PORT" not in env and env.get("SNOWFLAKE_HOST") == "127.0.0.1":
        del env["SNOWFLAKE_HOST"]  # loopback + our port: that is our own fakesnow
    return env


def _ours(records: Mapping[str, ServiceRecord], name: str) -> bool:
    return name in records and records[name].kind == EMBEDDED


def up(
    *,
    pg_port: int | None = None,
    moto_port: int | None = None,
    fakesnow_port: int | None = None,
    embedded_pg: bool = False,
    spark_workers: int | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> UpReport:
    """Reuse or start every service, prepare databases and migrations, write the `.env` block.

    `spark_workers`: N starts (or keeps) a standalone Spark cluster of N workers, 0 stops it, None keeps
    what is recorded."""
    with services_lock():
        previous = load_records()
        env = caller_environment(previous)
        _check_requested_ports(previous, {"postgres": pg_port, "moto": moto_port, "fakesnow": fakesnow_port})
        records: dict[str, ServiceRecord] = {}
        try:
            records["postgres"] = postgres.ensure_postgres(
                env, previous.get("postgres"), force_embedded=embedded_pg, port=pg_port
            )
            _save_with_rest(records, previous)
            log(f"postgres  {records['postgres'].kind:<8} {postgres.redact(records['postgres'].url)}")
            records["moto"] = moto.ensure_moto(env, previous.get("moto"), port=moto_port)
            _save_with_rest(records, previous)
            log(f"moto      {records['moto'].kind:<8} {records['moto'].url}")
            records["fakesnow"] = fakesnow.ensure_fakesnow(env, previous.get("fakesnow"), port=fakesnow_port)
            _save_with_rest(records, previous)
            log(f"fakesnow  {records['fakesnow'].kind:<8} {records['fakesnow'].url}")
            _retire_replaced(previous, records)
        finally:
            # Whatever did start is on record, so `down` can stop it even when a later service failed.
            _save_with_rest(records, previous)
        values = endpoint_values(env, records)
        values.update(spark_cluster.up(env, spark_workers, log))
        env_path = write_env_file(values)
        kept = sorted(set(values) & set(user_env_values(env_path)))
        LEGACY_ENV_FILE().unlink(missing_ok=True)
        # Inside the lock: the migrations serialise themselves, but fakesnow also fails two concurrent
        # CREATE DATABASE runs, so two `up`s take turns.
        notes = _prepare(env, records, values)
    if kept:
        notes.append(f"{env_path}: your own line wins for {', '.join(kept)} (left out of the block)")
    for note in notes:
        log(note)
    return UpReport(records, values, env_path, notes)


def _check_requested_ports(
    previous: Mapping[str, ServiceRecord], requested: Mapping[str, int | None]
) -> None:
    """Refuse a taken port before anything starts, unless our own running service already holds it."""
    options = {"postgres": "--pg-port", "moto": "--moto-port", "fakesnow": "--fakesnow-port"}
    for name, port in requested.items():
        record = previous.get(name)
        if port and not (record and record.port == port and is_running(record)):
            require_free_port(name, port, options[name])


def _retire_replaced(previous: Mapping[str, ServiceRecord], records: Mapping[str, ServiceRecord]) -> None:
    """A service of ours that the caller's configuration now replaces is stopped, not orphaned."""
    for name, old in previous.items():
        new = records.get(name)
        if new is not None and old.started_by_us and old.pid != new.pid and is_running(old):
            stop_process(old.pid, old.pid_start, sig=STOP_SIGNALS[name])


def _save_with_rest(records: Mapping[str, ServiceRecord], previous: Mapping[str, ServiceRecord]) -> None:
    merged = {**{k: v for k, v in previous.items() if v.started_by_us and is_running(v)}, **records}
    save_records({name: merged[name] for name in SERVICE_NAMES if name in merged})


def endpoint_values(env: Mapping[str, str], records: Mapping[str, ServiceRecord]) -> dict[str, str]:
    pg = records["postgres"].url
    values = {"RUNSTATE_PG_URL": pg, "DAGSTER_PG_URL": postgres.default_dagster_url(env, pg)}
    values["RUNSTATE_AWS_ENDPOINT_URL"] = records["moto"].url
    if records["moto"].kind == EMBEDDED:
        values.update(moto.TEST_CREDENTIALS)
    snow = records["fakesnow"]
    if snow.kind == EMBEDDED:
        values.update(
            {
                "SNOWFLAKE_HOST": "127.0.0.1",
                "SNOWFLAKE_PORT": str(snow.port),
                "SNOWFLAKE_PROTOCOL": "http",
                **fakesnow.FAKE_CREDENTIALS,
                "SNOWFLAKE_DATABASE": fakesnow.DATABASE,
            }
        )
    return values


def _prepare(
    env: Mapping[str, str], records: Mapping[str, ServiceRecord], values: Mapping[str, str]
) -> list[str]:
    """Databases, migrations, the WAL table and bucket: all idempotent, so they run on every `up`."""
    settings = Settings.from_env({**env, **{k: v for k, v in values.items() if k not in env}})
    notes = []
    with _step("postgres: creating databases and applying migrations"):
        applied = postgres.prepare_databases(
            values["RUNSTATE_PG_URL"], values["DAGSTER_PG_URL"], settings.schema
        )
    notes.append(
        f"postgres: databases ready, {len(applied)} migration(s) applied to schema {settings.schema!r}"
    )
    with _step("moto: creating the WAL table and blob bucket"):
        notes.append(
            moto.create_wal_resources(
                records["moto"].url, settings.wal_table, settings.blob_bucket, settings.aws_region
            )
        )
    if records["fakesnow"].kind == EMBEDDED:
        with _step("fakesnow: creating the database and applying migrations"):
            # The schema rule of the event store resource and `runstate db`: SNOWFLAKE_SCHEMA, else RUNSTATE.
            schema = (settings.snowflake.get("schema") or defaults.SNOWFLAKE_SCHEMA).upper()
            applied = fakesnow.prepare_database(records["fakesnow"].port, schema)
        notes.append(
            f"fakesnow: database {fakesnow.DATABASE} ready, {len(applied)} migration(s) applied to {schema}"
        )
    return notes


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    try:
        yield
    except ServiceError:
        raise
    except Exception as exc:  # any driver's error: say which step failed, keep the cause chained
        raise ServiceError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def down(*, log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Stop what `up` started (by pid), newest first; forget the endpoints. Returns the stopped names."""
    stopped = []
    with services_lock():
        stopped += spark_cluster.down(log)
        records = load_records()
        for name in reversed(SERVICE_NAMES):
            record = records.get(name)
            if record is None or not record.started_by_us:
                if record is not None:
                    log(f"{name:<9} {record.kind}: not ours, left running")
                continue
            if stop_process(record.pid, record.pid_start, sig=STOP_SIGNALS[name]):
                stopped.append(name)
                log(f"{name:<9} stopped (pid {record.pid})")
            else:
                log(f"{name:<9} was not running (pid {record.pid})")
        services_file().unlink(missing_ok=True)
        remove_env_block()
        LEGACY_ENV_FILE().unlink(missing_ok=True)
    return stopped


def status() -> list[StatusRow]:
    rows = []
    for name, record in load_records().items():
        probe = {"postgres": postgres.answers, "moto": moto.healthy, "fakesnow": fakesnow.healthy}[name]
        detail = ""
        alive = True
        if record.kind == EMBEDDED:
            alive = is_running(record)
            if not alive:
                detail = f"process {record.pid} is gone; run `runstate services up`"
        answers = alive and probe(record.url)
        if alive and not answers:
            detail = f"does not answer at {postgres.redact(record.url)}"
        rows.append(StatusRow(name, record.kind, postgres.redact(record.url), answers, record.pid, detail))
    return rows + [StatusRow(*row) for row in spark_cluster.status()]
