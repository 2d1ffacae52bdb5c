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
