"""The producer: appends a list of changes to a dataset's WAL as one row with the next SeqNo.

SeqNo assignment is a conditional PutItem of row (dataset, seq) with attribute_not_exists: the row itself
is the claim, so two writers can never share a seq, and a crash can never leave a reserved-but-unwritten
seq behind (which a separate counter incremented first would). The candidate seq is the meta row's
LastSeq + 1; LastSeq is advanced (monotonic) after each successful put, so it may lag after a crash, in
which case the conditional put fails and the writer moves up one slot at a time. A slot is only tried
once every lower slot is taken, so seqs are gapless. Compaction trims only rows <= LastSeq, so no
writer ever probes a trimmed slot.

Why not TransactWriteItems (counter + row + token in one transaction)? The row-as-claim gives the same
guarantee with single-item requests (GetItem, PutItem, UpdateItem, BatchGetItem), each O(1) whatever
the table's size, and a transaction costs twice the write units. Nor a Query for the max seq: a
lagging hint is passed one single-item probe at a time instead.

Client tokens (a retried append never creates two rows): the token row ("#token#<dataset>#<token>", 0)
is claimed first with a conditional put that records the payload checksum and the highest seq at claim
time (Floor). Any writer completing that token (the first one, or a retry after a crash) scans the rows
above the last seq it has checked for a row carrying the token before each attempt, so once a row
with the token exists, no second one is written. The token row finally records AssignedSeq.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from runstate.wal import layout as t
from runstate.wal.changes import (
    DELETE,
    UPSERT,
    Change,
    check_depth,
    check_utf8,
    encode_changes,
    sha256_hex,
    validate_client_token,
    validate_dataset_id,
    validate_key,
)
from runstate.wal.errors import WalContentionError, WalInputError, WalIntegrityError, WalServiceError
from runstate.wal.table import WalTable

__all__ = ["Change", "WalProducer", "MAX_PAYLOAD_BYTES", "ROW_TYPE_DELTA", "ROW_TYPE_SNAPSHOT"]

# DynamoDB's item limit is 400 KB including attribute names and the other attributes: keep 16 KB spare.
MAX_PAYLOAD_BYTES = 400 * 1024 - 16 * 1024
ROW_TYPE_DELTA = "DELTA"
ROW_TYPE_SNAPSHOT = "SNAPSHOT"
MAX_ATTEMPTS = 200
log = logging.getLogger(__name__)


class WalProducer:
    """Appends changes to the WAL table `table` through a boto3 DynamoDB client (thread-safe)."""

    def __init__(self, dynamodb_client: Any, table: str) -> None:
        self.dynamodb = dynamodb_client
        self.table = table
        self.wal = WalTable(dynamodb_client, table)

    @classmethod
    def of(cls, table: WalTable) -> WalProducer:
        """The producer that appends through `table`."""
        return cls(table.client, table.name)

    def append(
        self,
        dataset_id: str,
        changes: Sequence[Change],
        client_token: str | None = None,
        *,
        now: datetime | None = None,
    ) -> int:
        """Append `changes` as one WAL row; returns its SeqNo. Bad input raises WalInputError, nothing written.

        With a `client_token`, a retry of the same append (same token, same changes) returns the first
        append's SeqNo; the same token with different changes is refused.
        """
        validate_dataset_id(dataset_id)
        if client_token is not None:
            validate_client_token(client_token)
        payload = _validated_payload(dataset_id, changes)
        checksum = sha256_hex(payload.encode("utf-8"))
        created_at = int((now or datetime.now(UTC)).timestamp())
        row = _Row(dataset_id, payload, checksum, created_at, client_token)
        if client_token is None:
            return self._write_row(row, checked_upto=None)
        floor = self.wal.meta(dataset_id).last_seq
        if self._claim_token(row, floor):
            return self._write_row(row, checked_upto=floor, hint=floor)
        token = self._token_item(dataset_id, client_token, checksum)
        if token is None:  # the claim failed because the row exists, and token rows are never deleted
            raise WalIntegrityError(
                f"dataset {dataset_id!r}: client token {client_token!r} vanished while claimed"
            )
        if t.ASSIGNED_SEQ in token:
            return int(token[t.ASSIGNED_SEQ]["N"])
        # Claimed but not finished (a crash, or a concurrent retry): finish it, scanning from the claim's floor.
        return self._write_row(row, checked_upto=int(token["Floor"]["N"]))

    # --- seq assignment ----------------------------------------------------------------------------------

    def _write_row(self, row: _Row, checked_upto: int | None, hint: int | None = None) -> int:
        """Put the row at the first free seq (conditional put = probe + claim); with a token, stop as soon as
        a row carrying it is found below the seq about to be tried."""
        candidate = (self.wal.meta(row.dataset_id).last_seq if hint is None else hint) + 1
        for attempt in range(MAX_ATTEMPTS):
            if row.client_token is not None and checked_upto is not None and candidate - 1 > checked_upto:
                existing = self._seq_with_token(row, checked_upto + 1, candidate - 1)
                if existing is not None:
                    return self._record_token_seq(row, existing)
                checked_upto = candidate - 1
            if self.wal.put_new(row.item(candidate)):
                self._advance_hint(row.dataset_id, candidate)
                return self._record_token_seq(row, candidate) if row.client_token is not None else candidate
            # Taken: by a concurrent writer (the hint has moved) or by one that died before moving it.
            if attempt >= 2:
                time.sleep(min(0.05, 0.001 * (2 ** min(attempt, 6))) * random.random())
            candidate = max(candidate + 1, self.wal.meta(row.dataset_id).last_seq + 1)
        raise WalContentionError(
            f"dataset {row.dataset_id!r}: gave up appending after {MAX_ATTEMPTS} attempts under write contention"
        )

    def _advance_hint(self, dataset_id: str, seq: int) -> None:
        try:
            self.wal.advance_seq_hint(dataset_id, seq)
        except WalServiceError as error:
            # The row is durably written: failing the append now would invite a duplicate retry.
            log.warning(
                "dataset %r: seq hint not advanced to %d (%s); the next writer probes past it",
                dataset_id,
                seq,
                error,
            )

    # --- client tokens -----------------------------------------------------------------------------------

    def _token_item(self, dataset_id: str, client_token: str, checksum: str) -> dict[str, Any] | None:
        item = self.wal.token_item(dataset_id, client_token)
        if item and item[t.CHECKSUM]["S"] != checksum:
            raise WalInputError(
                f"dataset {dataset_id!r}: client token {client_token!r} was already used for different changes"
            )
        return item

    def _claim_token(self, row: _Row, floor: int) -> bool:
        assert row.client_token is not None
        item = {
            **self.wal.token_key(row.dataset_id, row.client_token),
            t.CHECKSUM: {"S": row.checksum},
            "Floor": {"N": str(floor)},
            t.CREATED_AT: {"N": str(row.created_at)},
        }
        return self.wal.put_new(item)

    def _seq_with_token(self, row: _Row, first: int, last: int) -> int | None:
        """The seq in first..last whose row carries this append's client token, if any (consistent reads)."""
        for item in self.wal.get_rows(row.dataset_id, range(first, last + 1), t.CLIENT_TOKEN):
            if item.get(t.CLIENT_TOKEN, {}).get("S") == row.client_token:
                return int(item[t.SEQ_NO]["N"])
        return None

    def _record_token_seq(self, row: _Row, seq: int) -> int:
        assert row.client_token is not None
        if not self.wal.record_token_seq(row.dataset_id, row.client_token, seq):
            raise WalIntegrityError(
                f"dataset {row.dataset_id!r}: client token {row.client_token!r} is recorded with another seq "
                f"than {seq}"
            )
        return seq


