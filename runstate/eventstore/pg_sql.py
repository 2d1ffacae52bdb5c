"""The Postgres store's row shapes: the event columns, the batch insert, and rows to StoredEvent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runstate.eventstore.contract import TERMINAL_EVENT_TYPES, EventType
from runstate.eventstore.validation import ValidEvent

# Raised by runstate_expect_inserted (sql/postgres/eventstore/002_event_feed.sql).
KEY_TAKEN_SQLSTATE = "RSK01"
# Raised by runstate_check_append (sql/postgres/eventstore/005_one_statement_append.sql).
GUESSED_WRONG_SQLSTATE = "RSK02"

EVENT_COLUMNS = (
    "run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,"
    " event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at, persisted_at,"
    " adapter_version, engine_run_ref, position"
)

# One statement inserts every new row of a batch and advances the run's stream row. The arrays go
# as binary parameters (%(x)b): no text escaping of every element on the client. The position packs
# the transaction id with the row's place in the batch (sql/postgres/eventstore/002_event_feed.sql).
_INSERT_BATCH = """
WITH rows AS (
  SELECT * FROM unnest(
    %(seq)b::bigint[], %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::text[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(adapter_version)b::text[], %(ref)b::text[]
  ) WITH ORDINALITY AS u(seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
                         event_type, data, key, caused_by, parent, emitted_at, adapter_version, ref, ord)
), tx AS (
  SELECT pg_current_xact_id()::text::bigint << 20 AS base
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, adapter_version, engine_run_ref, position)
  SELECT %(run_id)s, seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, data::jsonb, key, caused_by, parent, emitted_at, adapter_version, ref::jsonb,
         tx.base | ord
  FROM rows, tx
  {on_conflict}
  RETURNING 1
)
UPDATE run_streams
   SET last_seq = GREATEST(last_seq, %(last_seq)s),
       event_count = event_count + (SELECT count(*) FROM inserted),
       first_event_at = COALESCE(first_event_at, %(first_event_at)s),
       started_at = COALESCE(started_at, %(started_at)s),
       completed_at = COALESCE(completed_at, %(completed_at)s),
       updated_at = now()
 WHERE run_id = %(run_id)s
RETURNING event_count, {inserted}
"""
# append_batch inserts optimistically: a key already stored is skipped by ON CONFLICT, and the short
# count aborts the transaction (RSK01) so that the append can retry with the probe for stored keys.
INSERT_NEW = _INSERT_BATCH.replace(
    "{on_conflict}", "ON CONFLICT (run_id, idempotency_key) DO NOTHING"
).replace("{inserted}", "runstate_expect_inserted((SELECT count(*) FROM inserted), %(new)s)")
# import_events probes keys and run_seqs first; a key inserted by a racing writer is a UniqueViolation
# (retried).
INSERT_IMPORTED = _INSERT_BATCH.replace("{on_conflict}", "").replace(
    "{inserted}", "(SELECT count(*) FROM inserted)"
)


# The one-statement append (see sql/postgres/eventstore/005_one_statement_append.sql): the stream row's upsert
# takes the run's row lock and gives the seq the batch follows; the check, last, aborts the whole
# statement when a guess of the client was wrong. Columns whose values are all NULL go as a NULL
# array, which unnest pads.
_ONE_STATEMENT_APPEND = """
WITH stream AS (
  INSERT INTO run_streams AS s (run_id, last_seq, event_count, first_event_at, started_at, completed_at)
  VALUES (%(run_id)s, %(added)s, %(added)s, %(first_event_at)s, %(started_at)s, %(completed_at)s)
  ON CONFLICT (run_id) DO UPDATE
     SET last_seq = s.last_seq + EXCLUDED.last_seq,
         event_count = s.event_count + EXCLUDED.event_count,
         first_event_at = COALESCE(s.first_event_at, EXCLUDED.first_event_at),
         started_at = COALESCE(s.started_at, EXCLUDED.started_at),
         completed_at = COALESCE(s.completed_at, EXCLUDED.completed_at),
         updated_at = now()
  RETURNING s.last_seq - %(added)s AS before, s.event_count - %(added)s AS count_before,
            s.archived_at IS NOT NULL AS archived
), tx AS (
  SELECT pg_current_xact_id()::text::bigint << 20 AS base
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, adapter_version, engine_run_ref, position)
  SELECT %(run_id)s, stream.before + u.ord, u.event_id, u.step_id, u.engine_attempt_id,
         u.logical_attempt_id, u.plan_version, u.event_type, u.data::jsonb, u.key, u.caused_by,
         u.parent, u.emitted_at, u.adapter_version, u.ref::jsonb, tx.base | u.ord
  FROM stream, tx, unnest(
    %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::text[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(adapter_version)b::text[], %(ref)b::text[]
  ) WITH ORDINALITY AS u(event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
                         event_type, data, key, caused_by, parent, emitted_at, adapter_version, ref, ord)
){snapshot}
SELECT runstate_check_append(before, count_before, archived, %(expected)s, %(added)s, %(every)s,
                             %(signal_waiting)s, %(snapshot_seq)s, %(snapshot_count_before)s),
       count_before
