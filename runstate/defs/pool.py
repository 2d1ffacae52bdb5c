"""The `runstate_spark` pool's limit in a Dagster instance: read, set, set where it is missing, safe to race.

Apart from the pool's sensor (`runstate.defs.instance.pools`) so that `runstate services up`, `db upgrade`
and `dev`, which set the limit, import the instance API only, not every domain's definitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg
from sqlalchemy.exc import IntegrityError

from runstate.defs.tags import SPARK_POOL

if TYPE_CHECKING:
    from dagster._core.storage.event_log.base import EventLogStorage


def spark_pool_limit(instance: dg.DagsterInstance) -> int | None:
    """The pool's limit in the instance (or its `concurrency: pools: default_limit`); None: unbounded."""
    if not instance.event_log_storage.supports_global_concurrency_limits:
        return None
    return instance.event_log_storage.get_concurrency_info(SPARK_POOL).limit


def set_spark_pool_limit(instance: dg.DagsterInstance, sessions: int) -> str:
    """Give the pool `sessions` slots (the setting wins over what the instance had); says what it did."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return f"Dagster pool {SPARK_POOL}: this instance's storage has no pools (run `dagster instance migrate`)"
    before = spark_pool_limit(instance)
    set_pool_slots(storage, SPARK_POOL, sessions)
    change = "" if before == sessions else f" (was {'unset' if before is None else before})"
    return f"Dagster pool {SPARK_POOL}: at most {sessions} Spark session(s) at once{change}"


def bound_spark_pool(instance: dg.DagsterInstance, sessions: int) -> None:
    """Give the pool its limit if the instance has none yet, before a run's Spark step claims a slot:
    in a plain instance nobody may have run `db upgrade`, and spark_pool_sensor's first tick can come
    after the first merges started, each with a JVM of its own (seen: 4 JVMs against a cap of 2)."""
    if spark_pool_limit(instance) is None and instance.event_log_storage.supports_global_concurrency_limits:
        set_pool_slots(instance.event_log_storage, SPARK_POOL, sessions)


def set_pool_slots(storage: EventLogStorage, pool: str, slots: int) -> None:
    """`storage.set_concurrency_slots`, safe to race. Dagster reads the pool's limit row, then inserts it
    when it is missing: two processes giving a new pool its limit at once (two `services up`, the first
    steps of two runs in a plain instance) both insert, and the loser's insert violates the key. The row
    is there once the winner has committed, so the loser's second attempt updates it."""
    try:
        storage.set_concurrency_slots(pool, slots)
    except IntegrityError:
        storage.set_concurrency_slots(pool, slots)
