"""The code location's entry point (workspace.yaml, `dagster dev -m runstate.definitions`, `dg`).

Nothing in the runstate package imports this module: the definitions are built in
`runstate.defs.location`, and the CLI builds its own through `runstate.commands`.
"""

import gc

# Loading the code location makes a few hundred thousand objects (Dagster's and pydantic's models and
# schemas) that live as long as the process, and almost no garbage. The cyclic collector walked them again
# and again while they were made, then at each full collection and at exit: 1.6-2.1 CPU-s to import this
# module and collect once, against 1.3-1.4 s with the collector off during the import and the result
# frozen (gc.freeze: kept out of every later collection). Every run worker, code server and `dg` command
# pays this once, so each saves about half a second of CPU; the few cycles the import leaves are not freed.
_collecting = gc.isenabled()
gc.disable()
try:
    from runstate.defs.location import build_definitions

    defs = build_definitions()
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

__all__ = ["build_definitions", "defs"]
