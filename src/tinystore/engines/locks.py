"""The locks engine: leases, waiters and fences of locks and semaphores, all in memory.

A lock is a semaphore of ``limit`` 1. Each ``(lock, key)`` has at most ``limit`` live leases (LOCK-01) and a
first-come-first-served line of waiters (LOCK-03). Giving, renewing and releasing a lease writes nothing to
disk; only the fence ``epoch`` is persisted, by the core, which passes it in (LOCK-02).

Time is the :class:`~tinystore.clock.Clock`'s, in float seconds since the Unix epoch. A lease of a non-local
peer runs out ``ttl`` after its last renewal (LOCK-05); a lease of the store's own process (``peer.local``)
ends only when released or at ``max_hold`` (LOCK-06). When a lease runs out the engine pushes
``locks.lost`` (:class:`~tinystore.protocol.locks.Lost`) to the peer that last renewed it and passes the key
on to the next waiter.

Deadlines live in one heap of the engine with a single clock timer for the earliest one, so an acquire
costs a heap push and a release costs nothing but dict deletes; stale heap entries are dropped lazily and
the heap is compacted when most of it is stale. Renewals only move a deadline later and never touch the
heap: when an entry comes due for a lease renewed since, it is pushed again at the new deadline.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import math
import os
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NoReturn

from ..clock import Clock, Timer
from ..durations import MAX_SECONDS
from ..errors import ClosedError, InUseError, InvalidError, LostError
from ..limits import Limits
from ..names import check_name
from ..protocol.locks import EXPIRED, LOST, MAX_HOLD, Grant, Lost, to_ms
from ..protocol.values import shown
from .base import Peer

__all__ = ["LocksEngine"]

log = logging.getLogger("tinystore.locks")

KEY_MAX = 256
LIMIT_MAX = 1_000_000
"""The largest ``limit`` of a semaphore."""
STATUS_KEYS = 1000
"""The most keys :meth:`LocksEngine.status` lists (it counts them all)."""
"""The longest key, in characters."""
ENDED_KEPT = 4096
"""How many leases that ran out are remembered, so that their late renewal says when and why."""
_COMPACT_MIN = 64
_INF = math.inf


def fmt_seconds(value: float) -> str:
    """A duration in seconds as short text: ``0.5s``, ``30s``, ``1m30s``, ``1h``."""
    if not math.isfinite(value):
        return str(value)
    if value < 60:
        return f"{value:g}s"
    hours, rest = divmod(value, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{int(hours)}h"
    if minutes:
        out += f"{int(minutes)}m"
    if secs:
        out += f"{secs:g}s"
    return out


def _where(lock: str, key: str) -> str:
    return f"lock {lock}: key {json.dumps(key, ensure_ascii=False)}"


class _Lock:
    """One lock name while any key of it has leases or waiters: those keys."""

    __slots__ = ("keys", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.keys: dict[str, _Key] = {}


class _Key:
    """One key of a lock while it has leases or waiters: its ``limit`` (what they were given under), its live
    leases (by id) and its line of waiters (oldest first)."""

    __slots__ = ("key", "leases", "limit", "lock", "waiters")

    def __init__(self, lock: _Lock, key: str, limit: int) -> None:
        self.lock = lock
        self.key = key
        self.limit = limit
        self.leases: dict[int, _Lease] = {}
        self.waiters: OrderedDict[_Waiter, None] = OrderedDict()


class _Lease:
    """A live lease. ``deadline``: when it runs out (``inf``: never by ttl). ``armed_at``: the deadline of its
    one valid entry in the engine's heap (``None``: no entry)."""

    __slots__ = ("armed_at", "deadline", "fence", "id", "max_hold", "max_hold_at", "peer", "slot", "ttl")

    def __init__(
        self,
        lease_id: int,
        fence: int,
        slot: _Key,
        peer: Peer,
        ttl: float,
        max_hold: float | None,
        max_hold_at: float | None,
        deadline: float,
    ) -> None:
        self.id = lease_id
        self.fence = fence
        self.slot = slot
        self.peer = peer
        self.ttl = ttl
        self.max_hold = max_hold
        self.max_hold_at = max_hold_at
        self.deadline = deadline
        self.armed_at: float | None = None


