"""A resource holds its domain's config as fields: the fields derived from the config, and the two
directions between their values.

Each domain's resource (`EventStoreResource`, `WalResource`, `MaintenanceResource`, `SnowflakeConnection`)
subclasses `config_resource(<its config dataclass>)`, whose pydantic fields are the dataclass's: the same
names, types and defaults, with the description and bounds (`gt`, `ge`) its field's metadata holds
(`field(default=500, metadata={"description": ..., "gt": 0})`). So each field is written once, in the
config, and the launchpad and the UI show it from there. `config_fields` gives a config's values to the
resource's constructor (the builders in `runstate.defs.resources`), `config_of` reads the config back from
a resource (its own `config()`); `secret` passes a secret the environment holds as an EnvVar, so the UI
shows its name, not its value.

Apart from `runstate.defs.resources`, which imports the resource classes to build them: the resource
modules import this one, and nothing here imports them.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import dagster as dg
import pydantic

Config = TypeVar("Config")

# What a config field's metadata may say of its resource field: the UI's text, and the bounds pydantic
# checks when the resource is built. Anything else is a mistake, not a silently dropped word.
FIELD_METADATA = frozenset({"description", "gt", "ge"})


def config_resource(
    config_type: type, nested: Mapping[str, Any] | None = None
) -> type[dg.ConfigurableResource]:
    """A ConfigurableResource whose fields are `config_type`'s, for the domain's resource to subclass
    (its methods, validators and fields of its own go there). `nested`: the type of each field that the
    resource holds as a nested resource rather than as the config's own value, by name."""
    nested = nested or {}
    # The configs' modules use `from __future__ import annotations`: their fields' types are strings.
    types = typing.get_type_hints(config_type)
    fields = {}
    for field in dataclasses.fields(config_type):
        if unknown := field.metadata.keys() - FIELD_METADATA:
            raise TypeError(f"{config_type.__name__}.{field.name}: unknown metadata {sorted(unknown)}")
        default = ... if field.default is dataclasses.MISSING else field.default  # `...`: required
        annotation = nested.get(field.name, types[field.name])
        fields[field.name] = (annotation, pydantic.Field(default, **field.metadata))
    # A base class made by pydantic's public create_model: Dagster's resource metaclass and pydantic see
    # fields declared as in a class body, and the subclass keeps the resource's name and module.
    return pydantic.create_model(
        f"{config_type.__name__}Fields", __base__=dg.ConfigurableResource, __module__=__name__, **fields
    )


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
