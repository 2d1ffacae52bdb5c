"""The maintenance lease has one default, written once in models.py: the core's claims and the deployment's
configuration agree on it (they said 300 s and 900 s)."""

from __future__ import annotations

import inspect

from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.maintenance import MaintenanceStore
from runstate.maintenance.config import MaintenanceConfig
from runstate.maintenance.models import DEFAULT_LEASE_SECONDS, Claim
from runstate.maintenance.queue import JobQueue


def _lease_default(method: object) -> object:
    return inspect.signature(method).parameters["lease_seconds"].default


def test_the_core_claim_and_the_deployment_config_take_one_lease_default():
    defaults = {
        "MaintenanceStore.claim": _lease_default(MaintenanceStore.claim),
        "JobQueue.claim": _lease_default(JobQueue.claim),
        "Claim": Claim.__dataclass_fields__["lease_seconds"].default,
        "MaintenanceConfig": MaintenanceConfig().lease_seconds,
        "MaintenanceResource": MaintenanceResource().lease_seconds,
    }

    assert set(defaults.values()) == {DEFAULT_LEASE_SECONDS}, defaults


def test_the_lease_outlasts_missed_beats_of_the_deployments_15_minute_lease():
    # The deployment's path always had 900 s; the one default keeps it.
    assert DEFAULT_LEASE_SECONDS == 900.0
