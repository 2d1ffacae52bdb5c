"""Iceberg table maintenance core: identifiers, the Postgres store (queue, fences, locks, cache, health),
the catalog inventory, the health analyzer, the actions and their job runner, and the orchestrator.

No dagster imports here; runstate/defs/maintenance is the Dagster shell around this package. Nothing
here imports pyspark either until a Spark session is used. The status constants stay in their modules
(health.HEALTHY is a health status, orchestrator.HEALTHY a decision).
"""

from runstate.maintenance.actions import (
    ActionSettings,
    JobOutcome,
    TableLocked,
    claim_ready,
    resume_claim,
    run_job,
)
from runstate.maintenance.catalog import CatalogListing, CatalogTable, list_tables
from runstate.maintenance.errors import MaintenanceError
from runstate.maintenance.health import (
    MB,
    HealthAnalyzer,
    HealthThresholds,
    TableNotFound,
)
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
from runstate.maintenance.orchestrator import (
    Orchestrator,
    OrchestratorReport,
    OrchestratorSettings,
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
    "MB",
    "MaintenanceError",
    "ActionRecord",
    "ActionSettings",
    "CachedTable",
    "CatalogListing",
    "CatalogTable",
    "Claim",
    "HealthAnalyzer",
    "HealthSnapshot",
    "HealthThresholds",
    "InvalidIdentifier",
    "InvalidStatus",
    "Job",
    "JobNotFound",
    "JobOutcome",
    "MaintenanceStore",
    "Orchestrator",
    "OrchestratorReport",
    "OrchestratorRun",
    "OrchestratorSettings",
    "TableLocked",
    "TableNotCached",
    "TableNotFound",
    "TableRef",
    "UnknownAction",
    "claim_ready",
    "list_tables",
    "parse_table_ref",
    "resume_claim",
    "run_job",
    "validate_actions",
    "validate_identifier",
]
