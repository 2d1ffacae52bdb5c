"""`runstate services` commands."""

from __future__ import annotations

COMMANDS: list = []