class _Row:
    __slots__ = ("dataset_id", "payload", "checksum", "created_at", "client_token")

    def __init__(
        self, dataset_id: str, payload: str, checksum: str, created_at: int, client_token: str | None
    ):
        self.dataset_id = dataset_id
        self.payload = payload
        self.checksum = checksum
        self.created_at = created_at
        self.client_token = client_token

    def item(self, seq: int) -> dict[str, Any]:
        """The row as a new Pending WAL item at `seq`."""
        item = {
            t.DATASET_ID: {"S": self.dataset_id},
            t.SEQ_NO: {"N": str(seq)},
            t.STATUS_IDX: {"S": t.PENDING},
            t.TYPE: {"S": ROW_TYPE_DELTA},
            t.CHECKSUM: {"S": self.checksum},
            t.CREATED_AT: {"N": str(self.created_at)},
            t.PAYLOAD: {"S": self.payload},
        }
        if self.client_token is not None:
            item[t.CLIENT_TOKEN] = {"S": self.client_token}
        return item


def _validated_payload(dataset_id: str, changes: Sequence[Change]) -> str:
    if isinstance(changes, (str, bytes)) or not isinstance(changes, Sequence) or not changes:
        raise WalInputError(f"dataset {dataset_id!r}: changes must be a non-empty list of Change")
    for position, change in enumerate(changes):
        if not isinstance(change, Change):
            raise WalInputError(
                f"dataset {dataset_id!r}: change #{position} is a {type(change).__name__}, "
                "not a Change (use Change.upsert(key, value) or Change.delete(key))"
            )
        if change.op not in (UPSERT, DELETE):
            raise WalInputError(f"dataset {dataset_id!r}: change #{position} has unknown op {change.op!r}")
        validate_key(change.key)
        if change.op == UPSERT:  # a Change built directly, not through Change.upsert, is checked here
            check_depth(change.value, f"dataset {dataset_id!r}: value of key {change.key!r}")
    try:
        payload = encode_changes(changes)
    except (TypeError, ValueError) as error:
        raise WalInputError(f"dataset {dataset_id!r}: changes are not JSON-serialisable: {error}") from None
    check_utf8(payload, f"dataset {dataset_id!r}: the changes")
    size = len(payload.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise WalInputError(
            f"dataset {dataset_id!r}: payload of {size} bytes exceeds {MAX_PAYLOAD_BYTES} bytes "
            "(DynamoDB's 400 KB item limit); split the changes over several appends"
        )
    return payload
