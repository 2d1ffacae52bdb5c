"""Postgres for runstate and Dagster: the configured server, the machine's on 5432, or a cluster of our own.

Order of choice:
1. `RUNSTATE_PG_URL` from the caller's environment: used as is (we never start or stop it).
2. A cluster this project already initialised under `.runstate/pg`: (re)started, so its data stays in use.
3. The machine's server on 127.0.0.1:5432 when it answers.
4. Otherwise `initdb` + `postgres` under `.runstate/pg` with the machine's binaries, on a free loopback
   port. initdb refuses to run as root, so as root the cluster belongs to the `postgres` OS user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from runstate import migrations
from runstate.config import dagster_url_for, state_dir
from runstate.datastore import redact
from runstate.services.state import (
    EMBEDDED,
    LOOPBACK,
    MACHINE,
    ServiceError,
    ServiceRecord,
    external_record,
    free_port,
    is_running,
    logs_dir,
    port_answers,
    port_is_free,
    require_free_port,
    spawn_detached,
    started_record,
    stop_process,
    wait_until,
)

MACHINE_PORT = 5432
CLUSTER_USER = "postgres"
INSTALL_HINT = (
    "Install the server binaries (`apt-get install -y postgresql`), point RUNSTATE_PG_BIN at their folder, "
    "or set RUNSTATE_PG_URL to a server you already run."
)


def cluster_dir() -> Path:
    return state_dir() / "pg"


def data_dir() -> Path:
    return cluster_dir() / "data"


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


def database_of(url: str) -> str:
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ServiceError(f"Postgres URL {redact(url)} names no database; add one, e.g. .../runstate")
    return name


def answers(url: str, timeout: int = 2) -> bool:
    import psycopg  # here, not at the top: every CLI verb imports this package (for ServiceError)

    try:
        with psycopg.connect(with_database(_libpq_url(url), "postgres"), connect_timeout=timeout):
            return True
    except psycopg.Error:
        return False


def _libpq_url(url: str) -> str:
    # Dagster's SQLAlchemy URLs carry a driver suffix that libpq does not understand.
    return url.replace("postgresql+psycopg2://", "postgresql://", 1)


def ensure_postgres(
    caller_env: Mapping[str, str],
    previous: ServiceRecord | None,
    *,
    force_embedded: bool = False,
    port: int | None = None,
) -> ServiceRecord:
    """Choose (and if needed start) the server; returns its record with the runstate database URL."""
    if url := caller_env.get("RUNSTATE_PG_URL"):
        return external_record(
            "postgres",
            url,
            answers=answers(url),
            fix=f"RUNSTATE_PG_URL={redact(url)} does not answer. Start that server, fix the URL, "
            "or unset RUNSTATE_PG_URL to use the machine's server on 5432 or an embedded cluster.",
        )
    if force_embedded or data_dir().exists() or not port_answers(MACHINE_PORT):
        return _ensure_cluster(previous, port)
    return ServiceRecord("postgres", MACHINE, f"postgresql://postgres@{LOOPBACK}:{MACHINE_PORT}/runstate")


def prepare_databases(runstate_url: str, dagster_url: str, schema: str) -> list[migrations.Migration]:
    """Create the runstate and Dagster databases when missing, then apply the runstate migrations."""
    from runstate.datastore import PostgresDatastore

    for url in (runstate_url, dagster_url):
        create_database(url)
    store = PostgresDatastore(_libpq_url(runstate_url), schema=schema)
    try:
        return [m for applied in migrations.upgrade_all(store).values() for m in applied]
    finally:
        store.close()


def create_database(url: str) -> None:
    """CREATE DATABASE has no IF NOT EXISTS; a concurrent creator makes ours fail harmlessly."""
    import psycopg
    from psycopg import errors, sql

    name = database_of(url)
    admin = with_database(_libpq_url(url), "postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            pass


def default_dagster_url(caller_env: Mapping[str, str], runstate_url: str) -> str:
    return caller_env.get("DAGSTER_PG_URL") or dagster_url_for(runstate_url)


# ----- the embedded cluster


def server_binaries() -> Path:
    """The folder holding initdb and postgres: RUNSTATE_PG_BIN, PATH, else the newest
    /usr/lib/postgresql/*/bin."""
    if os.environ.get("RUNSTATE_PG_BIN"):
        folder = Path(os.environ["RUNSTATE_PG_BIN"])
        _binary(folder, "initdb")
        return folder
    on_path = shutil.which("initdb")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    for folder in versions:
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    raise ServiceError(
        f"postgres: no server on 127.0.0.1:{MACHINE_PORT} and no `initdb` to make one. {INSTALL_HINT}"
    )


def _binary(folder: Path, name: str) -> str:
    candidate = folder / name
    if not candidate.exists():
        raise ServiceError(f"postgres: `{name}` is missing from {folder}. {INSTALL_HINT}")
    return str(candidate)


def _cluster_owner() -> str | None:
    """The OS user to run initdb and postgres as: `postgres` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(CLUSTER_USER)
    except KeyError:
        raise ServiceError(
            "postgres: initdb refuses to run as root and there is no `postgres` OS user. Create one "
            "(`useradd --system postgres`), run as a normal user, or set RUNSTATE_PG_URL."
        ) from None
    return CLUSTER_USER


def _initdb(folder: Path, owner: str | None) -> None:
    cluster_dir().mkdir(parents=True, exist_ok=True)
    if owner:
        entry = pwd.getpwnam(owner)
        os.chown(cluster_dir(), entry.pw_uid, entry.pw_gid)
    result = subprocess.run(
        [
            _binary(folder, "initdb"),
            "-D",
            str(data_dir()),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ],
        user=owner,
        capture_output=True,
        text=True,
        cwd=cluster_dir(),
        env=_owner_env(owner),
    )
    if result.returncode != 0:
        shutil.rmtree(data_dir(), ignore_errors=True)
        raise ServiceError(
            f"postgres: initdb failed (exit {result.returncode}) for {data_dir()}:\n"
            f"{result.stdout}{result.stderr}\n"
            f"The `{owner or 'current'}` user must be able to enter every parent folder of {cluster_dir()}; "
            "or set RUNSTATE_HOME to a folder it can use, or set RUNSTATE_PG_URL."
        )


def _owner_env(owner: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if owner:
        env["HOME"] = pwd.getpwnam(owner).pw_dir
        env["USER"] = env["LOGNAME"] = owner
    return env


def _ensure_cluster(previous: ServiceRecord | None, requested_port: int | None) -> ServiceRecord:
    if previous and previous.kind == EMBEDDED and is_running(previous):
        try:  # it may still be starting (another `up` just launched it)
            wait_until(lambda: answers(previous.url, timeout=1), timeout=30, what="postgres", log=None)
            return previous
        except ServiceError:
            # Hung: a second postmaster cannot share the data folder, so this one has to go first.
            stop_process(previous.pid, previous.pid_start, sig=signal.SIGINT)
    folder = server_binaries()
    owner = _cluster_owner()
    if not (data_dir() / "PG_VERSION").exists():
        _initdb(folder, owner)
    if requested_port:
        require_free_port("postgres", requested_port, "--pg-port")
        port = requested_port
    elif previous and previous.port and port_is_free(previous.port):
        port = previous.port  # keep the URL other tools already saw
    else:
        port = free_port()
    log = logs_dir() / "postgres.log"
    if owner:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()
    # Loopback TCP only: no Unix socket, so no clash with the machine's socket folder or its path limit.
    process = spawn_detached(
        [
            _binary(folder, "postgres"),
            "-D",
            str(data_dir()),
            "-p",
            str(port),
            "-c",
            f"listen_addresses={LOOPBACK}",
            "-c",
            "unix_socket_directories=",
        ],
        log_path=log,
        user=owner,
        cwd=cluster_dir(),
        env=_owner_env(owner),
    )
    url = f"postgresql://postgres@{LOOPBACK}:{port}/runstate"
    healthy = partial(answers, timeout=1)
    return started_record("postgres", url, port, process, log, healthy, extra={"data_dir": str(data_dir())})
