"""Postgres databases of a test's own on the test server (RUNSTATE_TEST_PG_ADMIN_URL)."""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg import sql

ADMIN_URL = os.environ.get("RUNSTATE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def database_url(database: str, admin_url: str = ADMIN_URL) -> str:
    """The URL of `database` on the admin URL's server."""
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{database}"


def create_database(name: str) -> str:
    """An empty database `name`; returns its URL."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
