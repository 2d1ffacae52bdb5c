"""Iceberg table maintenance core: identifiers, the Postgres store (queue, fences, locks, cache, health).

No dagster imports here; runstate/defs/maintenance is the Dagster shell around this package.
"""

from runstate.maintenance.identifiers import (
    ACTIONS,
    IDENTIFIER_PATTERN,
    InvalidIdentifier,
    TableRef,
    UnknownAction,
    parse_table_ref,
    validate_actions,
    validate_identifier,
)
from runstate.maintenance.store import (
    ActionRecord,
    CachedTable,
    Claim,
    HealthSnapshot,
    InvalidStatus,
    Job,
    JobNotFound,
    MaintenanceStore,
    OrchestratorRun,
    TableNotCached,
)

__all__ = [
    "ACTIONS",
    "IDENTIFIER_PATTERN",
    "ActionRecord",
    "CachedTable",
    "Claim",
    "HealthSnapshot",
    "InvalidIdentifier",
    "InvalidStatus",
    "Job",
    "JobNotFound",
    "MaintenanceStore",
    "OrchestratorRun",
    "TableNotCached",
    "TableRef",
    "UnknownAction",
    "parse_table_ref",
    "validate_actions",
    "validate_identifier",
]
