"""Iceberg table maintenance core: identifiers, value types, errors, the Postgres store (queue and
fences, locks, catalog cache, health and audit history), the catalog inventory, the health analyzer,
the actions, the action plan, the fenced job runner and the queue worker, and the orchestrator.

No dagster imports here; runstate/defs/maintenance is the Dagster shell around this package. Nothing
here imports pyspark either until a Spark session is used. The status constants stay in their modules
(health.HEALTHY is a health status, orchestrator.HEALTHY a decision).
"""

from typing import TYPE_CHECKING

from runstate.lazy import lazy_exports
from runstate.maintenance.catalog import CatalogListing, CatalogTable, list_tables
from runstate.maintenance.errors import (
    InvalidActionOption,
    InvalidIdentifier,
    InvalidInput,
    InvalidStatus,
    JobNotFound,
    MaintenanceError,
    StoreError,
    StoreUnavailable,
    TableLocked,
    TableNotCached,
    TableNotFound,
    UnknownAction,
)
from runstate.maintenance.health import MB, HealthAnalyzer, HealthThresholds
from runstate.maintenance.identifiers import (
    ACTIONS,
    DEFAULT_ACTIONS,
    IDENTIFIER_PATTERN,
    TableRef,
    parse_table_ref,
    validate_actions,
    validate_identifier,
)
from runstate.maintenance.models import ActionRecord, CachedTable, Claim, HealthSnapshot, Job, OrchestratorRun
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import Orchestrator, OrchestratorReport, OrchestratorSettings
from runstate.maintenance.plan import ActionPlan

if TYPE_CHECKING:
    from runstate.maintenance.runner import JobOutcome, QueueWorker, WorkerReport, run_job
    from runstate.maintenance.store import MaintenanceStore

# The store and the runner load psycopg: imported on first use, so that the CLI, which imports this
# package's errors before every verb, pays for the driver only in the verbs that use it.
__getattr__ = lazy_exports(
    __name__,
    {
        "JobOutcome": "runstate.maintenance.runner",
        "QueueWorker": "runstate.maintenance.runner",
        "WorkerReport": "runstate.maintenance.runner",
        "run_job": "runstate.maintenance.runner",
        "MaintenanceStore": "runstate.maintenance.store",
    },
)

__all__ = [
    "ACTIONS",
    "DEFAULT_ACTIONS",
    "IDENTIFIER_PATTERN",
    "MB",
    "ActionPlan",
    "ActionRecord",
    "ActionSettings",
    "CachedTable",
    "CatalogListing",
    "CatalogTable",
    "Claim",
    "HealthAnalyzer",
    "HealthSnapshot",
    "HealthThresholds",
    "InvalidActionOption",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidStatus",
    "Job",
    "JobNotFound",
    "JobOutcome",
    "MaintenanceError",
    "MaintenanceStore",
    "Orchestrator",
    "OrchestratorReport",
    "OrchestratorRun",
    "OrchestratorSettings",
    "QueueWorker",
    "StoreError",
    "StoreUnavailable",
    "TableLocked",
    "TableNotCached",
    "TableNotFound",
    "TableRef",
    "UnknownAction",
    "WorkerReport",
    "list_tables",
    "parse_table_ref",
    "run_job",
    "validate_actions",
    "validate_identifier",
]
