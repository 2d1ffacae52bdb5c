"""The run history's one frozen configuration, parsed once from the Settings."""

from __future__ import annotations

from dataclasses import dataclass

from runstate.config import LAKE_NAMESPACE, Settings

CATALOG = "lake"
EVENTS_TABLE = "run_events"
RUNS_TABLE = "runs"


@dataclass(frozen=True)
class HistoryConfig:
    """Where the history lives (`lake.<namespace>.run_events` and `.runs`) and its bounds.

    `batch_events`: the most events one Iceberg commit takes (an export holds one batch in memory);
    `max_lag_events` / `max_lag_minutes`: the lag beyond which the run_history_lag check fails;
    `export_interval_s`: how often run_history_sensor looks at the feed."""

    namespace: str = Settings.history_namespace
    batch_events: int = Settings.history_batch_events
    max_lag_events: int = Settings.history_max_lag_events
    max_lag_minutes: int = Settings.history_max_lag_minutes
    export_interval_s: int = Settings.history_export_interval_s

    def __post_init__(self) -> None:
        # The namespace is interpolated into Spark SQL: it must be a plain identifier.
        if not isinstance(self.namespace, str) or not LAKE_NAMESPACE.match(self.namespace):
            raise ValueError(f"run history namespace must be a lower-case identifier, got {self.namespace!r}")

    @classmethod
    def from_settings(cls, s: Settings) -> HistoryConfig:
        return cls(
            namespace=s.history_namespace,
            batch_events=s.history_batch_events,
            max_lag_events=s.history_max_lag_events,
            max_lag_minutes=s.history_max_lag_minutes,
            export_interval_s=s.history_export_interval_s,
        )

    @property
    def events_table(self) -> str:
        """`lake.<namespace>.run_events`: safe to interpolate (the namespace is a checked identifier)."""
        return f"{CATALOG}.{self.namespace}.{EVENTS_TABLE}"

    @property
    def runs_table(self) -> str:
        return f"{CATALOG}.{self.namespace}.{RUNS_TABLE}"
