"""Locks and semaphores in the SDK: :class:`Lock`, :class:`Semaphore`, :class:`Lease`, :class:`Permit`.

```python
summaries = store.lock("summaries", ttl="30s")
async with summaries.try_hold(chat_id) as lease:    # None at once when someone holds the key
    if lease is None:
        return
    fence = f"{lease.fence:040d}"                   # 128 bits; 40 digits sort as text
async with summaries.hold(chat_id, wait="10s") as lease:   # waits in line; InUseError after the wait
    ...
```

How a lease lives (LOCK-04..07):

- Over a connection a lease lasts its ttl from its last renewal. A task owned by the lease renews it every
  ``ttl / 3``; when no renewal succeeded for ``ttl`` minus a margin of a tenth of it (the connection is down,
  or this process's loop was frozen), the SDK declares the lease lost itself, before the store gives the key
  to another.
- A lost lease (a refused renewal, a ``locks.lost`` push, ``max_hold``, a graceful stop or a restart of the
  store, the store closed under it) sets ``lease.lost``, cancels the task running the block, and
  :class:`LostError` comes out of the ``async with`` once the block has ended, without waiting for the release
  (sent in the background; the store's close waits for it) — also when the block had already ended and its
  release found the lease gone. A cancel from elsewhere stays a ``CancelledError``.
- The key is let go when the block returns, raises or is cancelled (LOCK-04); when the store closes, once the
  blocks it cancelled have ended. After a reconnect each live lease is renewed at once by its id (LOCK-07);
  when the server says it is stopping (its GOAWAY), every lease held through it is lost at once, before any
  reconnect; after a restart of the store that said nothing (its fence epoch changed) every lease is lost.
- In embedded mode a lease of this process never runs out by ttl (the store freezes with the process); it
  ends with its block or at ``max_hold`` (LOCK-05, LOCK-06). Nothing renews it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import secrets
import weakref
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from ..durations import Duration, format_beyond, format_seconds, seconds
from ..engines.locks import LIMIT_MAX
from ..errors import (
    ClosedError,
    InvalidError,
    LostError,
    OutcomeUnknownError,
    TinystoreError,
    UnavailableError,
    error_from,
)
from ..names import check_name, check_unicode
from ..protocol.locks import (
    ABANDON,
    ACQUIRE,
    ACQUIRE_MANY,
    ACQUIRE_MANY_MAX,
    LOST,
    RELEASE,
    RELEASE_MANY,
    RELEASE_MANY_MAX,
    RENEW,
    SETTLED,
    Abandon,
    Acquire,
    AcquireMany,
    AcquireOutcome,
    Grant,
    Lost,
    Release,
    Released,
    ReleaseMany,
    Renew,
    Renewed,
)
from ..protocol.values import shown
from . import attempt_guard
from .transport import NotRunError

if TYPE_CHECKING:
    from .store import Store
    from .transport import Transport

__all__ = ["NEVER", "Lease", "Lock", "Permit", "Semaphore"]

R = TypeVar("R", covariant=True)

log = logging.getLogger("tinystore.locks")

NEVER = datetime.max.replace(tzinfo=UTC)
"""``Lease.expires_at`` of a lease that never runs out by ttl (the embedded process's own, without max_hold)."""
MARGIN = 0.1
"""The SDK declares a lease lost itself when no renewal succeeded for ``ttl * (1 - MARGIN)``."""
KEY_MAX = 256
LET_GO_WAIT = 1.0
"""Seconds a cancelled acquire waits, at most, for the calls that let go of what it may have been given (while
connected: calls that wait for the next connection go on on their own)."""
ANSWER_GRACE = 1.0
"""Seconds past its wait that an ask sent over a connection may take to be answered (the store answers "held" as
the wait ends) before the SDK takes the store for unreachable."""
_WAITS: dict[str, float] = {}  # waits given as text ("10s"), read once each

_HELD, _LOST, _DONE = 0, 1, 2
_NEW, _SENT, _QUEUED, _SETTLED = 10, 11, 12, 13  # the states of a batched ask

# The leases whose blocks run in this context (a task, and the tasks it starts): holding one of their keys
# again would wait for itself.
_held: ContextVar[tuple[Lease, ...]] = ContextVar("tinystore_locks_held", default=())


class _Ask:
    """One acquire of a ``locks.acquire_many`` batch: its request, the future its caller awaits, its ticket."""

    __slots__ = ("fut", "guard", "req", "sent", "state", "ticket")

    def __init__(
        self,
        req: Acquire,
        fut: asyncio.Future[AcquireOutcome],
        sent: Callable[[float], None] | None = None,
        guard: Callable[[str], None] | None = None,
    ) -> None:
        self.req = req
        self.fut = fut
        self.ticket = 0
        self.state = _NEW
        self.sent = sent  # told when the ask is written (see Transport.call)
        self.guard = guard  # its caller's, a job's handler's (see attempt_guard): asked again as the batch goes


class _AskBatch:
    """The asks of one ``locks.acquire_many`` call, as it is sent: :meth:`still` is the transport's ``still`` (see
    ``Transport.call``)."""

    __slots__ = ("asks", "by_ticket", "request")

    def __init__(self, asks: list[_Ask], by_ticket: dict[int, _Ask]) -> None:
        self.asks = asks
        self.by_ticket = by_ticket  # (the hub's asks under way, by ticket: an ask taken out leaves them)
        self.request = self._made()

    def _made(self) -> AcquireMany:
        return AcquireMany(items=[a.req for a in self.asks], tickets=[a.ticket for a in self.asks])

    def sent(self, t: float) -> None:
        _sent(self.asks, t)

    def still(self) -> Any:
        """The request to send now: without the asks of a handler past its lease (each told why, its ticket
        given up here: never sent), or ``False`` when none is left."""
        kept: list[_Ask] = []
        for a in self.asks:
            if attempt_guard.passes(a.guard, ACQUIRE, a.fut):
                kept.append(a)
            else:
                self.by_ticket.pop(a.ticket, None)
                a.state = _SETTLED
        if not kept:
            self.asks = []
            return False
        if len(kept) != len(self.asks):
            self.asks = kept
            self.request = self._made()
        return self.request


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: see _Hub._ask


def _sent(asks: list[_Ask], t: float) -> None:
    """The asks of one ``locks.acquire_many`` were written at ``t``: told to those who asked to know."""
    for ask in asks:
        if ask.sent is not None:
            ask.sent(t)


def _utc(at: float) -> datetime:
    """The aware UTC time of Unix time ``at``; ``NEVER`` for one past the end of year 9999 (or infinite), which a
    ``datetime`` cannot hold (trial DI: a bare ``ValueError`` near a test clock's end)."""
    try:
        return datetime.fromtimestamp(at, UTC)
    except (ValueError, OverflowError, OSError):
        return NEVER


def _where(kind: str, name: str, key: str) -> str:
    return f"{kind} {name}: key {json.dumps(key, ensure_ascii=False)}"


def _key_text(kind: str, name: str, key: object) -> str:
    """``key`` as the store's text: ``7`` and ``"7"`` are one key. Raises ``InvalidError`` naming lock and key."""
    if isinstance(key, int) and not isinstance(key, bool) and not -(10**KEY_MAX) < key < 10**KEY_MAX:
        # (refused before it is written as text: past 4,300 digits Python refuses to, trial GL)
        raise InvalidError(f"{kind} {name}: key {shown(key)}: a key is 1 to {KEY_MAX} characters as text")
    if type(key) is str:
        text = key
    elif type(key) is int:
        text = str(key)
    elif isinstance(key, str):
        text = str.__str__(key)
    elif isinstance(key, int) and not isinstance(key, bool):
        text = int.__repr__(key)
    else:
        raise InvalidError(f"{kind} {name}: key {key!r}: a key is a str or an int, not {type(key).__name__}")
    if not text or len(text) > KEY_MAX:
        got = f" (this one has {len(text)})" if text else ""
        raise InvalidError(f"{_where(kind, name, text[:40])}: a key is 1 to {KEY_MAX} characters as text{got}")
    if not text.isascii():
        check_unicode(f"{kind} {name}: key", text)
    return text


class Lease:
    """A lease on one key of a lock, live while its ``async with`` block runs.

    - ``fence``: an ``int`` of up to 128 bits, larger than every fence the store gave before, across restarts
      too (LOCK-02). ``f"{lease.fence:040d}"`` is 40 digits that sort as text in the same order. Write it beside
      what the lease protects and refuse a write whose fence is below the one stored: a holder paused past its
      lease cannot then overwrite its successor's work (the fencing token of Martin Kleppmann, "How to do
      distributed locking", 2016).
    - ``expires_at``: an aware UTC ``datetime``: when the lease runs out unless renewed (the store's clock);
      it moves on with each renewal. ``NEVER`` (``datetime.max``, UTC) for a lease of the embedded store's
      own process without ``max_hold``.
    - ``max_hold_at``: the aware UTC ``datetime`` past which no renewal keeps it, or ``None``.
    - ``lost``: an ``asyncio.Event`` set when the lease is lost, for code that cannot be cancelled.
    - ``lock``, ``key``: the lock's name and the key as text; ``id``: the store's id of the lease (an int).

    A lease is made by :meth:`Lock.hold` / :meth:`Lock.try_hold`; it has no public methods.
    """

    __slots__ = (
        "__weakref__",
        "_base",
        "_cancel_requested",
        "_cancelling",
        "_doom_at",
        "_end_at",
        "_epoch",
        "_exited",
        "_expires",
        "_handle",
        "_hub",
        "_in_block",
        "_kind",
        "_lost",
        "_max_hold_at",
        "_message",
        "_release_deadline",
        "_release_task",
        "_release_timed_out",
        "_releasing",
        "_renewing",
        "_server_gone",
        "_state",
        "_task",
        "_token",
        "_ttl",
        "_unreleased",
        "fence",
        "id",
        "key",
        "lock",
    )

    def __init__(
        self,
        hub: _Hub,
        kind: str,
        lock: str,
        key: str,
        lease_id: int,
        fence: int,
        expires: float,
        max_hold_at: float | None,
        ttl: float,
    ) -> None:
        self._hub = hub
        self._kind = kind
        self.lock = lock
        self.key = key
        self.id = lease_id
        self.fence = fence
        self._expires = expires
        self._max_hold_at = max_hold_at
        self._ttl = ttl
        # the epoch of the server that gave it (a fence's high 64 bits), not the one reached when the grant was read
        # (a grant of a stopped server read after the reconnect is no lease of the next one)
        self._epoch = fence >> 64
        self._server_gone = False  # lost with its server's stop: nothing to let go there
        self._exited: asyncio.Future[None] | None = None  # set as the block ends (see _Hub.close)
        self._unreleased = ""  # why its release could not reach the store, when it could not
        self._lost: asyncio.Event | None = None  # made when first asked for
        self._state = _HELD
        self._message = ""
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._cancel_requested = False
        self._in_block = False
        self._token: Token[tuple[Lease, ...]] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._releasing: asyncio.Future[bool] | None = None
        self._release_task: asyncio.Task[Any] | None = None
        self._release_deadline = 0.0
        self._release_timed_out = False
        self._base = 0.0
        self._doom_at = math.inf
        self._end_at = math.inf

    @property
    def lost(self) -> asyncio.Event:
        """An ``asyncio.Event`` set when the lease is lost (for code that cannot be cancelled)."""
        event = self._lost
        if event is None:
            event = self._lost = asyncio.Event()
            if self._state == _LOST:
                event.set()
        return event

    @property
    def expires_at(self) -> datetime:
        """When the lease runs out unless renewed (aware UTC, the store's clock); ``NEVER`` when it cannot."""
        return _utc(self._expires)

    @property
    def max_hold_at(self) -> datetime | None:
        """When ``max_hold`` ends the lease whatever its renewals (aware UTC), or ``None``; ``NEVER`` (the end of
        year 9999) for a time past it (a test clock near it, a long ``max_hold``)."""
        return None if self._max_hold_at is None else _utc(self._max_hold_at)

    def __repr__(self) -> str:
        state = ("held", "lost", "ended")[self._state]
        return f"<tinystore.{type(self).__name__} {_where(self._kind, self.lock, self.key)} fence {self.fence} {state}>"

    def _where(self) -> str:
        return _where(self._kind, self.lock, self.key)

    # -- renewals (over a connection only) ----------------------------------------------------------------

    def _start_renewals(self, now: float, max_hold: float | None) -> None:
        self._base = now
        if max_hold is not None:  # the store's clock started it a little earlier: end a little early here
            self._end_at = now + max_hold - min(max_hold * MARGIN, 1.0)
        self._schedule()

    def _schedule(self) -> None:
        ttl = self._ttl
        self._doom_at = min(self._base + ttl * (1 - MARGIN), self._end_at)
        loop = self._hub.loop
        if self._handle is not None:
            self._handle.cancel()
        self._handle = loop.call_at(min(self._base + ttl / 3, self._doom_at), self._tick)

    def _tick(self) -> None:
        self._handle = None
        waiting = self._release_task
        if waiting is not None:  # releasing: bound the wait for the store's answer
            if self._hub.loop.time() >= self._release_deadline:
                self._release_timed_out = True
                waiting.cancel()
            else:
                self._handle = self._hub.loop.call_at(self._release_deadline, self._tick)
            return
        if self._state != _HELD:
            return
        now = self._hub.loop.time()
        if now >= self._doom_at:
            if now >= self._end_at:
                self._lose(f"{self._where()}: the lease reached its max_hold")
            else:
                self._lose(
                    f"{self._where()}: no renewal succeeded for {format_seconds(round(now - self._base, 3))} of its "
                    f"{format_seconds(self._ttl)} ttl (the connection is down, or this process froze); "
                    "the lease may have run out and the key may be another's"
                )
            return
        self._kick()
        self._handle = self._hub.loop.call_at(self._doom_at, self._tick)

    def _kick(self) -> None:
        """Renew now, unless a renewal is on its way."""
        if self._state == _HELD and self._renewing is None and not self._hub.local:
            self._renewing = self._hub.spawn(self._renew())

    async def _renew(self) -> None:
        hub = self._hub
        loop = hub.loop
        try:
            while self._state == _HELD:
                if hub.transport.epoch != self._epoch:
                    self._lose(self._restarted_message(self._epoch, hub.transport.epoch))
                    return
                sent = loop.time()
                try:
                    got: Renewed = await hub.transport.call(
                        RENEW, Renew(lease=self.id), Renewed, write=False, retry=False
                    )
                except LostError as exc:
                    self._lose(exc.message)
                    return
                except (ClosedError, UnavailableError, OutcomeUnknownError):
                    if hub.closed or hub.transport.closed:
                        return
                    await asyncio.sleep(min(0.05, self._ttl / 30))  # the next call waits for the reconnection
                    continue
                if self._state != _HELD:
                    return
                self._base = sent
                if got.expires_at_ms is not None:
                    self._expires = got.expires_at_ms / 1000
                self._renewing = None
                self._schedule()
                return
        except TinystoreError as exc:
            log.warning("%s: renewing the lease failed: %s", self._where(), exc)
            self._lose(f"{self._where()}: renewing the lease failed: {exc}")
        finally:
            if self._renewing is asyncio.current_task():
                self._renewing = None

    async def _release_bounded(self, alone: bool = False) -> bool:
        """Release over a connection, waiting for the answer no longer than the lease could still be live plus a
        third of its ttl (a store that does not answer lets the lease run out by its ttl); then it counts as
        lost. The lease's own timer bounds the wait, as ``asyncio.timeout`` would, without a timer of its own.
        ``alone``: in a call of its own, written as this task first runs (not batched with the releases of its
        loop turn, which a task of the hub sends a turn later)."""
        hub = self._hub
        loop = hub.loop
        task = asyncio.current_task()
        assert task is not None
        self._release_deadline = max(self._doom_at, loop.time()) + self._ttl / 3
        self._release_task = task
        self._release_timed_out = False
        cancelling = task.cancelling()
        if self._handle is None:
            self._handle = loop.call_at(self._release_deadline, self._tick)
        # else: the lease's timer comes at its renewal or its doom at the latest, and moves on to the deadline
        try:
            return await (hub._release_one(self) if alone else hub.release(self))
        except asyncio.CancelledError:
            if not self._release_timed_out or task.uncancel() > cancelling:
                raise
            if not self._message:
                self._message = (
                    f"{self._where()}: the store did not answer the release in time; the lease runs out by its "
                    "ttl there"
                )
            return False
        finally:
            self._release_task = None
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None

    def _restarted_message(self, old: int, new: int) -> str:
        return (
            f"{self._where()}: the store restarted (fence epoch {old} → {new}); after a restart nobody holds anything"
        )

    def _stop_timers(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop_renewing()

    def _stop_renewing(self) -> None:
        task = self._renewing
        if task is not None:
            self._renewing = None
            if task is not asyncio.current_task():
                task.cancel()

    # -- loss ----------------------------------------------------------------------------------------------

    def _lose(self, message: str) -> None:
        """The lease is lost: set ``lost``, stop renewing, cancel the block's task (once)."""
        if self._state != _HELD:
            return
        self._state = _LOST
        self._message = message or f"{self._where()}: the lease was lost"
        self._stop_timers()
        if self._lost is not None:
            self._lost.set()
        task = self._task
        if self._in_block and task is not None and not task.done() and not self._cancel_requested:
            self._cancel_requested = True
            task.cancel(self._message)

    def _lose_with_server(self) -> None:
        """Its server said it is stopping: the lease ends with it (LOCK-07), and its release has nothing to let go."""
        if self._state != _HELD:
            return
        self._server_gone = True
        self._lose(
            f"{self._where()}: the store is stopping: the lease ends with it (after a restart nobody holds anything), "
            "and the key may be another's once the store is back"
        )

    def _error(self) -> LostError:
        if self._message:
            if self._server_gone:  # (a job's attempt that ends with it is not counted: see client/jobs.py)
                return LostError(self._message, store_stopping=True)
            return LostError(self._message)
        early = self._hub.early_lost.pop(self.id, None)
        if early:
            return LostError(early)
        epoch = self._hub.transport.epoch
        if epoch != self._epoch:  # (its release went to a server started since: trial BS)
            return LostError(self._restarted_message(self._epoch, epoch))
        if self._unreleased:
            return LostError(
                f"{self._where()}: the lease could not be let go at the store ({self._unreleased}); it may be gone "
                "(after a restart nobody holds anything) and the key may be another's"
            )
        return LostError(
            f"{self._where()}: the lease was gone when the block ended: it ran out (or reached max_hold) "
            "and the key may be another's"
        )

    # -- the block -----------------------------------------------------------------------------------------

    def _enter(self) -> None:
        task = asyncio.current_task()
        self._task = task
        self._cancelling = task.cancelling() if task is not None else 0
        self._in_block = True
        self._token = _held.set((*_held.get(), self))

    async def _exit(self, et: type[BaseException] | None, exc: BaseException | None) -> None:
        """The block ended (``et``/``exc``: how); let go of the key and raise what the lease's fate calls for:
        ``LostError`` for a lost lease (the block's exception, if any, chained or noted), a cancel from
        elsewhere as it was. Never swallows the block's exception."""
        self._in_block = False
        exited = self._exited
        if exited is not None and not exited.done():
            exited.set_result(None)
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(ValueError):  # exited in another context than entered
                _held.reset(token)
        mine = self._cancel_requested
        cancelled = et is not None and issubclass(et, asyncio.CancelledError)
        if mine and not cancelled:
            # our cancel may not have reached the block yet (the loss was seen by this very task): take it here
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        try:
            released = await self._let_go()
        except asyncio.CancelledError:
            if mine and self._task is not None:
                self._task.uncancel()
            raise
        if mine:
            task = self._task
            if task is not None and task.uncancel() > self._cancelling:
                if cancelled:
                    return  # a cancel from elsewhere came too: it stays a cancel
                raise asyncio.CancelledError
            if exc is not None and not cancelled:
                # the block, cancelled for the loss, raised its own error (a finally's): it keeps it, as a block of
                # asyncio.timeout does (trial FY: LostError came out, the block's error only its cause)
                exc.add_note(f"and the lease was lost: {self._error().message}")
                return
            raise self._error() from None
        if self._state == _LOST or not released:
            err = self._error()
            if et is None:
                raise err
            if exc is not None and not cancelled:
                exc.add_note(f"and the lease was lost: {err.message}")

    async def _let_go(self) -> bool:
        """Release at the store once (a second caller waits for the first's answer); True when it let go of a
        live lease.

        A lease lost already is let go without waiting: over a connection its release is sent by a task of the
        hub, which the store's close waits for (a few seconds at most), so that ``LostError`` leaves the block at
        once rather than after the release's wait on a connection that may be dead (the next holder may have
        started). A lease lost with its server's stop, or once the store is closed, has nothing to let go."""
        fut = self._releasing
        if fut is not None:
            return await asyncio.shield(fut)
        fut = self._releasing = self._hub.loop.create_future()
        was_held = self._state == _HELD
        self._stop_renewing()
        if self._state == _HELD:
            self._state = _DONE
        hub = self._hub
        if not was_held and (self._server_gone or hub.closed):
            self._stop_timers()
            hub.leases.pop(self.id, None)
            fut.set_result(False)
            return False
        if not was_held and not hub.local:
            hub.spawn(self._release_bounded(alone=True)).add_done_callback(self._released)
            # one loop turn, in which the release's first step writes it: what this task asks next (the same key
            # again) reaches the store after it, so a lease the SDK ended before the store did (max_hold, its
            # ttl's margin) is let go before that ask, as when the block waited for the answer
            await asyncio.sleep(0)
            return False
        try:
            task = hub.spawn(hub.release(self) if hub.local else self._release_bounded())
            try:
                released = bool(await asyncio.shield(task))
            except asyncio.CancelledError:
                # cancelled while letting go: the release goes on; wait for it, so that the key is free once this
                # task has ended (LOCK-04)
                await hub.wait_let_go([task])
                raise
        except BaseException:
            fut.set_result(False)
            raise
        if not released and was_held and self._state != _LOST:
            self._state = _LOST
            if self._lost is not None:
                self._lost.set()
        self._hub.leases.pop(self.id, None)
        fut.set_result(released)
        return released

    def _released(self, task: asyncio.Task[Any]) -> None:
        """The release of a lost lease, sent in the background, ended."""
        released = not task.cancelled() and task.exception() is None and bool(task.result())
        self._hub.leases.pop(self.id, None)
        fut = self._releasing
        if fut is not None and not fut.done():
            fut.set_result(released)


class Permit(Lease):
    """A permit of a :class:`Semaphore`: a lease on one of its ``limit`` places for a key; the same fields
    (``fence``, ``expires_at``, ``max_hold_at``, ``lost``, ``lock`` — the semaphore's name —, ``key``)."""

    __slots__ = ()


class Hold(Generic[R]):
    """The async context manager of :meth:`Lock.hold` (a :class:`Lease`) and :meth:`Lock.try_hold` (a
    :class:`Lease` or ``None``)."""

    __slots__ = ("_key", "_lease", "_lock", "_wait")

    def __init__(self, lock: Lock, key: str, wait: float | None) -> None:
        self._lock = lock
        self._key = key
        self._wait = wait
        self._lease: Lease | None = None

    if not TYPE_CHECKING:
        # (hidden from type checkers, so that `await lock.hold(k)` and `with lock.hold(k)` are errors there too;
        # trial FR: both passed mypy and pyright, then raised)
        def __await__(self) -> Any:
            # the call as it was made (trial BU: `await lock.hold(1)` was shown `lock.hold('1')`, and a semaphore's
            # try_hold as a lock's hold): an int key as an int (7 and "7" are one key)
            kind, key = self._lock._kind, self._key
            method = "try_hold" if self._wait is None else "hold"
            shown = key if re.fullmatch(r"0|-?[1-9][0-9]*", key) else repr(key)
            raise TypeError(
                f"{kind} {self._lock.name}: {method}() is used with `async with`, not awaited: "
                f"`async with {kind}.{method}({shown}) as {'lease' if kind == 'lock' else 'permit'}:`"
            )

        def __enter__(self) -> None:
            raise TypeError(
                f"{self._lock._kind} {self._lock.name}: hold() and try_hold() are async context managers: use "
                "`async with`, not `with`"
            )

        def __exit__(self, *exc: object) -> None:  # (never reached: __enter__ raises)
            return None

    async def __aenter__(self) -> R:
        """The lease (or permit) once given, or ``None`` for a ``try_hold`` that found the key taken; raises as
        :meth:`Lock.hold` and :meth:`Lock.try_hold` say."""
        lock = self._lock
        key = self._key
        hub = lock._hub or lock._get_hub()
        mine = sum(
            1
            for other in _held.get()
            if other._in_block and other.key == key and other.lock == lock.name and other._hub is hub
        )
        if mine >= lock.limit:  # (a semaphore's task holding some of its permits may ask for one more)
            again = (
                "try_hold inside its own hold would always give None"
                if self._wait is None
                else "holding it again inside its own hold would wait for itself"
            )
            if mine > lock.limit:  # (held under another limit: the server would refuse the limit, it must agree)
                raise InvalidError(
                    f"{_where(lock._kind, lock.name, key)}: limit {lock.limit} differs from the limit of the "
                    f"{mine} leases this task holds on it already; every call must give a key the same limit"
                )
            held = (
                "already held by this task"
                if lock.limit == 1
                else f"all {lock.limit} permits already held by this task"
            )
            raise InvalidError(f"{_where(lock._kind, lock.name, key)}: {held} (or the task that started it); {again}")
        lease = await hub.acquire(lock, key, self._wait)
        if lease is None:
            return cast(R, None)
        self._lease = lease
        if lease._state != _HELD:  # lost before the block began (a push that came with the grant)
            await lease._let_go()
            raise lease._error()
        lease._enter()
        return cast(R, lease)

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease = self._lease
        if lease is None:
            return
        self._lease = None
        await lease._exit(et, exc)


class Lock:
    """A lock of the store: one holder of a key at a time (LOCK-01). Get one with ``store.lock(name, ttl=,
    max_hold=)``; making it sends nothing.

    ``ttl``: how long a lease lasts from its last renewal when its holder stops renewing (1 s .. 1 h; the
    store's ``lock_ttl``, 10 s, unless given). ``max_hold``: no lease lasts longer than this from its grant,
    renewals or not (``None``: no bound). Both take a ``timedelta``, seconds, or text (``"30s"``).
    Raises ``InvalidError`` for a bad name, ttl or max_hold.
    """

    _kind = "lock"
    _lease_type: type[Lease] = Lease

    def __init__(
        self, store: Store, name: str, *, ttl: Duration | None = None, max_hold: Duration | None = None
    ) -> None:
        self._init(store, name, 1, ttl, max_hold)

    def _init(self, store: Store, name: str, limit: int, ttl: Duration | None, max_hold: Duration | None) -> None:
        check_name(self._kind, name)
        self.store = store
        self.name = name
        self.limit = limit
        limits = store.limits
        what = f"{self._kind} {name}"
        ttl_s = limits.lock_ttl if ttl is None else seconds(ttl, f"{what}: ttl")
        lo, hi = limits.lock_ttl_min, limits.lock_ttl_max
        if not lo <= ttl_s <= hi:
            raise InvalidError(
                f"{what}: ttl {format_beyond(ttl_s, lo if ttl_s < lo else hi)} is outside {format_seconds(lo)} .. "
                f"{format_seconds(hi)}"
            )
        self.ttl = ttl_s
        self.max_hold = None if max_hold is None else seconds(max_hold, f"{what}: max_hold")
        if self.max_hold is not None and self.max_hold <= 0:
            raise InvalidError(f"{what}: max_hold must be above 0 seconds")
        self._default_wait = limits.hold_wait
        self._hub: _Hub | None = None
        self._ttl_ms = round(ttl_s * 1000)
        self._max_hold_ms = None if self.max_hold is None else max(1, round(self.max_hold * 1000))

    def _get_hub(self) -> _Hub:
        hub = self._hub = _hub(self.store)
        return hub

    def try_hold(self, key: str | int) -> Hold[Lease | None]:
        """``async with lock.try_hold(key) as lease``: the lease when nobody holds ``key`` (or waits for it),
        else ``None`` at once (LOCK-03). The key is let go when the block ends (LOCK-04).

        ``key``: a str or an int (``7`` and ``"7"`` are one key), 1 to 256 characters as text. Raises
        ``InvalidError`` (a bad key — at once —, or the key is already held by this task or the task that
        started it), ``LostError`` out of the block (the lease was lost: see :class:`Lease`), ``ClosedError``
        (the store is closed), ``UnavailableError`` (the store cannot be reached). A cancel while asking
        keeps nothing: a lease given meanwhile is released.
        """
        return Hold(self, _key_text(self._kind, self.name, key), None)

    def hold(self, key: str | int, wait: Duration | None = None) -> Hold[Lease]:
        """``async with lock.hold(key, wait="10s") as lease``: wait in line for ``key``, first come first served,
        at most ``wait`` (the store's ``hold_wait``, 10 s, unless given; 0: now or never); then ``InUseError``
        (LOCK-03). A lease given after a wait has its full ttl from the moment it is given. The key is let go
        when the block ends, and the next waiter gets it at once (LOCK-04).

        Raises ``InvalidError`` (a bad key or wait — at once —, or the key is already held by this task or the
        task that started it), ``InUseError`` (held for all of the wait), ``LostError`` out of the block (see
        :class:`Lease`), ``ClosedError``, ``UnavailableError`` (also when the store could not be reached for the
        rest of the wait). A cancel while waiting leaves the line and keeps nothing. When the connection drops
        while waiting, the SDK asks again for the rest of the wait (a wait of 0 once the store is reached).
        """
        text = _key_text(self._kind, self.name, key)
        if wait is None:
            return Hold(self, text, self._default_wait)
        known = _WAITS.get(wait) if type(wait) is str else None
        if known is not None:
            return Hold(self, text, known)
        try:
            wait_s = seconds(wait, "wait")
        except InvalidError as exc:
            raise InvalidError(f"{_where(self._kind, self.name, text)}: {exc.message}") from None
        if type(wait) is str and len(_WAITS) < 256:
            _WAITS[wait] = wait_s
        return Hold(self, text, wait_s)

    def __repr__(self) -> str:
        return f"<tinystore.{type(self).__name__} {self.name} ttl {format_seconds(self.ttl)}>"


class Semaphore(Lock):
    """A semaphore of the store: at most ``limit`` holders of a key at a time (LOCK-01). Get one with
    ``store.semaphore(name, limit=3, ttl=, max_hold=)``; ``hold`` and ``try_hold`` give :class:`Permit`\\ s.
    Every process must give one limit for a name. Raises ``InvalidError`` for a bad name, limit (an int from 1
    to :data:`LIMIT_MAX`), ttl or max_hold.
    """

    _kind = "semaphore"
    _lease_type = Permit

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        limit: int,
        ttl: Duration | None = None,
        max_hold: Duration | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
            raise InvalidError(f"semaphore {name}: limit {shown(limit)} must be an int from 1 to {LIMIT_MAX}")
        self._init(store, name, int(limit), ttl, max_hold)  # (an IntEnum as a plain int: trial GP)

    def __repr__(self) -> str:
        return f"<tinystore.Semaphore {self.name} limit {self.limit} ttl {format_seconds(self.ttl)}>"

    def try_hold(self, key: str | int) -> Hold[Permit | None]:
        """As :meth:`Lock.try_hold`, with a :class:`Permit`: ``None`` at once when ``limit`` others hold ``key``."""
        return cast("Hold[Permit | None]", super().try_hold(key))

    def hold(self, key: str | int, wait: Duration | None = None) -> Hold[Permit]:
        """As :meth:`Lock.hold`, with a :class:`Permit`: waits in line while ``limit`` others hold ``key``."""
        return cast("Hold[Permit]", super().hold(key, wait))


class _Hub:
    """The locks side of one store: acquires and releases, renewals after a reconnect, ``locks.lost`` pushes
    routed to their leases, and every lease let go when the store closes."""

    def __init__(self, store: Store) -> None:
        self.transport: Transport = store.transport
        self.local = bool(self.transport.local)
        self.loop = asyncio.get_running_loop()
        self.leases: dict[int, Lease] = {}
        self.early_lost: OrderedDict[int, str] = OrderedDict()
        self.tasks: set[asyncio.Task[Any]] = set()
        # The first acquire and the first release of a loop turn go at once from their callers; the others of
        # that turn go together in one call, sent by a task of the hub.
        self.acquire_turn = False
        self.release_turn = False
        self.acquire_batch: list[_Ask] | None = None
        self.asks: dict[int, _Ask] = {}  # batched asks sent and not settled, by ticket
        # tickets are random (62 bits): the store keeps those granted to a connection that dropped, so that this
        # client can let go of them from its next connection (_on_reconnect), and no other client can name them
        self.ticket_ids = iter(lambda: secrets.randbits(62) | 1, 0)
        self.unheard: list[int] = []  # tickets of asks whose outcome a dropped connection took with it
        self.letting_go: asyncio.Task[None] | None = None  # the abandon of the unheard tickets under way
        self.release_batch: list[tuple[Lease, asyncio.Future[bool]]] | None = None
        self.closed = False
        self.closing = False
        self.stopped_epoch = 0  # the epoch of the last server that said it was stopping: its leases are no more
        self.transport.on_push(LOST, self._on_lost, Lost)
        self.transport.on_push(SETTLED, self._on_settled, AcquireOutcome)
        self.transport.reconnect_hooks.append(self._on_reconnect)
        self.transport.lost_hooks.append(self._on_dropped)
        self.transport.stopping_hooks.append(self._on_stopping)
        store._close_hooks.append(self.close)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = attempt_guard.spawn(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- acquire and release -------------------------------------------------------------------------------

    async def acquire(self, lock: Lock, key: str, wait: float | None) -> Lease | None:
        if self.closed:
            raise ClosedError(f"{_where(lock._kind, lock.name, key)}: the store is closed")
        if self.local:
            return await self._acquire_local(lock, key, wait)
        return await self._acquire_remote(lock, key, wait)

    async def _acquire_local(self, lock: Lock, key: str, wait: float | None) -> Lease | None:
        req = Acquire(
            lock=lock.name,
            key=key,
            ttl_ms=lock._ttl_ms,
            limit=lock.limit,
            max_hold_ms=lock._max_hold_ms,
            wait_ms=None if wait is None else round(wait * 1000),
        )
        try:
            grant: Grant | None = await self.transport.call(ACQUIRE, req, write=True)
        except TinystoreError as exc:
            if self.closing and isinstance(exc, ClosedError):
                # (its line failed as the store closed: told as this SDK's own closing tells it, trial DT)
                raise ClosedError(
                    f"{_where(lock._kind, lock.name, key)}: the store was closed while waiting in line"
                ) from None
            raise _named(exc, lock, key) from None
        if grant is None:
            return None
        if self.closing:
            await self._release_id(grant.lease)
            raise ClosedError(f"{_where(lock._kind, lock.name, key)}: the store was closed while waiting in line")
        lease = lock._lease_type(
            self, lock._kind, lock.name, key, grant.lease, grant.fence, grant.expires_at, grant.max_hold_at, grant.ttl
        )
        self._register(lease)
        return lease

    async def _acquire_remote(self, lock: Lock, key: str, wait: float | None) -> Lease | None:
        loop = self.loop
        deadline = None if wait is None else loop.time() + wait
        transport = self.transport
        refusals = 0
        while True:
            wait_ms = None if deadline is None else max(0, round((deadline - loop.time()) * 1000))
            req = Acquire(
                lock=lock.name,
                key=key,
                ttl_ms=lock._ttl_ms,
                limit=lock.limit,
                max_hold_ms=lock._max_hold_ms,
                wait_ms=wait_ms,
            )
            asked: list[float] = []  # when the ask was written: the lease starts at the store no sooner than
            # this plus its wait in line there
            try:
                if wait and deadline is not None:
                    # an ask that waits for the next connection: not past the wait (trial AY: a wait of 1 s took
                    # 10); one sent over a connection: the store's answer, as the wait ends, is let come, unless the
                    # connection turns out dead (trial DH: asked as the server exited, a wait of 2 s took 30, the
                    # reconnect_timeout). (A wait of 0, "now or never", is asked of the store once it is reached,
                    # as any call.)
                    grace = ANSWER_GRACE if transport.connected else 0.0
                    async with asyncio.timeout(max(0.0, deadline - loop.time()) + grace) as limit:

                        def at_deadline(limit: asyncio.Timeout = limit) -> None:
                            if not transport.connected:  # (the connection dropped: no answer is coming)
                                limit.reschedule(loop.time())

                        check = loop.call_at(deadline, at_deadline) if grace else None
                        try:
                            reply = await self._ask(req, asked.append)
                        finally:
                            if check is not None:
                                check.cancel()
                else:
                    reply = await self._ask(req, asked.append)
            except TimeoutError:
                # not InUseError: nobody may hold the key, the store could not be asked (trial AZ)
                raise UnavailableError(
                    f"{_where(lock._kind, lock.name, key)}: the store could not be reached within the {wait:g}s wait"
                ) from None
            except ClosedError as exc:
                # (closing too: the close failed its ask; asked again, it waited out its whole wait behind another
                # client's lease, then raised UnavailableError: trial HR)
                if self.closing or self.closed or transport.closed:
                    raise _named(exc, lock, key) from None
                continue  # the connection dropped while asking: ask again (for the rest of the wait)
            except NotRunError as exc:
                # the store is stopping and did not run the ask: ask the next one, for the rest of the wait (trial
                # BR: UnavailableError at once, where every other call waits for the next server)
                if self.closing or self.closed or transport.closed:
                    raise _named(exc, lock, key) from None
                refusals += 1
                await asyncio.sleep(min(0.05 * 2**refusals, 0.5))
                continue
            except TinystoreError as exc:
                raise _named(exc, lock, key) from None
            if reply.held or not reply.lease:
                return None
            if self.closing:
                await self._release_id(reply.lease)
                raise ClosedError(f"{_where(lock._kind, lock.name, key)}: the store was closed while waiting in line")
            lease = lock._lease_type(
                self,
                lock._kind,
                lock.name,
                key,
                reply.lease,
                int(reply.fence),
                math.inf if reply.expires_at_ms is None else reply.expires_at_ms / 1000,
                None if reply.max_hold_at_ms is None else reply.max_hold_at_ms / 1000,
                reply.ttl_ms / 1000,
            )
            self._register(lease)
            if lease._state == _HELD:
                # from the ask's last writing plus its wait in line, not from the grant's arrival: a grant the network
                # held back had its ttl running at the store, whose end came before the SDK's (trial BN); nor from
                # the call: an ask that waited for a reconnect was lost once granted (trial BP)
                now = loop.time()
                waited = reply.waited_ms  # (-1: a server of an earlier version did not say)
                start = now if waited < 0 or not asked else min(now, asked[-1] + waited / 1000)
                lease._start_renewals(start, lock.max_hold)
            return lease

    async def _ask(self, req: Acquire, sent: Callable[[float], None] | None = None) -> AcquireOutcome:
        """Ask the store for ``req`` as one item of a ``locks.acquire_many`` with a ticket, and wait for its
        outcome (a queued one comes later as a ``locks.settled`` push).

        The first ask of a loop turn is sent by its caller at once; the other asks of that turn go together
        in one call sent by a task of the hub (the first ask's frame and theirs leave in one write, the
        transport's). Either way a cancel
        keeps nothing: an ask whose outcome its caller did not hear is abandoned at the store by its ticket
        (a queued one leaves the line, a granted one's lease is let go), and a grant that came with the cancel
        is released.
        """
        letting_go = self._letting_go()
        if letting_go is not None:
            # before asking again (else the ask may meet its own lost grant); a cancel does not stop it. One for
            # every ask, which go on in the order they came: the asks of a line a dropped connection ended ask
            # again in its order (trial DC: its first, who started the abandon, was asked last)
            try:
                await asyncio.shield(letting_go)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if letting_go.cancelled() and (me is None or not me.cancelling()):
                    # the store's close ended it, not a cancel of this caller: told as the close tells the asks
                    # it fails (trial HU: the caller's task ended cancelled, which a TaskGroup takes for its own)
                    raise ClosedError("the store was closed while waiting in line") from None
                raise
        if self.acquire_turn:
            return await self._ask_batched(req, sent)
        self.acquire_turn = True
        self.loop.call_soon(self._next_acquire_turn)
        ask = _Ask(req, self.loop.create_future(), sent)
        # its caller awaits the call, and the future only once queued: a failure set on it meanwhile (the store
        # closing, the connection dropping) reaches the caller by the call, and is no news (trial BU: "Future
        # exception was never retrieved" logged after the caller got its ClosedError)
        ask.fut.add_done_callback(_retrieved)
        ask.ticket = next(self.ticket_ids)
        ask.state = _SENT
        self.asks[ask.ticket] = ask  # its settled push, if it is queued, may come with the answer
        try:
            got: list[AcquireOutcome] = await self.transport.call(
                ACQUIRE_MANY,
                AcquireMany(items=[req], tickets=[ask.ticket]),
                list[AcquireOutcome],
                retry=False,
                sent=sent,
            )
        except asyncio.CancelledError:
            await self.wait_let_go(self._gave_up(ask))
            raise
        except BaseException as exc:
            self.asks.pop(ask.ticket, None)
            ask.state = _SETTLED
            if isinstance(exc, ClosedError) and not self.closed:
                self.unheard.append(ask.ticket)  # granted, perhaps, with the answer lost: let go of it later
            raise
        out = got[0]
        if not out.queued:
            self.asks.pop(ask.ticket, None)
            ask.state = _SETTLED
            if out.code:
                raise error_from(out.code, out.message)
            return out
        if ask.state == _SENT:
            ask.state = _QUEUED
        return await self._outcome(ask)

    async def _ask_batched(self, req: Acquire, sent: Callable[[float], None] | None = None) -> AcquireOutcome:
        guard = attempt_guard.CURRENT.get()
        if guard is not None:
            attempt_guard.check(ACQUIRE)  # (its caller's: the batch's task is the SDK's own; asked again as it goes)
        ask = _Ask(req, self.loop.create_future(), sent, guard)
        batch = self.acquire_batch
        if batch is None or len(batch) >= ACQUIRE_MANY_MAX:
            batch = self.acquire_batch = []
            self.spawn(self._send_acquires(batch))
        batch.append(ask)
        return await self._outcome(ask)

    async def _outcome(self, ask: _Ask) -> AcquireOutcome:
        try:
            return await ask.fut
        except asyncio.CancelledError:
            fut = ask.fut
            pending: list[asyncio.Task[Any]] = []
            if ask.state == _QUEUED:
                pending = self._gave_up(ask)
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                # answered in the loop turn of the cancel: nobody will hold what it was given
                got = fut.result()
                if got.lease and not got.held and not self.closed:
                    pending.append(self.spawn(self._release_id(got.lease)))
            await self.wait_let_go(pending)
            raise

    async def wait_let_go(self, pending: list[asyncio.Task[Any]]) -> None:
        """Wait (a second at most) for the calls that let go of what a cancelled acquire or release holds, so
        that the key is free once the cancelled task has ended (LOCK-04). They go on past that second, and past
        another cancel, on their own."""
        if pending and self.transport.connected:
            # (not connected, they wait for the next connection: a cancel does not wait for that; trial DH: a
            # wait of 2 s with the server down took 3)
            with contextlib.suppress(BaseException):
                await asyncio.wait(pending, timeout=LET_GO_WAIT)

    def _gave_up(self, ask: _Ask) -> list[asyncio.Task[Any]]:
        """The caller of a sent ask was cancelled before it heard the outcome: abandon the ticket at the store,
        and let go of a grant that a push brought meanwhile. Returns the calls it started."""
        self.asks.pop(ask.ticket, None)
        fut = ask.fut
        pending: list[asyncio.Task[Any]] = []
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            got = fut.result()
            if got.lease and not got.held and not self.closed:
                pending.append(self.spawn(self._release_id(got.lease)))
        elif not fut.done():
            fut.cancel()
        ask.state = _SETTLED
        if not self.closed:
            pending.append(self.spawn(self._abandon([ask.ticket])))
        return pending

    async def _send_acquires(self, batch: list[_Ask]) -> None:
        # runs a loop turn after the batch's first ask: the asks of that turn are in it
        if self.acquire_batch is batch:
            self.acquire_batch = None
        # (cancelled before it was sent: nothing to do; of a job's handler whose attempt went past its lease before
        # the batch went: not sent, trial IO; nor as it is written, see _AskBatch.still)
        live = [a for a in batch if not a.fut.done() and attempt_guard.passes(a.guard, ACQUIRE, a.fut)]
        if not live:
            return
        for ask in live:
            ask.ticket = next(self.ticket_ids)
            ask.state = _SENT
            self.asks[ask.ticket] = ask
        sending = _AskBatch(live, self.asks)
        try:
            got: list[AcquireOutcome] = await self.transport.call(
                ACQUIRE_MANY,
                sending.request,
                list[AcquireOutcome],
                write=False,
                retry=False,
                sent=sending.sent,
                still=sending.still if any(a.guard is not None for a in live) else None,
            )
        except attempt_guard.Withdrawn:
            return  # (no ask left: each was told why)
        except BaseException as exc:
            for ask in sending.asks:
                self.asks.pop(ask.ticket, None)
                ask.state = _SETTLED
                if isinstance(exc, ClosedError) and not self.closed:
                    self.unheard.append(ask.ticket)
                if not ask.fut.done():
                    if isinstance(exc, TinystoreError):
                        ask.fut.set_exception(exc)
                    else:
                        ask.fut.set_exception(ClosedError(f"{ACQUIRE_MANY}: the call was cancelled ({exc!r})"))
            if not isinstance(exc, TinystoreError):
                raise
            return
        live = sending.asks
        gone: list[int] = []
        for ask, out in zip(live, got, strict=True):
            if ask.state != _SENT:
                continue  # settled by a push that came before this answer was read
            if out.queued:
                ask.state = _QUEUED
                if ask.fut.done():  # the caller gave up before it was in line
                    self.asks.pop(ask.ticket, None)
                    gone.append(ask.ticket)
                continue
            self.asks.pop(ask.ticket, None)
            self._settle(ask, out)
        if gone:
            await self._abandon(gone)

    def _settle(self, ask: _Ask, out: AcquireOutcome) -> None:
        ask.state = _SETTLED
        if ask.fut.done():  # the caller gave up: let go of what it was given
            if out.lease and not out.code and not self.closed:
                self.spawn(self._release_id(out.lease))
            return
        if out.code:
            ask.fut.set_exception(error_from(out.code, out.message))
        else:
            ask.fut.set_result(out)

    def _on_settled(self, out: AcquireOutcome) -> None:
        ask = self.asks.pop(out.ticket, None)
        if ask is None:
            if out.lease and not out.code and not self.closed:  # nobody waits for it any more
                self.spawn(self._release_id(out.lease))
            return
        self._settle(ask, out)

    def _letting_go(self) -> asyncio.Task[None] | None:
        """The abandon of the :attr:`unheard` tickets under way (started when some wait), or ``None``."""
        if self.unheard and (self.letting_go is None or self.letting_go.done()):
            self.letting_go = self.spawn(self._let_go_unheard())
        task = self.letting_go
        return task if task is not None and not task.done() else None

    async def _let_go_unheard(self) -> None:
        """Abandon the tickets whose outcome a dropped connection took (:attr:`unheard`): a lease the store granted
        them is let go. Sent from the next connection, before this client asks for anything again."""
        tickets, self.unheard = self.unheard, []
        if tickets and not self.closed:
            await self._abandon(tickets)

    async def _abandon(self, tickets: list[int]) -> None:
        for at in range(0, len(tickets), RELEASE_MANY_MAX):
            with contextlib.suppress(TinystoreError):
                part = tickets[at : at + RELEASE_MANY_MAX]
                await self.transport.call(ABANDON, Abandon(tickets=part), Any, write=False, retry=False)

    def _register(self, lease: Lease) -> None:
        self.leases[lease.id] = lease
        if lease._epoch == self.stopped_epoch:  # a grant read after its server said it was stopping
            lease._lose_with_server()
        if self.early_lost:
            early = self.early_lost.pop(lease.id, None)
            if early is not None:
                lease._lose(early)

    async def _release_id(self, lease_id: int) -> None:
        with contextlib.suppress(TinystoreError):
            await self.transport.call(RELEASE, Release(lease=lease_id), Released, write=False, retry=False)

    async def release(self, lease: Lease) -> bool:
        """Let go of ``lease`` at the store; True when it let go of a live lease. Never raises a TinyStore
        error: a store that cannot be reached lets the lease run out by its ttl.

        Over a connection, the first release of a loop turn goes at once; the others of that turn go together
        in one ``locks.release_many`` call (sent by a task of the hub, so a cancel of the caller leaves the
        release to happen)."""
        transport = self.transport
        if self.local:
            try:
                return bool(await transport.call(RELEASE, Release(lease=lease.id), write=True))
            except TinystoreError:
                return False
        if self.release_turn:
            batch = self.release_batch
            if batch is None or len(batch) >= RELEASE_MANY_MAX:
                batch = self.release_batch = []
                self.spawn(self._send_releases(batch))
            fut: asyncio.Future[bool] = self.loop.create_future()
            batch.append((lease, fut))
            return await fut
        self.release_turn = True
        self.loop.call_soon(self._next_release_turn)
        return await self._release_one(lease)

    def _next_acquire_turn(self) -> None:
        self.acquire_turn = False

    def _next_release_turn(self) -> None:
        self.release_turn = False

    async def _send_releases(self, batch: list[tuple[Lease, asyncio.Future[bool]]]) -> None:
        # runs a loop turn after the batch's first release: the releases of that turn are in it
        if self.release_batch is batch:
            self.release_batch = None
        try:
            if len(batch) == 1:
                got = [await self._release_one(batch[0][0])]
            else:
                got = await self._release_many([lease for lease, _ in batch])
            for (_, fut), ok in zip(batch, got, strict=True):
                if not fut.done():
                    fut.set_result(ok)
        finally:
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(False)

    async def _release_many(self, leases: list[Lease]) -> list[bool]:
        transport = self.transport
        asked = False
        req = ReleaseMany(leases=[lease.id for lease in leases])
        while True:
            try:
                got: list[bool] = await transport.call(RELEASE_MANY, req, list[bool], write=False, retry=False)
            except ClosedError as exc:
                if transport.closed:
                    return _unreleased(leases, exc)
                asked = True  # the connection dropped after asking: ask again (releasing twice is harmless)
                continue
            except TinystoreError as exc:
                return _unreleased(leases, exc)
            now = self.loop.time()
            epoch = transport.epoch  # (a lease of another server's went with it: see _release_one)
            return [
                ok or (asked and lease._epoch == epoch and now < lease._doom_at)
                for ok, lease in zip(got, leases, strict=True)
            ]

    async def _release_one(self, lease: Lease) -> bool:
        transport = self.transport
        asked = False
        while True:
            try:
                got: Released = await transport.call(
                    RELEASE, Release(lease=lease.id), Released, write=False, retry=False
                )
            except ClosedError as exc:
                if transport.closed:
                    return _unreleased([lease], exc)[0]
                asked = True  # the connection dropped after asking: ask again (releasing twice is harmless)
                continue
            except TinystoreError as exc:
                return _unreleased([lease], exc)[0]
            if got.released:
                return True
            if lease._epoch != transport.epoch:
                # asked again of a server started since (its connection dropped after the first ask): the lease
                # went with the server that gave it (LOCK-07), which the block's end tells (CI, under load: the
                # lease's own deadline was trusted, and the block ended as if let go)
                return False
            # an earlier ask whose answer was lost may have let it go already: trust the lease's own deadline
            return asked and self.loop.time() < lease._doom_at

    # -- pushes, reconnects, close -------------------------------------------------------------------------

    def _on_lost(self, body: Lost) -> None:
        message = body.message or (
            f"{_where('lock', body.lock, body.key)}: the lease was lost ({body.reason})"
            if body.lock
            else f"lock: lease {body.lease} was lost ({body.reason})"
        )
        lease = self.leases.get(body.lease)
        if lease is None:
            self.early_lost[body.lease] = message
            while len(self.early_lost) > 256:
                self.early_lost.popitem(last=False)
            return
        if lease._kind != "lock" and body.message.startswith("lock "):
            message = lease._kind + body.message[4:]
        lease._lose(message)

    def _fail_asks(self, message: str, every: bool = False) -> None:
        """Queued asks hear nothing more (their connection is gone): their callers ask again, or give up.
        ``every``: sent asks not answered yet too, and those of a batch not sent yet (the store is closing)."""
        asks = [ask for ask in self.asks.values() if every or ask.state == _QUEUED]
        if every and self.acquire_batch:
            asks += self.acquire_batch
            self.acquire_batch = None
        for ask in asks:
            self.asks.pop(ask.ticket, None)
            ask.state = _SETTLED
            if not ask.fut.done():
                ask.fut.set_exception(ClosedError(message))

    def _on_dropped(self) -> None:
        """The connection dropped: the asks waiting in line hear nothing more. Their callers ask again at once,
        which waits for the next connection as any call does (bounded by ``reconnect_timeout``, or failed at once
        by a token refused at the reconnect: trial AX's waiter, failed only at a reconnect, waited for ever). The
        store may have granted them (the answer, or the settled push, lost on the way): nobody here holds those
        leases, so they are let go by their tickets from the next connection, before anything is asked again."""
        self.unheard += [ask.ticket for ask in self.asks.values() if ask.state == _QUEUED]
        self._fail_asks("the connection to the store dropped while waiting in line")

    def _on_stopping(self, reason: str) -> None:
        """The server said it is stopping (its GOAWAY at a graceful stop; the connection drops next): every lease
        held through it is lost now — its block cancelled, ``LostError`` — before any reconnect, since none outlives
        the stop (LOCK-07). Waiting for the reconnect to see a new epoch, a holder whose connection came back
        later than a waiter's ran its block beside the waiter's (a tester's report: 2 runs of 3)."""
        epoch = self.transport.epoch
        self.stopped_epoch = epoch
        for lease in list(self.leases.values()):
            if lease._state == _HELD and lease._epoch == epoch:
                lease._lose_with_server()

    async def _on_reconnect(self, old_epoch: int, new_epoch: int) -> None:
        if new_epoch != old_epoch:
            self.unheard = []  # a new server: it holds nothing of the last one's
        elif self.unheard and not self.closed:
            self._letting_go()
        self._fail_asks("the connection to the store dropped while waiting in line")
        for lease in list(self.leases.values()):
            if lease._state != _HELD:
                continue
            if new_epoch != lease._epoch:
                lease._lose(lease._restarted_message(lease._epoch, new_epoch))
            else:
                lease._kick()

    async def close(self) -> None:
        """The store is closing: every lease still held is lost (its block cancelled) and let go at the store once
        its block has ended (its cleanup after the cancel too: LOCK-04), so that the next in line never starts
        beside it; renewals stop. Waits at most 5 s in all for the blocks to end and for the store's answers (the
        releases of leases lost earlier, sent in the background, too); a block that has not ended by then has
        its key let go all the same."""
        if self.closed:
            return
        self.closing = True  # a grant that comes from now on is let go, and its caller told ClosedError
        # first out of every line (so that letting go of the leases below hands none of them to this process's
        # own waiters), then the leases
        waiting = [ask for ask in self.asks.values() if ask.state in (_SENT, _QUEUED)]
        self._fail_asks("the store was closed while waiting in line", every=True)
        if waiting and self.transport.connected:
            # (not connected: the store dropped them from its lines with the connection they came by, and a close
            # waited 5 s for the next connection to say so: trial HU)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.transport.close_left(5.0)):
                    await self._abandon([ask.ticket for ask in waiting])
        live = [x for x in self.leases.values() if x._releasing is None]
        for lease in live:
            lease._lose(f"{lease._where()}: the store was closed while the lease was held")
        me = asyncio.current_task()
        ending: list[asyncio.Future[None]] = []
        for lease in live:
            task = lease._task
            if lease._in_block and task is not None and task is not me and not task.done():
                if lease._exited is None:
                    lease._exited = self.loop.create_future()
                ending.append(lease._exited)
        leases = list(self.leases.values())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.transport.close_left(5.0)):
                if ending:
                    await asyncio.wait(ending)
                if leases:
                    await asyncio.gather(*(x._let_go() for x in leases), return_exceptions=True)
                    # (a lost lease's release goes on in a task of the hub: its answer is waited for here)
                    releasing = [x._releasing for x in leases if x._releasing is not None and not x._releasing.done()]
                    if releasing:
                        await asyncio.wait(releasing)
        self.closed = True
        self._fail_asks("the store was closed while waiting in line")
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self.leases.clear()


def _named(exc: TinystoreError, lock: Lock, key: str) -> TinystoreError:
    """``exc`` with a message that names the lock and key (the engine's already do)."""
    where = _where(lock._kind, lock.name, key)
    message = exc.message
    if message.startswith(_where("lock", lock.name, key)):
        message = where + message[len(_where("lock", lock.name, key)) :]
    elif not message.startswith(where):
        message = f"{where}: {message}"
    else:
        return exc
    out = type(exc)(message)
    out.code = exc.code
    out.extra = exc.extra
    return out


_hubs: weakref.WeakKeyDictionary[Store, _Hub] = weakref.WeakKeyDictionary()


def _hub(store: Store) -> _Hub:
    hub = _hubs.get(store)
    if hub is None:
        hub = _hubs[store] = _Hub(store)
    return hub


def _unreleased(leases: list[Lease], exc: TinystoreError) -> list[bool]:
    """The releases of ``leases`` could not reach the store (``exc``): none was let go, each told why."""
    for lease in leases:
        lease._unreleased = exc.message
    return [False] * len(leases)
