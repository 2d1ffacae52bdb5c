"""ActionPlan: what one maintenance job does, validated once where the request enters.

A request (the CLI's submit, the launchpad's, the orchestrator's, `MaintenanceStore.submit`) becomes a
plan through `ActionPlan.parse`, the one check of actions, dry_run and options; the queue stores it
and a claim carries it back as it was stored, so the runner takes it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runstate.maintenance.identifiers import validate_actions
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.validation import flag, json_object


@dataclass(frozen=True)
class ActionPlan:
    """A job's actions in `ACTIONS` order, whether it only plans (dry_run), and its option overrides."""

    actions: tuple[str, ...]
    dry_run: bool = False
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # a dict, as jobs.options holds

    @classmethod
    def parse(
        cls,
        actions: Iterable[str] | str,
        *,
        dry_run: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> ActionPlan:
        """The plan of a request; UnknownAction / InvalidInput / InvalidActionOption (ValueErrors) name
        the first bad value. `actions` may be a comma-separated string; options are ActionSettings names."""
        ordered = validate_actions(actions)
        dry_run = flag(dry_run, "dry_run")
        ActionSettings.from_options(options)  # every key known, every value within its rules
        return cls(ordered, dry_run, json_object(options, "options"))  # a plain dict, as jobs.options holds

    def settings(self, base: ActionSettings | None = None) -> ActionSettings:
        """The worker's settings (`base`: its configured defaults) with this job's options over them.

        A plan made by `parse` always fits. A claim's plan comes from a stored row, which a build before
        `parse` existed (or a hand edit) may have written: such options raise InvalidActionOption."""
        if set(self.options) <= set(ActionSettings.names()):
            return replace(base or ActionSettings(), **self.options)
        return ActionSettings.from_options(self.options, base)
