"""A flush shard's lease: which run flushes the shard, fenced by a generation.

One control item per (shard count, shard) in the WAL table (`WalTable.put_control`, a version
compare-and-set): the holder (a run id), its generation, when it expires, and the successor waiting for
it. Every change is a conditional write on the item's version, so two writers never both win.

- `acquire`: a free, released or expired lease is taken (generation + 1); a lease handed to the caller
  is simply its own.
- `renew`: the holder pushes its expiry on; False (None) once it is no longer the holder: it stops.
- `offer`: a run that wants the shard registers as its successor (and refreshes that while it waits).
- `hand_over`: the holder gives the lease to a fresh successor (generation + 1) and stops taking rows;
  the successor sees itself the holder at its next look. So the successor holds the shard before the
  predecessor ends, and the shard is never held twice.
- `want_successor`: the holder near its budget asks for a successor (the sensor requests its run).
- `break_dead`: a holder its scheduler found dead loses the lease at once, so its replacement need not
  wait for the expiry.

The shard count is part of the item: after RUNSTATE_WAL_FLUSH_SHARDS changes, a shard is another set
of datasets, so it is another lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from runstate.wal import layout as t
from runstate.wal.errors import WalInputError
from runstate.wal.table import WalTable

DEFAULT_TTL_S = 60.0
# A holder's own write retried this often after losing to other writers' (offers) before it gives up.
_OWN_WRITE_TRIES = 5
HOLDER, GENERATION, EXPIRES_AT = "Holder", "Generation", "ExpiresAt"
SUCCESSOR, SUCCESSOR_SEEN_AT, WANTED = "Successor", "SuccessorSeenAt", "SuccessorWanted"


@dataclass(frozen=True)
class LeaseState:
    """The lease as read (version 0: no item yet). Times are epoch seconds."""

    holder: str = ""
    generation: int = 0
    expires_at: float = 0.0
    successor: str = ""
    successor_seen_at: float = 0.0
    wanted: bool = False
    version: int = 0

    def held_by(self, holder: str, now: float) -> bool:
        return bool(self.holder) and self.holder == holder and self.expires_at > now


def _decode(item: dict[str, Any] | None) -> LeaseState:
    if not item:
        return LeaseState()

    def number(name: str) -> float:
        return float(item.get(name, {"N": "0"})["N"])

    return LeaseState(
        holder=item.get(HOLDER, {"S": ""})["S"],
        generation=int(number(GENERATION)),
        expires_at=number(EXPIRES_AT),
        successor=item.get(SUCCESSOR, {"S": ""})["S"],
        successor_seen_at=number(SUCCESSOR_SEEN_AT),
        wanted=item.get(WANTED, {"BOOL": False})["BOOL"],
        version=int(number(t.VERSION)),
    )


def _encode(state: LeaseState) -> dict[str, Any]:
    return {
        HOLDER: {"S": state.holder},
        GENERATION: {"N": str(state.generation)},
        EXPIRES_AT: {"N": repr(state.expires_at)},
        SUCCESSOR: {"S": state.successor},
        SUCCESSOR_SEEN_AT: {"N": repr(state.successor_seen_at)},
        WANTED: {"BOOL": state.wanted},
    }


class ShardLease:
    """The lease of flush shard `shard` of `shards`; `clock` is wall time (expiries cross processes)."""

    def __init__(
        self,
        table: WalTable,
        shard: int,
        shards: int,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 <= shard < shards or ttl_s <= 0:
            raise WalInputError(
                f"a lease needs 0 <= shard < shards and ttl_s > 0, got {shard}, {shards}, {ttl_s}"
            )
        self.table, self.shard, self.ttl_s, self.clock = table, shard, ttl_s, clock
        self.item_id = t.lease_item_id(f"flush#{shards}#{shard}")

    def read(self) -> LeaseState:
        return _decode(self.table.control_item(self.item_id))

    def _write(self, old: LeaseState, new: LeaseState) -> LeaseState | None:
        if not self.table.put_control(self.item_id, _encode(new), old.version):
            return None
        return replace(new, version=old.version + 1)

    def _update_own(self, state: LeaseState, change: Callable[[LeaseState], LeaseState]) -> LeaseState | None:
        """`change` written to the lease while `state`'s holder and generation still hold it; None once they
        do not. A write that lost only to another writer's (a successor's offer moves the version too) is
        tried again on what it wrote: taking that for a lost lease ended a holder that still held it."""
        for _ in range(_OWN_WRITE_TRIES):
            current = self.read()
            if current.holder != state.holder or current.generation != state.generation:
                return None
            changed = change(current)
            if changed == current:  # already so (a second want_successor): nothing to write
                return current
            written = self._write(current, changed)
            if written is not None:
                return written
        return None

    def _successor_fresh(self, state: LeaseState, now: float) -> bool:
        return bool(state.successor) and now - state.successor_seen_at < self.ttl_s

    def acquire(self, holder: str) -> LeaseState | None:
        """The lease for `holder`: already its own (handed over), or taken because it was free or expired;
        None while someone else holds it."""
        state, now = self.read(), self.clock()
        if state.held_by(holder, now):
            return state
        if state.holder and state.expires_at > now:
            return None
        mine = state.successor == holder
        taken = LeaseState(
            holder=holder,
            generation=state.generation + 1,
            expires_at=now + self.ttl_s,
            successor="" if mine else state.successor,
            successor_seen_at=0.0 if mine else state.successor_seen_at,
        )
        return self._write(state, taken)

    def renew(self, state: LeaseState) -> LeaseState | None:
        """Push the expiry on; None when the lease is no longer `state.holder`'s (lost: stop flushing)."""
        return self._update_own(state, lambda current: replace(current, expires_at=self.clock() + self.ttl_s))

    def offer(self, holder: str) -> bool:
        """Register (or refresh) `holder` as the successor; False while another fresh successor waits.
        True, and nothing written, once `holder` holds the lease: a waiting run's offer that came right
        after the hand-over made it its own successor, and it handed the shard to itself and ended."""
        state, now = self.read(), self.clock()
        if state.holder == holder:
            return True
        if state.successor not in ("", holder) and self._successor_fresh(state, now):
            return False
        return self._write(state, replace(state, successor=holder, successor_seen_at=now)) is not None

    def withdraw(self, holder: str) -> bool:
        """`holder` no longer waits (its run is ending): it is not handed the lease. False if it was not
        the registered successor."""
        state = self.read()
        if state.successor != holder:
            return False
        return self._write(state, replace(state, successor="", successor_seen_at=0.0)) is not None

    def want_successor(self, state: LeaseState) -> LeaseState | None:
        return self._update_own(state, lambda current: replace(current, wanted=True))

    def hand_over(self, state: LeaseState) -> str | None:
        """Give the lease to its fresh successor (generation + 1); the successor's id, or None when there
        is none (or the lease is no longer ours)."""
        current, now = self.read(), self.clock()
        if current.holder != state.holder or current.generation != state.generation:
            return None
        if not self._successor_fresh(current, now):
            return None
        handed = LeaseState(
            holder=current.successor, generation=current.generation + 1, expires_at=now + self.ttl_s
        )
        return current.successor if self._write(current, handed) is not None else None

    def release(self, state: LeaseState) -> bool:
        """Let the lease go (a waiting successor acquires it at once); False when it was not ours."""
        released = self._update_own(
            state, lambda current: replace(current, holder="", expires_at=0.0, wanted=False)
        )
        return released is not None

    def break_dead(self, holder: str) -> bool:
        """The holder was found dead: it loses the lease now. False when it no longer holds it."""
        current = self.read()
        if not current.holder or current.holder != holder:
            return False
        return self._write(current, replace(current, holder="", expires_at=0.0, wanted=False)) is not None
