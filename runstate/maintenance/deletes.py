"""Jobs that apply merge-on-read tables' delete files, submitted between orchestrator runs.

A writer that knows a table gathered delete files (the dataset tables' merges report them) names the
table; `submit_apply_deletes` queues one job of APPLY_DELETES_ACTIONS for it, unless the catalog cache
says the table opted out. A table the cache does not list yet is added as opted in (a dataset table is
created so), and the next inventory decides again. A table with a job in flight gets that job back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runstate.maintenance.catalog import CATALOG
from runstate.maintenance.errors import MaintenanceError
from runstate.maintenance.identifiers import APPLY_DELETES_ACTIONS, APPLY_DELETES_OPTIONS, TableRef
from runstate.maintenance.models import CachedTable
from runstate.maintenance.plan import ActionPlan

if TYPE_CHECKING:
    from runstate.maintenance.store import MaintenanceStore

APPLY_DELETES_PLAN = ActionPlan.parse(APPLY_DELETES_ACTIONS, options=APPLY_DELETES_OPTIONS)


@dataclass
class DeletesSubmission:
    """The job per table key, and the tables left alone with why."""

    submitted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{key}: job {job_id}" for key, job_id in sorted(self.submitted.items())]
        parts += [f"{key}: {why}" for key, why in sorted(self.skipped.items())]
        return "; ".join(parts)


def submit_apply_deletes(
    store: MaintenanceStore, idents: Iterable[str], *, added_by: str
) -> DeletesSubmission:
    """One job per `lake.<database>.<table>` in `idents`; `added_by` marks cache rows this adds."""
    outcome = DeletesSubmission()
    cached = {entry.ref.key: entry for entry in store.cache.cached_tables()}
    for ident in idents:
        ref = _lake_table(ident)
        if ref is None:
            outcome.skipped[ident] = f"not a table of the {CATALOG!r} catalog"
            continue
        entry = cached.get(ref.key)
        if entry is not None and entry.maintenance_enabled is not True:
            outcome.skipped[ref.key] = "runstate.maintenance.enabled is not true"
            continue
        if entry is None:
            store.cache.add_cached_table(CachedTable(ref.database, ref.table, True, {"added_by": added_by}))
        outcome.submitted[ref.key] = store.queue.submit(ref, APPLY_DELETES_PLAN)
    return outcome


def _lake_table(ident: str) -> TableRef | None:
    catalog, _, key = ident.partition(".")
    try:
        return TableRef(*key.split(".")) if catalog == CATALOG else None
    except (TypeError, MaintenanceError):
        return None
