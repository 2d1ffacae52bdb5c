"""`runstate db upgrade|status`: versioned schema migrations, and the WAL's AWS resources."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager

import click

from runstate.config import Settings, settings

# A wrong host or port should fail in seconds, not after the connector's default of two minutes.
LOGIN_TIMEOUT_S = 20


def _snowflake_connection(s: Settings):
    """A connector connection when Snowflake is configured (SNOWFLAKE_ACCOUNT), else None."""
    if not s.snowflake.get("account"):
        return None
    import snowflake.connector

    kwargs = {
        k: s.snowflake[k]
        for k in ("account", "user", "password", "database", "host", "protocol", "role", "warehouse")
        if s.snowflake.get(k)
    }
    if s.snowflake.get("port"):
        kwargs["port"] = int(s.snowflake["port"])
    from runstate.migrations import MigrationError

    where = f"{kwargs.get('host') or kwargs['account']}:{kwargs.get('port', 443)}"
    try:
        return snowflake.connector.connect(**kwargs, login_timeout=LOGIN_TIMEOUT_S)
    except snowflake.connector.errors.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise MigrationError(f"snowflake {where}: cannot connect: {detail}") from exc


@contextmanager
def _snowflake_errors(schema: str) -> Iterator[None]:
    """A connector error while migrating or reading the status becomes one line naming the schema."""
    import snowflake.connector

    from runstate.migrations import MigrationError

    try:
        yield
    except snowflake.connector.errors.Error as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise MigrationError(f"snowflake {schema}: {detail}") from exc


def _snowflake_schema(s: Settings) -> str:
    return (s.snowflake.get("schema") or "RUNSTATE").upper()


def _ensure_wal_resources(s: Settings) -> str:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from runstate.migrations import MigrationError
    from runstate.wal import ensure_blob_bucket, ensure_wal_table

    kwargs = {"endpoint_url": s.aws_endpoint_url, "region_name": s.aws_region}
    try:
        ensure_wal_table(boto3.client("dynamodb", **kwargs), s.wal_table)
        ensure_blob_bucket(boto3.client("s3", **kwargs), s.blob_bucket)
    except (BotoCoreError, ClientError) as exc:
        where = s.aws_endpoint_url or "AWS"
        raise MigrationError(
            f"WAL table {s.wal_table!r} / bucket {s.blob_bucket!r} at {where}: {exc}"
        ) from exc
    return f"WAL table {s.wal_table!r} and blob bucket {s.blob_bucket!r} are ready"


@click.group()
def db() -> None:
    """Schema migrations (Postgres, and Snowflake when configured) and the WAL's table and bucket."""


@db.command()
@click.option("--skip-aws", is_flag=True, help="Do not create the DynamoDB WAL table and the S3 bucket.")
def upgrade(skip_aws: bool) -> None:
    """Apply pending migrations; safe to run twice, and from two processes at once."""
    from runstate import migrations

    s = settings()
    applied = migrations.upgrade_postgres(s.pg_url, s.schema)
    click.echo(f"postgres {s.schema}: applied {len(applied)} migration(s)")
    for migration in applied:
        click.echo(f"  + {migration.version}_{migration.name}")
    conn = _snowflake_connection(s)
    if conn is not None:
        with closing(conn), _snowflake_errors(_snowflake_schema(s)):
            done = migrations.upgrade_snowflake(conn, _snowflake_schema(s))
        click.echo(f"snowflake {_snowflake_schema(s)}: applied {len(done)} migration(s)")
    if not skip_aws:
        click.echo(_ensure_wal_resources(s))


@db.command()
def status() -> None:
    """List applied and pending migrations."""
    from runstate import migrations

    s = settings()
    rows = [("postgres", row) for row in migrations.status_postgres(s.pg_url, s.schema)]
    conn = _snowflake_connection(s)
    if conn is not None:
        with closing(conn), _snowflake_errors(_snowflake_schema(s)):
            rows += [("snowflake", row) for row in migrations.status_snowflake(conn, _snowflake_schema(s))]
    for backend, row in rows:
        click.echo(f"{backend:<10}{row.version}_{row.name:<32} {'applied' if row.applied else 'PENDING'}")


COMMANDS = [db]
