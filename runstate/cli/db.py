"""`runstate db upgrade|status`: versioned schema migrations."""

from __future__ import annotations

import click

from runstate import migrations
from runstate.config import settings


@click.group()
def db() -> None:
    """Schema migrations for Postgres (and Snowflake when it is the event store)."""


@db.command()
def upgrade() -> None:
    """Apply pending migrations; safe to run twice, and from two processes at once."""
    s = settings()
    applied = migrations.upgrade_postgres(s.pg_url, s.schema)
    click.echo(f"postgres {s.schema}: applied {len(applied)} migration(s)")
    for migration in applied:
        click.echo(f"  + {migration.version}_{migration.name}")


@db.command()
def status() -> None:
    """List applied and pending migrations."""
    s = settings()
    for row in migrations.status_postgres(s.pg_url, s.schema):
        click.echo(f"postgres  {row.version}_{row.name:<30} {'applied' if row.applied else 'PENDING'}")


COMMANDS = [db]
