"""A resource holds its domain's config as fields: the two directions between them.

Each domain's resource (`EventStoreResource`, `WalResource`, `MaintenanceResource`, `SnowflakeConnection`)
declares the fields of its config dataclass, with the dataclass's defaults (`Field(default=WalConfig.region)`),
so a default lives in the config alone; runstate_tests/defs/test_resources.py checks that every field
and default matches. `config_fields` gives a config's values to the resource's constructor (the builders
in `runstate.defs.resources`), `config_of` reads the config back from a resource (its own `config()`);
`secret` passes a secret the environment holds as an EnvVar, so the UI shows its name, not its value.

Apart from `runstate.defs.resources`, which imports the resource classes to build them: the resource
modules import this one, and nothing here imports them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

import dagster as dg

Config = TypeVar("Config")


def config_fields(config: Any) -> dict[str, Any]:
    """A config's fields by name: the keyword arguments of the resource that holds them."""
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}


def secret(name: str) -> dg.EnvVar | None:
    """An EnvVar when the variable is set, so the secret never lands in run config; else None."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def config_of(resource: dg.ConfigurableResource, config_type: type[Config], **nested: Any) -> Config:
    """The resource's config: its fields of the config's names (a secret given as an EnvVar, its value;
    `nested`: the configs of its nested resources)."""
    values = {field.name: getattr(resource, field.name) for field in dataclasses.fields(config_type)}
    resolved = {
        name: value.get_value() if isinstance(value, dg.EnvVar) else value for name, value in values.items()
    }
    return config_type(**{**resolved, **nested})
