"""Per-job action options (`jobs.options`) and their rules, checked once, when a request becomes an ActionPlan.

Iceberg's `CALL` parser takes no bound parameters, so every option that reaches SQL text is an
integer, a timestamp we format, or a sort order whose every term passed the ASCII-only validator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from runstate.maintenance.errors import InvalidActionOption

STRATEGIES = ("binpack", "sort")
# Iceberg refuses remove_orphan_files with an interval under 24 hours (concurrent writers' files).
MIN_ORPHAN_AGE_HOURS = 24
# Upper bounds: beyond them a value is a typo that would only fail later, inside Spark.
MAX_TARGET_FILE_SIZE_BYTES = 1 << 40
MAX_RETAIN_LAST = 100_000
MAX_AGE_HOURS = 10 * 365 * 24
MAX_SORT_ORDER_CHARS = 1000
# re.ASCII: with IGNORECASE alone, `[A-Za-z]` also matches the Kelvin sign, `ſ` and `İ`.
_SORT_TERM = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}( (ASC|DESC))?( NULLS (FIRST|LAST))?", re.IGNORECASE | re.ASCII
)


@dataclass(frozen=True)
class ActionSettings:
    """How each action runs; the defaults come from config, a job's `options` override them."""

    rewrite_strategy: str = "binpack"
    sort_order: str | None = None
    target_file_size_bytes: int = 128 * 1024 * 1024
    expire_older_than_hours: float = 72.0
    retain_last: int = 10
    orphan_older_than_hours: float = 72.0
    # rewrite_data_files also rewrites every data file with at least this many delete files (applying
    # them), and rewrite_position_delete_files then rewrites every delete file (dropping the positions
    # of data files that are gone, and the delete files left empty). None: Iceberg's defaults.
    delete_file_threshold: int | None = None
    # Time a full scan's planning before and after each action (a Spark planning pass each time).
    canary_planning: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None, base: ActionSettings | None = None
    ) -> ActionSettings:
        """Validate a job's options over `base`; any unknown key or bad value raises InvalidActionOption."""
        if options is not None and not isinstance(options, Mapping):
            raise InvalidActionOption(f"maintenance options must be a mapping, got {type(options).__name__}")
        options = dict(options or {})
        unknown = sorted(str(key)[:60] for key in set(options) - set(cls.names()))
        if unknown:
            raise InvalidActionOption(
                f"unknown maintenance option(s) {unknown[:5]}; known: {', '.join(cls.names())}"
            )
        return replace(base or cls(), **options).validated()

    def validated(self) -> ActionSettings:
        if not isinstance(self.rewrite_strategy, str) or self.rewrite_strategy not in STRATEGIES:
            raise InvalidActionOption(
                f"rewrite_strategy {_shown(self.rewrite_strategy)} must be one of {STRATEGIES}"
            )
        if self.sort_order is not None:
            if self.rewrite_strategy != "sort":
                raise InvalidActionOption("sort_order needs rewrite_strategy 'sort'")
            sort_order_sql(self.sort_order)
        _bounded_int("target_file_size_bytes", self.target_file_size_bytes, MAX_TARGET_FILE_SIZE_BYTES)
        _bounded_int("retain_last", self.retain_last, MAX_RETAIN_LAST)
        if self.delete_file_threshold is not None:
            _bounded_int("delete_file_threshold", self.delete_file_threshold, MAX_RETAIN_LAST)
        _hours("expire_older_than_hours", self.expire_older_than_hours)
        _hours("orphan_older_than_hours", self.orphan_older_than_hours)
        if not isinstance(self.canary_planning, bool):
            raise InvalidActionOption(
                f"canary_planning must be true or false, got {_shown(self.canary_planning)}"
            )
        if self.orphan_older_than_hours < MIN_ORPHAN_AGE_HOURS:
            raise InvalidActionOption(
                f"orphan_older_than_hours {self.orphan_older_than_hours} is under {MIN_ORPHAN_AGE_HOURS}: "
                "Iceberg refuses it, files of running writers could be deleted"
            )
        return self


def _shown(value: object) -> str:
    """repr() cut short: an error message must stay one readable line whatever was passed."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bounded_int(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidActionOption(f"{name} must be an integer from 1 to {maximum}, got {_shown(value)}")


def _hours(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidActionOption(f"{name} must be a number of hours, got {_shown(value)}")
    if not math.isfinite(value) or not 0 <= value <= MAX_AGE_HOURS:
        raise InvalidActionOption(f"{name} must be from 0 to {MAX_AGE_HOURS} hours, got {_shown(value)}")


def sort_order_sql(sort_order: object) -> str:
    """`id DESC NULLS LAST, v` -> the same text, after every term passed the validator."""
    if not isinstance(sort_order, str) or not sort_order.strip() or len(sort_order) > MAX_SORT_ORDER_CHARS:
        raise InvalidActionOption(
            "sort_order must be text like `id DESC NULLS LAST, ts`"
            f" (at most {MAX_SORT_ORDER_CHARS} characters),"
            f" got {_shown(sort_order)}"
        )
    terms = [term.strip() for term in sort_order.split(",")]
    for term in terms:
        if "\n" in term or not _SORT_TERM.fullmatch(" ".join(term.split())):
            raise InvalidActionOption(
                f"sort_order term {_shown(term)} must be `column [ASC|DESC] [NULLS FIRST|LAST]`"
            )
    return ", ".join(" ".join(term.split()) for term in terms)


def timestamp_literal(moment: datetime) -> str:
    """A Spark TIMESTAMP literal in UTC, with the zone spelled out so session settings cannot shift it."""
    utc = moment.astimezone(UTC)
    return f"TIMESTAMP '{utc.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'"
