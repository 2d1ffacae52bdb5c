"""The code location's entry point (workspace.yaml, `dagster dev -m runstate.definitions`, `dg`).

Nothing in the runstate package imports this module: the definitions are built in
`runstate.defs.location`, and the CLI builds its own through `runstate.commands`.
"""

from runstate.defs.location import build_definitions

defs = build_definitions()

__all__ = ["build_definitions", "defs"]
