"""SnowflakeEventStore: the run state store on Snowflake, tested on fakesnow's server.

Snowflake enforces neither PRIMARY KEY nor UNIQUE and fakesnow cannot run the design's stored
procedure (shipped untested as sql/snowflake/eventstore/procedures/append_event.sql), so the append authority
lives here, application-side, inside one explicit transaction per batch:

1. `MERGE` the run's RUN_STREAMS row (insert it, or touch it). On Snowflake that DML statement
   takes the table's write lock until COMMIT, so appenders serialise; on fakesnow's DuckDB two
   transactions writing the same row conflict and the loser is rolled back.
2. Read LAST_SEQ and look up the batch's idempotency keys; assign new run_seqs from LAST_SEQ.
3. `MERGE INTO RUN_EVENTS ... ON (RUN_ID, IDEMPOTENCY_KEY) WHEN NOT MATCHED THEN INSERT` from a
   `SELECT ... PARSE_JSON(..) FROM VALUES ...` source: one statement for the whole batch.
4. Advance the stream row; write a state snapshot when due; COMMIT.

Any failure rolls back and the whole transaction is retried with jittered backoff. Every statement
writes absolute values (never `x = x + n`), so a statement the connector re-sends after a timeout
cannot double-count. `expected_last_seq` is checked after step 1, under the stream row's lock.

The feed, and its documented limit: each append takes one value of RUN_EVENTS_POSITION_SEQ just
before its transaction and gives its events positions (value << 20) + their place in the batch.
(fakesnow cannot take a sequence value inside a transaction that has written.) Positions are unique
and increase along each run, but Snowflake has no transaction ids or snapshots to build a
high-water mark from: two appenders that overlap can commit in the other order than their
positions, and a reader that passed the later position skips the earlier one. The feed is exact
when appenders do not overlap (what the tests check); Postgres is the backend for a gap-free feed.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from runstate import migrations, sqlfiles
from runstate.datastore import SnowflakeDatastore, check_schema_name
from runstate.datastore.snowflake import rollback_quietly
from runstate.eventstore.base import EventStore
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    AppendResult,
    ConcurrencyConflict,
    EventStoreError,
    InvalidEvent,
    RunSnapshot,
)
from runstate.eventstore.sf_append import _SfAppend
from runstate.eventstore.sf_archive import _SfArchive
from runstate.eventstore.sf_reads import _SfReads
from runstate.eventstore.sf_snapshots import _SfSnapshots
from runstate.eventstore.sf_sql import (
    Retry,
    retryable,
)
from runstate.eventstore.snapshots import EncodedSnapshot
from runstate.eventstore.validation import ValidEvent

log = logging.getLogger("runstate.eventstore.snowflake")
T = TypeVar("T")

_MAX_ATTEMPTS = 80


_sql = sqlfiles.named("snowflake", "eventstore", "store.sql")


class SnowflakeEventStore(_SfAppend, _SfSnapshots, _SfReads, _SfArchive, EventStore):
    """The event store on Snowflake through snowflake-connector-python; thread-safe."""

    def __init__(
        self,
        connection_factory: Callable[[], Any] | None = None,
        *,
        schema: str = "RUNSTATE",
        snapshot_interval: int = 100,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        connect_kwargs: Mapping[str, Any] | None = None,
        pool_size: int = 8,
        large_snapshot_bytes: int = 100 * 1024,
        merge_in_transactions: bool | None = None,
        datastore: SnowflakeDatastore | None = None,
    ):
        self.schema = check_schema_name(schema).upper()
        if datastore is not None and (
            connect_kwargs is not None or connection_factory is not None or datastore.schema != self.schema
        ):
            raise ValueError("give a datastore of this schema, or connect_kwargs / connection_factory")
        # The one owner of the connections (runstate.datastore): a bounded LIFO pool, since Snowflake
        # connections are few and slow to open; USE SCHEMA once per connection.
        self._store = datastore or SnowflakeDatastore(
            connect_kwargs, connection_factory=connection_factory, schema=self.schema, pool_size=pool_size
        )
        self._init_policy(
            max_event_bytes=max_event_bytes,
            snapshot_interval=snapshot_interval,
            keep_snapshots=keep_snapshots,
            large_snapshot_bytes=large_snapshot_bytes,
        )
        self._closed = False
        self._merge_in_tx = merge_in_transactions
        self._probe_lock = threading.Lock()
        self._init_recent()

    # -- connections --------------------------------------------------------------------------

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self._closed:
            raise EventStoreError("the event store is closed")
        with self._store.cursor() as cur:
            yield cur

    def _run(self, what: str, work: Callable[[Any], T], *, transactional: bool = True) -> T:
        """Run `work` (in BEGIN..COMMIT when transactional); on any driver error roll back and retry."""
        from snowflake.connector import errors as sf_errors

        last: Exception | None = None
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self._cursor() as cur:
                    if not transactional:
                        return work(cur)
                    cur.execute("BEGIN")
                    try:
                        result = work(cur)
                        cur.execute("COMMIT")
                        return result
                    except BaseException:
                        rollback_quietly(cur)
                        raise
            except (sf_errors.Error, Retry) as exc:
                if not retryable(exc):
                    raise EventStoreError(f"{what}: {_one_line(exc)}") from exc
                last = exc
                time.sleep(min(0.25, 0.003 * 2 ** min(attempt, 8)) * random.random())
            except InvalidEvent:
                raise
            except (ValueError, OverflowError) as exc:  # a stored value the connector cannot convert
                raise EventStoreError(f"{what}: unreadable value ({_one_line(exc)})") from exc
        raise ConcurrencyConflict(f"{what}: gave up after {_MAX_ATTEMPTS} attempts ({last})") from last

    def close(self) -> None:
        self._closed = True
        self._store.close()

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        from snowflake.connector import errors as sf_errors

        try:
            migrations.upgrade(self._store, "eventstore")
        except (sf_errors.Error, migrations.MigrationError) as exc:
            raise EventStoreError(f"schema {self.schema!r}: migrations failed: {_one_line(exc)}") from exc

    def _merge_usable(self) -> bool:
        """Can MERGE run inside an explicit transaction? Real Snowflake: yes. fakesnow: no (its MERGE
        emulation creates a temporary table, which DuckDB refuses mid-transaction). Probed once."""
        if self._merge_in_tx is None:
            with self._probe_lock:
                if self._merge_in_tx is None:
                    self._merge_in_tx = self._probe_merge()
                    if not self._merge_in_tx:
                        log.info(
                            "schema %s: MERGE is unavailable inside transactions (fakesnow); "
                            "using the equivalent INSERT ... WHERE NOT EXISTS",
                            self.schema,
                        )
        return self._merge_in_tx

    def _probe_merge(self) -> bool:
        from snowflake.connector import errors as sf_errors

        with self._cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(_sql("probe_merge"))
                return True
            except sf_errors.Error:
                return False
            finally:
                rollback_quietly(cur)

    # -- append -------------------------------------------------------------------------------

    def _append_valid(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        self._merge_usable()
        self._create_stream(run_id)
        position_base = self._position_base()
        for _ in range(_MAX_ATTEMPTS):
            written: list[tuple[RunSnapshot | None, EncodedSnapshot | None]] = []

            def work(cur: Any) -> list[AppendResult]:
                written.clear()
                return self._append_tx(cur, run_id, valid, state, written, expected_last_seq, position_base)

            results = self._run(f"append to run {run_id!r}", work)
            if not any(r.persisted for r in results) or self._committed(run_id, valid, results):
                for projection, encoded in written:  # at most one snapshot per append
                    if encoded is not None:
                        self.metrics.record_written(encoded)
                    self._remember(projection)
                return results
            # A failed COMMIT can look like success when the connector re-sends it (a second
            # COMMIT with no open transaction succeeds), so check; the retry is idempotent.
            log.warning("run %r: append not visible after COMMIT; retrying", run_id)
        raise ConcurrencyConflict(f"append to run {run_id!r}: commit could not be confirmed")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
