"""The maintenance domain's one error root; every error the domain raises derives from it."""

from __future__ import annotations


class MaintenanceError(Exception):
    """Anything the maintenance service refuses or cannot do: bad input, unknown jobs, lost locks."""
