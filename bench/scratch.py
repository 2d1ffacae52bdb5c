"""A scratch Postgres database per benchmark run, so figures never mix with real data."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql


def create_database(admin_url: str) -> tuple[str, str]:
    """Create `rs_bench_<random>`; returns (name, DSN)."""
    name = f"rs_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, f"{admin_url.rpartition('/')[0]}/{name}"


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
