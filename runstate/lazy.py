"""Names a package exports but imports on first use (PEP 562's module `__getattr__`).

For the packages whose modules load a database driver (psycopg and its pool, the Snowflake connector):
a caller that needs none of them, such as `runstate --help` or the configuration check, pays for none.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: each name of `modules` imported from its module when first read, then
    kept in the package like any other name."""

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(modules[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
