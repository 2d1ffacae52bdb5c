"""What this code location needs from the Dagster instance it is loaded into, and what it finds missing.

runstate is often a guest: one more code location in a platform team's instance, whose dagster.yaml is
theirs. Its own bounds live in code where they can (the sensors hold one run per shard; `spark_pool_sensor`
keeps the Spark pool bounded); the rest are instance settings, and `runstate_instance_check` reads the
instance it runs in and says, on its tick (the UI's sensor page) and in the daemon's log, each setting
that is missing, what happens without it and exactly what to add, as block YAML that pastes into
dagster.yaml as it is (docs/OPERATIONS.md, "Adding runstate to an existing Dagster deployment").

It ticks every CHECK_INTERVAL_S: the daemon evaluates a sensor once that long has passed since its last
tick, even across a restart, so this interval is both how soon after a daemon start the first check comes
and how long the UI can show a message about settings already added. A tick only reads the instance's
settings and one row of its concurrency table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import yaml

from runstate.defs.pool import spark_pool_limit
from runstate.defs.tags import MERGE_SHARD_TAG, SPARK_POOL, TABLE_TAG, WAL_SHARD_TAG

# One in-progress run per value of each: the run queue's backing of the sensors' one run per shard.
SHARD_TAGS = (WAL_SHARD_TAG, MERGE_SHARD_TAG, TABLE_TAG)
PER_VALUE = {"applyLimitPerUniqueValue": True}
CHECK_INTERVAL_S = 30
# What the sensor daemon needs for wal_sensor's 5 s ticks: without threads they came at a median of 9.4 s.
SENSOR_WORKERS = 4
DOCS = 'docs/OPERATIONS.md, "Adding runstate to an existing Dagster deployment"'


@dataclass(frozen=True)
class MissingBound:
    """An instance setting runstate relies on that this instance lacks: what happens without it, and
    exactly what to add (dagster.yaml sections, or a command for what lives in the instance's storage)."""

    name: str
    without: str
    dagster_yaml: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    note: str = ""

    def yaml_lines(self) -> str:
        """The dagster.yaml lines to add, in block style: top-level keys at column 0, so they paste below
        the file's own sections as they are (a one-line `{key: {...}}` there stops the instance)."""
        return yaml.safe_dump(self.dagster_yaml, default_flow_style=False, sort_keys=False).rstrip("\n")

    def describe(self) -> str:
        """One line saying what is missing and what to do; with dagster.yaml lines, those follow it."""
        head = f"{self.name}: {self.without}"
        if not self.dagster_yaml:
            return f"{head}; run `{self.command}`{self.note}"
        instead = f" (or run `{self.command}`)" if self.command else ""
        return f"{head}; add these lines to dagster.yaml{instead}{self.note}:\n{self.yaml_lines()}"


def _pool_limit(instance: dg.DagsterInstance) -> MissingBound | None:
    if spark_pool_limit(instance) is not None:
        return None
    return MissingBound(
        f"a limit for the pool {SPARK_POOL}",
        "Spark sessions are unbounded until spark_pool_sensor sets it from RUNSTATE_SPARK_SESSIONS",
        command=f"dagster instance concurrency set {SPARK_POOL} 2",
        note=" (or `runstate db upgrade` with this DAGSTER_HOME: it sets RUNSTATE_SPARK_SESSIONS)",
    )


def _shard_tag_limits(instance: dg.DagsterInstance) -> MissingBound | None:
    queue = instance.get_concurrency_config().run_queue_config
    limits = queue.tag_concurrency_limits if queue is not None else []
    held = {limit["key"] for limit in limits if limit.get("value") == PER_VALUE and limit.get("limit") == 1}
    missing = [tag for tag in SHARD_TAGS if tag not in held]
    if not missing:
        return None
    return MissingBound(
        f"one in-progress run per value of {', '.join(missing)} in the run queue",
        "the sensors still request one run per shard, but a run launched by hand, a re-execution or a "
        "backfill can run beside a shard's live run",
        {
            "concurrency": {
                "runs": {
                    "tag_concurrency_limits": [
                        {"key": t, "value": dict(PER_VALUE), "limit": 1} for t in missing
                    ]
                }
            }
        },
        note=" (beside tag limits of your own; no run_coordinator tag limits with it)",
    )


def _run_monitoring(instance: dg.DagsterInstance) -> MissingBound | None:
    if instance.run_monitoring_enabled:
        return None
    return MissingBound(
        "run monitoring",
        "Dagster fails no run whose launch never finished and ignores `dagster/max_runtime`; only runstate's "
        "sensors end the dead runs that hold a shard, a maintenance claim or a Spark slot",
        {
            "run_monitoring": {
                "enabled": True,
                "start_timeout_seconds": 180,
                "poll_interval_seconds": 10,
                "max_resume_run_attempts": 0,
            }
        },
    )


def _run_retries(instance: dg.DagsterInstance) -> MissingBound | None:
    if instance.run_retries_enabled:
        return None
    return MissingBound(
        "run retries",
        "a run that fails to launch or dies is not retried: a schedule's run (inventory, orchestrator, "
        "compaction) waits for its next tick, while the sensors request their shards' work again",
        {"run_retries": {"enabled": True, "max_retries": 3}},
    )


def _launcher(instance: dg.DagsterInstance) -> MissingBound | None:
    from dagster._core.launcher import DefaultRunLauncher

    # Another launcher (K8s, ECS, Docker) is the deployment's choice: its health check is its own.
    if type(instance.run_launcher) is not DefaultRunLauncher:
        return None
    return MissingBound(
        "the run launcher's health check",
        "with Dagster's default launcher run monitoring cannot tell that a run's worker is gone (the sensors "
        "still judge liveness from each run's heartbeat)",
        {"run_launcher": {"module": "runstate.defs.runs.beating", "class": "HeartbeatRunLauncher"}},
        note=" (a drop-in for the default launcher)",
    )


def _automation(instance: dg.DagsterInstance) -> MissingBound | None:
    if instance.auto_materialize_use_sensors:
        return None
    return MissingBound(
        "automation sensors",
        "table_inventory's hourly AutomationCondition and the wal_lag check's are never evaluated",
        {"auto_materialize": {"use_sensors": True}},
        note=" (Dagster's default)",
    )


def _freshness(instance: dg.DagsterInstance) -> MissingBound | None:
    if instance.freshness_enabled:
        return None
    return MissingBound(
        "the freshness daemon",
        "the assets' FreshnessPolicies are never evaluated, so the UI shows no table as behind",
        {"freshness": {"enabled": True}},
        note=" (Dagster's default)",
    )


def _sensor_threads(instance: dg.DagsterInstance) -> MissingBound | None:
    if instance.get_settings("sensors").get("use_threads"):
        return None
    return MissingBound(
        "threads for the sensor daemon",
        "the daemon evaluates the sensors one after another, so each slow tick delays the rest: wal_sensor "
        "(every 5 s) was measured ticking at a median of 9.4 s and at most 32.7 s, and the WAL's flushes wait",
        {"sensors": {"use_threads": True, "num_workers": SENSOR_WORKERS}},
    )


CHECKS = (
    _pool_limit,
    _shard_tag_limits,
    _run_monitoring,
    _run_retries,
    _launcher,
    _sensor_threads,
    _automation,
    _freshness,
)


def missing_bounds(instance: dg.DagsterInstance) -> list[MissingBound]:
    """Every instance setting runstate relies on that `instance` lacks, in the order of CHECKS."""
    return [missing for check in CHECKS if (missing := check(instance)) is not None]


def report(missing: list[MissingBound]) -> str:
    if not missing:
        return "this Dagster instance has every setting runstate relies on"
    # A blank line around each item: its dagster.yaml lines stand alone, to be copied as they are.
    items = "\n\n".join(f"({n}) {bound.describe()}" for n, bound in enumerate(missing, start=1))
    return f"runstate: {len(missing)} setting(s) missing from this Dagster instance ({DOCS}):\n\n{items}"


@dg.sensor(
    name="runstate_instance_check",
    minimum_interval_seconds=CHECK_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reads the Dagster instance this code location runs in and names each setting runstate "
    "relies on that it lacks (pool limit, run queue tag limits, run monitoring, retries, launcher, sensor "
    "threads, automation, freshness), with the dagster.yaml lines to add. It launches no run.",
)
def runstate_instance_check(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    missing = missing_bounds(context.instance)
    for bound in missing:  # the tick's log in the UI, and the code server's output
        context.log.warning(bound.describe())
    return dg.SkipReason(report(missing))
