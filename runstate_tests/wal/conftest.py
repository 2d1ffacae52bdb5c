"""The WAL tests: their `wal` fixture (a WAL table and blob bucket of the test's own on moto's server) is
the root conftest's, shared with the CLI's tests; moto's werkzeug log stays quiet here."""

from __future__ import annotations

import logging

logging.getLogger("werkzeug").setLevel(logging.ERROR)
