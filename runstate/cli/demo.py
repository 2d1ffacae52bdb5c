"""`runstate demo` commands."""

from __future__ import annotations

COMMANDS: list = []