FROM stream
"""
# The snapshot and the pruning of old ones ride in the same statement (the DELETE sees the table as
# it was before the INSERT: keep the newest keep-1 older snapshots next to the new one).
_WITH_SNAPSHOT = """, snapshot AS (
  INSERT INTO run_state_snapshots
    (run_id, seq, kind, encoding, payload, checksum, raw_bytes, stored_bytes, reason)
  VALUES (%(run_id)s, %(snapshot_seq)s, %(kind)s, %(encoding)s, %(payload)s, %(checksum)s, %(raw)s,
          %(stored)s, %(reason)s)
  ON CONFLICT (run_id, seq) DO NOTHING
), pruned AS (
  DELETE FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(snapshot_seq)s AND seq NOT IN (
    SELECT seq FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(snapshot_seq)s
    ORDER BY seq DESC LIMIT %(older)s)
)"""
ONE_STATEMENT_APPEND = _ONE_STATEMENT_APPEND.replace("{snapshot}", "")
ONE_STATEMENT_APPEND_WITH_SNAPSHOT = _ONE_STATEMENT_APPEND.replace("{snapshot}", _WITH_SNAPSHOT)


def one_statement_params(run_id: str, new: Sequence[ValidEvent]) -> dict[str, Any]:
    """The event columns of ONE_STATEMENT_APPEND (an all-NULL column as a NULL array)."""
    return {
        "run_id": run_id,
        "added": len(new),
        "event_id": [e.event_id for e in new],
        "step_id": _column([e.step_id for e in new]),
        "engine_attempt_id": _column([e.engine_attempt_id for e in new]),
        "logical_attempt_id": _column([e.logical_attempt_id for e in new]),
        "plan_version": _column([e.plan_version for e in new]),
        "event_type": [e.event_type for e in new],
        "data": _column([e.data_json for e in new]),
        "key": [e.idempotency_key for e in new],
        "caused_by": _column([e.caused_by_signal_id for e in new]),
        "parent": _column([e.parent_event_id for e in new]),
        "emitted_at": [e.emitted_at for e in new],
        "adapter_version": _column([e.adapter_version for e in new]),
        "ref": _column([e.engine_run_ref_json for e in new]),
        "first_event_at": new[0].emitted_at,
        "started_at": _first(new, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(new, TERMINAL_EVENT_TYPES),
    }


def _column(values: list[Any]) -> list[Any] | None:
    return None if values.count(None) == len(values) else values


@dataclass(frozen=True)
class Stream:
    last_seq: int
    event_count: int
    archived: bool


def batch_params(run_id: str, new: Sequence[tuple[int, ValidEvent]], last_seq: int) -> dict[str, Any]:
    events = [e for _, e in new]
    return {
        "run_id": run_id,
        "seq": [s for s, _ in new],
        "event_id": [e.event_id for e in events],
        "step_id": [e.step_id for e in events],
        "engine_attempt_id": [e.engine_attempt_id for e in events],
        "logical_attempt_id": [e.logical_attempt_id for e in events],
        "plan_version": [e.plan_version for e in events],
        "event_type": [e.event_type for e in events],
        "data": [e.data_json for e in events],
        "key": [e.idempotency_key for e in events],
        "caused_by": [e.caused_by_signal_id for e in events],
        "parent": [e.parent_event_id for e in events],
        "emitted_at": [e.emitted_at for e in events],
        "adapter_version": [e.adapter_version for e in events],
        "ref": [e.engine_run_ref_json for e in events],
        "last_seq": last_seq,
        "new": len(events),
        "first_event_at": events[0].emitted_at,
        "started_at": _first(events, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(events, TERMINAL_EVENT_TYPES),
    }


def _first(events: Iterable[ValidEvent], types: frozenset[str]) -> datetime | None:
    for event in events:
        if event.event_type in types:
            return event.emitted_at
    return None
