"""Deprecated: the dataset tables moved to `runstate.wal.dataset_tables` (and `LakeError` is now
`DatasetTableError`). This alias stays for one release and warns when imported."""

import warnings

from runstate.wal.dataset_tables import *  # noqa: F403
from runstate.wal.dataset_tables import DatasetTableError
from runstate.wal.dataset_tables import __all__ as _moved

warnings.warn(
    "runstate.wal.lake is deprecated: import runstate.wal.dataset_tables instead "
    "(LakeError is now DatasetTableError)",
    DeprecationWarning,
    stacklevel=2,
)

LakeError = DatasetTableError
__all__ = [*_moved, "LakeError"]
