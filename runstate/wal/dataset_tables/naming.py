"""Where a dataset lives in the lake: `lake.datasets.<name>`, and the table properties it carries.

The name rule (stable, so a dataset always maps to the same table):
- a dataset id that is already a plain lower-case identifier (`[a-z_][a-z0-9_]*`) is its own name,
  unless it ends in `_` and 8 hex digits (the shape of a hashed name, below);
- any other id (upper case, '.', '-', a leading digit, or that shape) becomes its lower-cased form with
  every other character replaced by '_', prefixed with `d_` when it starts with a digit, and suffixed
  with `_` plus the first 8 hex digits of the SHA-256 of the id, so `Orders`, `orders.v2` and
  `orders-v2` never collide with each other or with `orders_v2`, and `RtColl` (`rtcoll_e120c38d`)
  never with the plain id `rtcoll_e120c38d` (which is hashed in turn).
A hashed name always ends in `_` and 8 hex digits and an id that is its own name never does, so the two
kinds never meet; two hashed ids meet only when their lower-cased forms and 32-bit hashes both agree.
That is rare but can be made on purpose, so the table also records its dataset id (DATASET_PROPERTY,
set by the CREATE TABLE that makes it, hence by whichever dataset made it first) and a merge or read
for any other id is refused (`table.py`).
Every name matches the maintenance service's identifier rule (`[A-Za-z_][A-Za-z0-9_]{0,127}`).
"""

from __future__ import annotations

import hashlib
import re

from runstate.wal.changes import validate_dataset_id

CATALOG = "lake"
NAMESPACE = "datasets"
PLAIN_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
HASHED_SUFFIX = re.compile(r"_[0-9a-f]{8}$")

# The property the maintenance orchestrator reads to opt a table in (its name, kept here because the
# WAL core never imports the maintenance core).
MAINTENANCE_ENABLED_PROPERTY = "runstate.maintenance.enabled"
DATASET_PROPERTY = "runstate.wal.dataset"
VERSION_PROPERTY = "runstate.wal.version"

# The row that holds the version a table reached, written by the same MERGE as the data, so a
# snapshot of the table always knows its WAL version. Keys are canonical JSON text and `#version`
# is not JSON, so no dataset key can collide with it; it is a tombstone, so `WHERE NOT deleted`
# (the live rows) never shows it.
VERSION_KEY = "#version"


def table_name(dataset_id: str) -> str:
    """The table's name in the `datasets` namespace (see the module docstring for the rule)."""
    validate_dataset_id(dataset_id)
    if PLAIN_NAME.match(dataset_id) and not HASHED_SUFFIX.search(dataset_id):
        return dataset_id
    base = re.sub(r"[^a-z0-9_]", "_", dataset_id.lower())
    if base[0].isdigit():
        base = f"d_{base}"
    return f"{base}_{hashlib.sha256(dataset_id.encode()).hexdigest()[:8]}"


def table_ident(dataset_id: str, catalog: str = CATALOG, namespace: str = NAMESPACE) -> str:
    """`lake.datasets.<name>`: safe to interpolate, every part is a plain identifier."""
    return f"{catalog}.{namespace}.{table_name(dataset_id)}"
