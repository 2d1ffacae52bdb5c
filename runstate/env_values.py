"""How one variable's text becomes a value: each reader returns it, or raises a ConfigError that names
the variable, shows the value and says what is allowed (runstate.config puts them together)."""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable, its value and what is allowed."""


def shown(raw: str) -> str:
    # The value as the message shows it: repr keeps control characters visible and on one line.
    return repr(raw if len(raw) <= 60 else raw[:60] + "...")


def choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name) or default
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {shown(raw)}")
    return raw


def bounded_int(env: Mapping[str, str], name: str, default: int, maximum: int, minimum: int = 1) -> int:
    raw = env.get(name) or str(default)
    if not (raw.isascii() and raw.isdigit()) or not minimum <= int(raw) <= maximum:
        raise ConfigError(f"{name} must be a whole number from {minimum} to {maximum}, got {shown(raw)}")
    return int(raw)


def seconds(env: Mapping[str, str], name: str, default: float, maximum: float, minimum: float = 0.0) -> float:
    raw = env.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not minimum <= value <= maximum:  # nan and inf fail this too
        raise ConfigError(
            f"{name} must be a number of seconds from {minimum:g} to {maximum:g}, got {shown(raw)}"
        )
    return value


def spark_master(env: Mapping[str, str], default: str) -> str:
    raw = env.get("RUNSTATE_SPARK_MASTER") or default
    if not raw.isprintable() or any(ch.isspace() for ch in raw):
        raise ConfigError(f"RUNSTATE_SPARK_MASTER must be a Spark master URL, got {shown(raw)}")
    return raw


# A host name as botocore accepts it (labels of letters, digits and inner hyphens), else an IP address.
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def endpoint_url(env: Mapping[str, str], name: str) -> str | None:
    """An http(s) URL with a valid host and port, or None when unset.

    botocore checks the endpoint only when the first client is made, deep inside a verb (or a Dagster
    run), and raised `ValueError: Invalid endpoint` there as a traceback."""
    raw = env.get(name) or None
    if raw is None:
        return None
    try:
        parts = urlsplit(raw)
        usable = parts.scheme in ("http", "https") and _is_host(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number from 0 to 65535
        usable = False
    if not usable or not raw.isprintable() or any(ch.isspace() for ch in raw):
        raise ConfigError(
            f"{name} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:5000, got {shown(raw)}"
        )
    return raw


def _is_host(host: str | None) -> bool:
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        name = host.removesuffix(".")
        return len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def spark_driver_host(env: Mapping[str, str]) -> str | None:
    raw = env.get("RUNSTATE_SPARK_DRIVER_HOST") or None
    if raw is not None and (not raw.isprintable() or any(ch.isspace() or ch == "/" for ch in raw)):
        raise ConfigError(f"RUNSTATE_SPARK_DRIVER_HOST must be a host name or address, got {shown(raw)}")
    return raw


def spark_conf_from_json(text: str) -> dict[str, str]:
    """RUNSTATE_SPARK_CONF: a JSON object of Spark settings whose values are strings, numbers or booleans.

    Spark's settings are text, so each value is written as Spark spells it (`true`, `4`, `0.5`); null, a
    nested object or an array has no such spelling and is refused rather than passed on as Python text.
    The master is RUNSTATE_SPARK_MASTER alone: one variable, one precedence.
    """
    name = "RUNSTATE_SPARK_CONF"
    try:
        conf = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise ConfigError(f"{name} must be a JSON object of Spark settings, got {_json_kind(conf)}")
    return {_spark_key(key): _spark_value(key, value) for key, value in conf.items()}


def _refuse_constant(constant: str) -> float:
    raise ValueError(f"{constant} is not a number JSON allows")


def _spark_key(key: str) -> str:
    if not key.strip() or not key.isprintable():
        raise ConfigError(f"RUNSTATE_SPARK_CONF: {shown(key)} is not a Spark setting name")
    if key.strip() == "spark.master":
        raise ConfigError("RUNSTATE_SPARK_CONF must not set spark.master: set RUNSTATE_SPARK_MASTER instead")
    return key


def _spark_value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf
        raise ConfigError(f"RUNSTATE_SPARK_CONF: {key} must be a finite number, got {value}")
    if isinstance(value, str | int | float):
        return str(value)
    raise ConfigError(
        f"RUNSTATE_SPARK_CONF: {key} must be a string, a number or a boolean, got {_json_kind(value)}"
    )


def _json_kind(value: object) -> str:
    kinds = {type(None): "null", bool: "a boolean", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), "an array" if isinstance(value, list) else "an object")
