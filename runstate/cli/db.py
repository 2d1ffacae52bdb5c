"""`runstate db upgrade|status`: versioned schema migrations, the WAL's AWS resources and the Spark pool.

These are the only verbs (with `services up`) that migrate: every other verb checks that the schema
is current and, when it is not, says to run `runstate db upgrade`.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

from runstate.config import Settings, settings


def _datastores(s: Settings) -> Iterator[object]:
    """The datastore of each backend with migrations that the settings configure (runstate.backends:
    Postgres always, Snowflake with SNOWFLAKE_ACCOUNT). Each closed afterwards."""
    from runstate import backends
    from runstate.eventstore.config import EventStoreConfig

    config = EventStoreConfig.from_settings(s)
    for backend in backends.all_backends():
        store = backend.build_datastore(config) if backend.migrations else None
        if store is None:
            continue
        try:
            yield store
        finally:
            store.close()


def _ensure_wal_resources(s: Settings) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    from runstate import wiring
    from runstate.migrations import MigrationError
    from runstate.wal import ensure_blob_bucket, ensure_wal_table
    from runstate.wal.config import WalConfig

    wal = WalConfig.from_settings(s)
    try:
        ensure_wal_table(wiring.aws_client("dynamodb", wal), wal.table)
        ensure_blob_bucket(wiring.aws_client("s3", wal), wal.bucket)
    except (BotoCoreError, ClientError) as exc:
        where = wal.endpoint_url or "AWS"
        raise MigrationError(f"WAL table {wal.table!r} / bucket {wal.bucket!r} at {where}: {exc}") from exc
    return f"WAL table {wal.table!r} and blob bucket {wal.bucket!r} are ready"


@click.group()
def db() -> None:
    """Schema migrations (Postgres, and Snowflake when configured) and the WAL's table and bucket."""


@db.command()
@click.option("--skip-aws", is_flag=True, help="Do not create the DynamoDB WAL table and the S3 bucket.")
@click.option(
    "--skip-dagster", is_flag=True, help="Do not set the Dagster pool runstate_spark's limit in the instance."
)
def upgrade(skip_aws: bool, skip_dagster: bool) -> None:
    """Apply pending migrations of every domain; safe to run twice, and from two processes at once.

    Also sets the limit of the Dagster pool `runstate_spark` (RUNSTATE_SPARK_SESSIONS) in the instance of
    DAGSTER_HOME (else the checkout's dagster.yaml): at most that many Spark sessions at once."""
    from runstate import migrations

    s = settings()
    for store in _datastores(s):
        for domain, applied in migrations.upgrade_all(store).items():
            click.echo(f"{store.backend} {store.schema} {domain}: applied {len(applied)} migration(s)")
            for migration in applied:
                click.echo(f"  + {migration.version}_{migration.name}")
    if not skip_aws:
        click.echo(_ensure_wal_resources(s))
    if not skip_dagster:
        from runstate.commands.instance import limit_spark_pool

        click.echo(limit_spark_pool(s.spark_sessions, migrations.MigrationError))


@db.command()
def status() -> None:
    """List applied and pending migrations, per backend and domain."""
    from runstate import migrations

    for store in _datastores(settings()):
        for domain in migrations.domains(store.backend):
            for row in migrations.status(store, domain):
                state = "applied" if row.applied else "PENDING"
                click.echo(f"{store.backend:<10}{domain:<12} {row.version}_{row.name:<32} {state}")