class _Waiter:
    """One acquire waiting in a key's line; ``future`` gets its :class:`Grant` or an error."""

    __slots__ = ("future", "max_hold", "on_grant", "peer", "slot", "timer", "ttl", "wait")

    def __init__(
        self,
        future: asyncio.Future[Grant],
        slot: _Key,
        peer: Peer,
        ttl: float,
        max_hold: float | None,
        wait: float,
    ) -> None:
        self.future = future
        self.slot = slot
        self.peer = peer
        self.ttl = ttl
        self.max_hold = max_hold
        self.wait = wait
        self.timer: Timer | None = None
        self.on_grant: Callable[[Grant], object] | None = None


class LocksEngine:
    """Locks and semaphores of one store run, in memory.

    ``clock`` gives the time and the timers; ``limits`` the ttl bounds (``lock_ttl_min`` .. ``lock_ttl_max``,
    seconds); ``epoch`` the persisted fence epoch (ms, only grows from run to run, 0 .. 2**64-1), so that
    fences are ``epoch << 64 | counter`` with the counter starting at 1 in each run (LOCK-02).

    Every method but :meth:`acquire` is synchronous and never waits. Callers run on the clock's event loop.
    """

    def __init__(self, clock: Clock, limits: Limits, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 1 << 64:
            raise InvalidError(f"locks: fence epoch {epoch!r} must be an int in 0 .. 2**64-1")
        self._clock = clock
        self._limits = limits
        self._ttl_min = float(limits.lock_ttl_min)
        self._ttl_max = float(limits.lock_ttl_max)
        self._epoch = epoch
        self._fence_base = epoch << 64
        self._counter = 0
        self._granting = True  # False once the store is stopping (see stop_granting)
        self._locks: dict[str, _Lock] = {}
        self._leases: dict[int, _Lease] = {}
        self._ended: OrderedDict[int, tuple[str, str, str, float, float | None]] = OrderedDict()
        self._peer_waiters: dict[int, dict[_Waiter, None]] = {}
        self._heap: list[tuple[float, int]] = []
        self._armed = 0
        self._timer: Timer | None = None
        self._timer_at = _INF
        self._ids: list[int] = []
        self._closed = False

    # ------------------------------------------------------------------ acquire

    async def acquire(
        self,
        peer: Peer,
        lock: str,
        key: str,
        *,
        limit: int = 1,
        ttl: float,
        max_hold: float | None,
        wait: float | None,
    ) -> Grant | None:
        """A lease on ``key`` of ``lock`` for ``peer``; ``None`` for a try that found the key held.

        - ``limit``: 1 for a lock, the number of permits of a semaphore (>= 1). Every acquire on a lock that
          has live leases or waiters must name the limit they were given under.
        - ``ttl``: seconds, within ``limits.lock_ttl_min`` .. ``lock_ttl_max``. A non-local peer's lease runs
          out ``ttl`` after its grant or last :meth:`renew`; a local peer's never does (LOCK-05).
        - ``max_hold``: seconds from the grant past which the lease ends whatever its renewals (> 0), or
          ``None`` (LOCK-06).
        - ``wait``: ``None`` to try: a grant or ``None`` at once. Else seconds (>= 0, ``inf`` for no bound)
          to wait in line, first come first served; a lease given after a wait gets a full ttl from the moment
          it is given (LOCK-03, LOCK-04).

        Returns a :class:`~tinystore.protocol.locks.Grant` (``expires_at`` is ``inf`` for a local peer
        without ``max_hold``). Raises ``InvalidError`` for a bad name, key, limit, ttl, wait or max_hold,
        ``InUseError`` when the key stayed held for all of ``wait``, ``ClosedError`` when the engine is
        closed or ``peer`` is dropped (:meth:`drop_peer`) while it waits. A cancel while waiting leaves the
        line and keeps nothing: a lease given in the same loop turn as the cancel is released at once.
        """
        got = self._begin(peer, lock, key, limit, ttl, max_hold, wait)
        if isinstance(got, _Key):
            return await self._wait(got, peer, ttl, max_hold, self._line_wait(peer, wait))
        return got

    def _begin(
        self,
        peer: Peer,
        lock: str,
        key: str,
        limit: int,
        ttl: float,
        max_hold: float | None,
        wait: float | None,
    ) -> Grant | _Key | None:
        """Check the arguments and grant at once when a place is free: a :class:`Grant`; ``None`` for a try
        that found the key held; the key's :class:`_Key` when the caller must wait in its line."""
        if self._closed:
            raise ClosedError(f"{_where(str(lock), str(key))}: the store is closed")
        try:
            bad = (
                type(lock) is not str
                or type(key) is not str
                or not key
                or len(key) > KEY_MAX
                or type(limit) is not int
                or not 1 <= limit <= LIMIT_MAX
                or isinstance(ttl, bool)
                or not self._ttl_min <= ttl <= self._ttl_max
                or (wait is not None and (isinstance(wait, bool) or not (MAX_SECONDS >= wait >= 0 or wait == _INF)))
                or (max_hold is not None and (isinstance(max_hold, bool) or not MAX_SECONDS >= max_hold > 0))
            )
        except TypeError:
            bad = True
        if bad:
            self._invalid(lock, key, limit, ttl, max_hold, wait)
        lk = self._locks.get(lock)
        slot: _Key | None = None
        if lk is not None:
            slot = lk.keys.get(key)
            if slot is not None and (len(slot.leases) >= limit or slot.limit != limit):
                self._expire_due(slot)  # deadlines passed whose timer has not run yet: LOCK-01 at any instant
                lk = self._locks.get(lock)  # passing the key on may have dropped it
                slot = None if lk is None else lk.keys.get(key)
            if slot is not None and slot.limit != limit:
                # (the limit is the key's: another key of the name, or this one once idle, may have another)
                raise InvalidError(
                    f"{_where(lock, key)}: limit {limit} differs from limit {slot.limit}, the limit its leases "
                    "and waiters have now; give one limit for a lock everywhere (a lock is limit 1)"
                )
        if lk is None:
            check_name("lock", lock)
            lk = self._locks[lock] = _Lock(lock)
        if slot is None:
            slot = lk.keys[key] = _Key(lk, key, limit)
        if not self._granting and not peer.local:
            return slot  # (stopping: in line, with no wait of its own, until close fails it; see stop_granting)
        if len(slot.leases) < limit and (
            not slot.waiters or (not self._granting and not any(w.peer.local for w in slot.waiters))
        ):  # (while stopping, the others' asks in line are not ahead of the store's own)
            return self._grant(slot, peer, ttl, max_hold)
        if wait is None:
            return None
        if wait == 0:
            raise InUseError(f"{_where(lock, key)}: held (no wait)")  # (trial BU: "held for all of the 0s wait")
        return slot

    def acquire_start(
        self,
        peer: Peer,
        lock: str,
        key: str,
        *,
        limit: int = 1,
        ttl: float,
        max_hold: float | None,
        wait: float | None,
        on_grant: Callable[[Grant], object] | None = None,
    ) -> Grant | asyncio.Future[Grant] | None:
        """:meth:`acquire` without a coroutine, for callers that cannot await in place (the server's methods).

        Returns a :class:`Grant` or ``None`` (a try that found the key held) at once, or — when the caller must
        wait — a future that is already in the key's line (first come, first served from this call on). The
        future gets the grant, or ``InUseError`` when the wait runs out, or ``ClosedError`` (the engine closed,
        or ``peer`` dropped). Cancelling the future leaves the line and keeps nothing; a caller that gives up
        on a future that already has its grant must :meth:`release` it. ``on_grant(grant)``, if given, is also
        called at the very moment a waiting future gets its grant (in the call that let go of the key, before
        the future's own callbacks run). Raises as :meth:`acquire` does for bad arguments, and ``InUseError``
        at once for ``wait=0`` on a held key.
        """
        got = self._begin(peer, lock, key, limit, ttl, max_hold, wait)
        if isinstance(got, _Key):
            waiter = self._enqueue(got, peer, ttl, max_hold, self._line_wait(peer, wait))
            waiter.on_grant = on_grant
            return waiter.future
        return got

    def _line_wait(self, peer: Peer, wait: float | None) -> float:
        """How long an ask that :meth:`_begin` put in line waits there: its ``wait``; with no bound for another
        client's ask while the store stops (a try too), which the close fails (see :meth:`stop_granting`)."""
        if wait is None or not (self._granting or peer.local):
            return _INF
        return wait

    def _enqueue(self, slot: _Key, peer: Peer, ttl: float, max_hold: float | None, wait: float) -> _Waiter:
        """Put a waiter at the end of ``slot``'s line; cancelling its future takes it out again."""
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, slot, peer, ttl, max_hold, wait)
        slot.waiters[waiter] = None
        self._peer_waiters.setdefault(peer.id, {})[waiter] = None
        if wait != _INF:
            waiter.timer = self._clock.call_later(wait, lambda: self._wait_ran_out(waiter))
        future.add_done_callback(lambda f: self._leave(waiter) if f.cancelled() else None)
        return waiter

    async def _wait(self, slot: _Key, peer: Peer, ttl: float, max_hold: float | None, wait: float) -> Grant:
        waiter = self._enqueue(slot, peer, ttl, max_hold, wait)
        future = waiter.future
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # Granted in the same loop turn as the cancel: nobody will hold it, so let it go now.
                self.release(peer, future.result().lease)
            raise
        finally:
            self._leave(waiter)

    def _wait_ran_out(self, waiter: _Waiter) -> None:
        waiter.timer = None
        if waiter.future.done():
            return
        slot = waiter.slot
        self._leave(waiter)
        waiter.future.set_exception(
            InUseError(f"{_where(slot.lock.name, slot.key)}: held for all of the {fmt_seconds(waiter.wait)} wait")
        )

    def _leave(self, waiter: _Waiter) -> None:
        """Take ``waiter`` out of its line and the peer's index (idempotent); drop an empty key."""
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        slot = waiter.slot
        if waiter in slot.waiters:
            del slot.waiters[waiter]
            self._unindex(waiter)
            if not slot.leases and not slot.waiters:
                self._drop_slot(slot)

    def _unindex(self, waiter: _Waiter) -> None:
        mine = self._peer_waiters.get(waiter.peer.id)
        if mine is not None:
            mine.pop(waiter, None)
            if not mine:
                del self._peer_waiters[waiter.peer.id]

    def _invalid(
        self, lock: object, key: object, limit: object, ttl: object, max_hold: object, wait: object
    ) -> NoReturn:
        check_name("lock", lock)
        if type(key) is not str:
            raise InvalidError(f"lock {lock}: key {key!r}: the engine takes a key as text, not {type(key).__name__}")
        where = _where(str(lock), key)
        if not key or len(key) > KEY_MAX:
            raise InvalidError(f"{_where(str(lock), key[:40])}: a key is 1 to {KEY_MAX} characters")
        if type(limit) is not int or not 1 <= limit <= LIMIT_MAX:
            raise InvalidError(f"{where}: limit {shown(limit)} must be an int from 1 to {LIMIT_MAX}")
        lo, hi = fmt_seconds(self._ttl_min), fmt_seconds(self._ttl_max)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or math.isnan(ttl):
            raise InvalidError(f"{where}: ttl {ttl!r} must be a number of seconds in {lo} .. {hi}")
        if not self._ttl_min <= ttl <= self._ttl_max:
            raise InvalidError(f"{where}: ttl {fmt_seconds(ttl)} is outside {lo} .. {hi}")
        # (at most 100 years, as the SDK takes them: trial DG's max_hold of 2**64-1 ms, from a raw client, was
        # granted, then its answer (max_hold_at) could not be encoded: the caller was told of an internal error
        # while the key stayed held, by nobody, for its ttl)
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not (MAX_SECONDS >= wait >= 0 or wait == _INF)
        ):
            raise InvalidError(f"{where}: wait {wait!r} must be a number of seconds from 0 to 100 years (36500d)")
        raise InvalidError(
            f"{where}: max_hold {max_hold!r} must be a number of seconds above 0 and at most 100 years (36500d)"
        )

    # ------------------------------------------------------------------ grants and deadlines

    def _grant(self, slot: _Key, peer: Peer, ttl: float, max_hold: float | None) -> Grant:
        now = self._clock.now()
        self._counter += 1
        fence = self._fence_base | self._counter
        lease_id = self._new_id()
        if max_hold is None:
            max_hold_at = None
            deadline = _INF if peer.local else now + ttl
        else:
            max_hold_at = now + max_hold
            deadline = max_hold_at if peer.local else min(now + ttl, max_hold_at)
        lease = _Lease(lease_id, fence, slot, peer, ttl, max_hold, max_hold_at, deadline)
        slot.leases[lease_id] = lease
        self._leases[lease_id] = lease
        if deadline != _INF:
            self._arm(lease, deadline)
        return Grant(lease=lease_id, fence=fence, expires_at=deadline, max_hold_at=max_hold_at, ttl=ttl)

    def _new_id(self) -> int:
        while True:
            if not self._ids:
                self._ids = array("Q", os.urandom(8 * 256)).tolist()
            lease_id = self._ids.pop() >> 1
            if lease_id and lease_id not in self._leases and lease_id not in self._ended:
                return lease_id

    def _arm(self, lease: _Lease, when: float) -> None:
        """Give ``lease`` its one heap entry at ``when`` (an older entry turns stale); set the clock timer."""
        if lease.armed_at is None:
            self._armed += 1
        lease.armed_at = when
        heapq.heappush(self._heap, (when, lease.id))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = self._clock.call_at(when, self._on_timer)

    def _disarm(self, lease: _Lease) -> None:
        if lease.armed_at is None:
            return
        lease.armed_at = None
        self._armed -= 1
        heap = self._heap
        if self._armed == 0:
            heap.clear()
        elif len(heap) > _COMPACT_MIN and len(heap) > 4 * self._armed:
            heap[:] = [(x.armed_at, x.id) for x in self._leases.values() if x.armed_at is not None]
            heapq.heapify(heap)

    def _on_timer(self) -> None:
        at = self._timer_at
        self._timer = None
        self._timer_at = _INF
        if self._closed:
            return
        now = self._clock.now()
        # a test clock's advance may pass several deadlines at once: end only the leases due at this timer's time,
        # and leave the later ones to the timer armed below, which the clock fires after the other timers due
        # before them (a waiter whose wait ends first must not be handed a key that passes later)
        limit = min(now, at) if self._clock.is_test else now
        heap = self._heap
        leases = self._leases
        while heap:
            when, lease_id = heap[0]
            lease = leases.get(lease_id)
            if lease is None or lease.armed_at != when:
                heapq.heappop(heap)  # stale: released, or armed again since
                continue
            if when > limit:
                break
            heapq.heappop(heap)
            if lease.deadline > now:  # renewed since this entry was pushed
                lease.armed_at = lease.deadline
                heapq.heappush(heap, (lease.deadline, lease_id))
                continue
            lease.armed_at = None
            self._armed -= 1
            self._lose(lease, now)
        if not self._armed:
            heap.clear()
        elif heap and heap[0][0] < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = heap[0][0]
            self._timer = self._clock.call_at(self._timer_at, self._on_timer)

    def _expire_due(self, slot: _Key) -> None:
        """End the leases of ``slot`` whose deadline passed but whose timer has not run yet."""
        now = self._clock.now()
        for lease in [x for x in slot.leases.values() if x.deadline <= now]:
            self._disarm(lease)
            self._lose(lease, now)

    def _lose(self, lease: _Lease, now: float) -> None:
        """``lease`` ran out (ttl or max_hold): remove it, remember why, tell its peer, pass the key on."""
        slot = lease.slot
        del self._leases[lease.id]
        del slot.leases[lease.id]
        reason = MAX_HOLD if lease.max_hold_at is not None and lease.deadline >= lease.max_hold_at else EXPIRED
        at = lease.deadline
        ended = self._ended
        ended[lease.id] = (slot.lock.name, slot.key, reason, at, lease.max_hold)
        if len(ended) > ENDED_KEPT:
            ended.popitem(last=False)
        peer = lease.peer
        if not peer.closed:
            body = Lost(
                lease=lease.id,
                reason=reason,
                lock=slot.lock.name,
                key=slot.key,
                at_ms=to_ms(at) or 0,
                message=self._lost_message(lease.id),
            )
            try:
                peer.push(LOST, body)
            except Exception:  # a Peer must not raise; the key is passed on whatever it does
                log.exception("locks: push of %s to peer %s failed", LOST, peer.id)
        self._pass(slot)

    def stop_granting(self) -> None:
        """The store is stopping: from now on no lease is given to another client (a peer that is not local). A
        key let go goes to the store's own waiters only (an embedded store's code: its job handlers, in their
        grace, may still take keys: trial DV); another client's ask, a try too, waits in line with
        no wait of its own until :meth:`close` fails it, and the SDK then asks the next server (LOCK-07), which
        answers it truly (trial DV: told "held" of a free key, a handler skipped its work). Before, an embedded
        store being closed, while a holder of its own ran its block's clean-up, gave the key to another client's
        waiter, whose block began only to be told at once that the store was stopping (trial DT). Another
        client's asks already in line lose their wait too (trial DW: one was told "held for all of the wait" of
        a key let go meanwhile)."""
        self._granting = False
        for waiters in self._peer_waiters.values():
            for waiter in waiters:
                if not waiter.peer.local and waiter.timer is not None:
                    waiter.timer.cancel()
                    waiter.timer = None

    def _pass(self, slot: _Key) -> None:
        """Give free places of ``slot`` to its waiters, oldest first (LOCK-04); drop the key when empty. While the
        store stops, to its own (local) waiters only (see :meth:`stop_granting`)."""
        waiters = slot.waiters
        limit = slot.limit
        if self._granting:
            while waiters and len(slot.leases) < limit:
                waiter, _ = waiters.popitem(last=False)
                self._give(slot, waiter)
        else:
            for waiter in [w for w in waiters if w.peer.local]:
                if len(slot.leases) >= limit:
                    break
                del waiters[waiter]
                self._give(slot, waiter)
        if not slot.leases and not waiters:
            self._drop_slot(slot)

    def _give(self, slot: _Key, waiter: _Waiter) -> None:
        """Give ``waiter``, just taken out of ``slot``'s line, its lease (one that gave up, or whose connection
        closed, gets nothing)."""
        self._unindex(waiter)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        if waiter.future.done():  # cancelled, its task has not run its clean-up yet
            return
        if waiter.peer.closed:
            waiter.future.set_exception(
                ClosedError(f"{_where(slot.lock.name, slot.key)}: the connection closed while waiting")
            )
            return
        grant = self._grant(slot, waiter.peer, waiter.ttl, waiter.max_hold)
        waiter.future.set_result(grant)
        if waiter.on_grant is not None:
            try:
                waiter.on_grant(grant)
            except Exception:  # the key is passed on whatever the hook does
                log.exception("locks: a grant hook failed")

    def _drop_slot(self, slot: _Key) -> None:
        lk = slot.lock
        if lk.keys.get(slot.key) is slot:
            del lk.keys[slot.key]
            if not lk.keys and self._locks.get(lk.name) is lk:
                del self._locks[lk.name]

    # ------------------------------------------------------------------ renew, release, peers

    def renew(self, peer: Peer, lease: int) -> float:
        """Extend lease ``lease`` by its ttl from now, with ``peer`` as its holder; return the new deadline.

        ``peer`` may be any peer: after a reconnect the SDK renews by id from its new connection, and the
        ``locks.lost`` push goes to the peer that renewed last. The result is seconds since the Unix epoch,
        never past ``max_hold_at``; ``inf`` when ``peer`` is local and the lease has no ``max_hold``.
        Raises ``LostError`` when the lease ran out (ttl or max_hold), was released, or is unknown (given
        before a restart), ``ClosedError`` when the engine is closed.
        """
        if self._closed:
            raise ClosedError(f"lock: lease {lease}: the store is closed")
        held = self._leases.get(lease)
        if held is None:
            raise LostError(self._lost_message(lease))
        now = self._clock.now()
        if held.deadline <= now:
            self._disarm(held)
            self._lose(held, now)
            raise LostError(self._lost_message(lease))
        held.peer = peer
        max_hold_at = held.max_hold_at
        if peer.local:
            deadline = _INF if max_hold_at is None else max_hold_at
        else:
            deadline = now + held.ttl
            if max_hold_at is not None and max_hold_at < deadline:
                deadline = max_hold_at
        held.deadline = deadline
        if deadline == _INF:
            self._disarm(held)
        elif held.armed_at is None or deadline < held.armed_at:
            self._arm(held, deadline)
        return deadline

    def release(self, peer: Peer, lease: int) -> bool:
        """Let go of lease ``lease``; the next waiter gets the place in the same loop turn (LOCK-04).

        ``peer`` may be any peer (release is by id). Returns ``True`` when it let go of a live lease,
        ``False`` when the lease had already run out, was released, or is unknown: then nothing changes that
        another holds (LOCK-05). A lease whose deadline passed but whose timer has not run yet counts as
        run out (its holder is pushed ``locks.lost`` as usual). Never raises.
        """
        held = self._leases.get(lease)
        if held is None:
            return False
        if held.deadline != _INF:
            now = self._clock.now()
            if held.deadline <= now:
                self._disarm(held)
                self._lose(held, now)
                return False
            self._disarm(held)
        del self._leases[lease]
        slot = held.slot
        del slot.leases[lease]
        self._pass(slot)
        return True

    def drop_peer(self, peer: Peer) -> None:
        """``peer``'s connection is gone: its waiters leave their lines (their acquire raises ClosedError).

        Its leases stay until their ttl runs out, so that the SDK can reconnect and renew them by id.
        """
        mine = self._peer_waiters.pop(peer.id, None)
        if not mine:
            return
        for waiter in mine:
            slot = waiter.slot
            if waiter.timer is not None:
                waiter.timer.cancel()
                waiter.timer = None
            slot.waiters.pop(waiter, None)
            if not waiter.future.done():
                waiter.future.set_exception(
                    ClosedError(f"{_where(slot.lock.name, slot.key)}: the connection closed while waiting")
                )
            if not slot.leases and not slot.waiters:
                self._drop_slot(slot)

    def _lost_message(self, lease: int) -> str:
        ended = self._ended.get(lease)
        if ended is None:
            return f"lock: lease {lease} is not held: released, or given before the store restarted"
        lock, key, reason, at, max_hold = ended
        when = self._clock.datetime(at).isoformat(timespec="milliseconds")
        if reason == MAX_HOLD and max_hold is not None:
            return f"{_where(lock, key)}: the lease reached its max_hold of {fmt_seconds(max_hold)} at {when}"
        return f"{_where(lock, key)}: the lease ran out at {when}"

    # ------------------------------------------------------------------ status and close

    @property
    def epoch(self) -> int:
        """The fence epoch of this run (ms)."""
        return self._epoch

    def status(self, max_keys: int = STATUS_KEYS) -> dict[str, Any]:
        """What is held and awaited now, for ``tinystore status`` (plain data, msgpack- and JSON-safe).

        ``{"epoch": int, "leases": int, "waiters": int, "keys_total": int, "keys": [{"lock": str, "key": str,
        "limit": int, "waiters": int, "leases": [{"lease": int, "fence": str (decimal), "expires_at": float |
        None (epoch seconds; None: never), "max_hold_at": float | None, "peer": int}]}]}``: the first ``max_keys``
        keys (sorted by lock, key) of the ``keys_total`` held or waited for. (A status listing 100,000 keys took
        the event loop two seconds, every client waiting.)
        """
        keys: list[dict[str, Any]] = []
        waiting = self._waiting()
        total = sum(len(lk.keys) for lk in self._locks.values())
        if total <= max_keys:
            first = sorted((name, key) for name, lk in self._locks.items() for key in lk.keys)
        else:
            first = heapq.nsmallest(max_keys, ((name, key) for name, lk in self._locks.items() for key in lk.keys))
        for name, key in first:
            slot = self._locks[name].keys[key]
            pending = sum(1 for w in slot.waiters if not w.future.done())
            keys.append(
                {
                    "lock": name,
                    "key": key,
                    "limit": slot.limit,
                    "waiters": pending,
                    "leases": [
                        {
                            "lease": x.id,
                            "fence": str(x.fence),
                            "expires_at": None if x.deadline == _INF else x.deadline,
                            "max_hold_at": x.max_hold_at,
                            "peer": x.peer.id,
                        }
                        for x in sorted(slot.leases.values(), key=lambda x: x.fence)
                    ],
                }
            )
        return {
            "epoch": self._epoch,
            "leases": len(self._leases),
            "waiters": waiting,
            "keys_total": total,
            "keys": keys,
        }

    def _waiting(self) -> int:
        return sum(
            1 for lk in self._locks.values() for slot in lk.keys.values() for w in slot.waiters if not w.future.done()
        )

    def statistics(self) -> dict[str, int]:
        """Counts of what the engine holds: ``locks``, ``keys``, ``leases``, ``waiters``, ``heap`` (deadline
        entries, stale ones included), ``armed`` (leases with a deadline), ``ended`` (run-out leases
        remembered, at most ``ENDED_KEPT``), ``timer`` (1 while a clock timer is set), ``fences`` (given)."""
        return {
            "locks": len(self._locks),
            "keys": sum(len(lk.keys) for lk in self._locks.values()),
            "leases": len(self._leases),
            "waiters": sum(len(v) for v in self._peer_waiters.values()),
            "heap": len(self._heap),
            "armed": self._armed,
            "ended": len(self._ended),
            "timer": int(self._timer is not None),
            "fences": self._counter,
        }

    def close(self) -> None:
        """Cancel every timer, fail every waiter with ``ClosedError`` and forget every lease (no pushes).

        Idempotent. Later calls raise ``ClosedError`` (:meth:`release` returns ``False``).
        """
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = _INF
        for lk in list(self._locks.values()):
            for slot in list(lk.keys.values()):
                for waiter in list(slot.waiters):
                    if waiter.timer is not None:
                        waiter.timer.cancel()
                        waiter.timer = None
                    if not waiter.future.done():
                        waiter.future.set_exception(
                            ClosedError(f"{_where(lk.name, slot.key)}: the store closed while waiting")
                        )
                slot.waiters.clear()
        self._locks.clear()
        self._leases.clear()
        self._peer_waiters.clear()
        self._heap.clear()
        self._armed = 0
