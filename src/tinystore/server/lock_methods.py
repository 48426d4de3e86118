"""Lock methods: ``locks.acquire``, ``locks.acquire_many``, ``locks.abandon``, ``locks.renew``, ``locks.release``,
``locks.release_many``; pushes ``locks.lost`` (a lease ended without its release) and ``locks.settled`` (a
queued item of ``locks.acquire_many`` got its outcome). Bodies: :mod:`tinystore.protocol.locks`.

The engine (:class:`~tinystore.engines.locks.LocksEngine`) is created here as ``core.locks``, with the core's
clock, limits and persisted fence epoch (LOCK-02). Everything it holds is in memory: after a restart nobody
holds anything (LOCK-07).

- A session's waiters leave their lines when the session closes; its leases stay until their ttl runs out, so
  that a client whose connection dropped can reconnect and renew them by id (LOCK-07).
- Every acquire is in the key's line from the moment its request is read (first come, first served), also
  one that must wait: ``locks.acquire`` then answers from a coroutine, and a ``CANCEL`` from the client takes
  it out of the line and keeps nothing (a lease given in the loop turn of the cancel is released at once),
  also when the cancel comes before the coroutine ever ran. A queued item of ``locks.acquire_many`` waits
  without a coroutine; ``locks.abandon`` takes it out of its line, or lets go of the lease its ticket was
  given (of the session's last ``GRANTED_KEPT`` grants); one granted to a session that has gone is released.
- The embedded store's own session (``session.local``) gets the engine's objects as they are: a
  :class:`~tinystore.protocol.locks.Grant` or ``None``, a float deadline, a bool. A connection gets the wire
  bodies: :class:`~tinystore.protocol.locks.Granted` or :class:`~tinystore.protocol.locks.NotGranted`,
  :class:`~tinystore.protocol.locks.Renewed`, :class:`~tinystore.protocol.locks.Released`.
- ``status()["locks"]`` (see :func:`lock_status`) lists each key held or waited for.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..engines.locks import LocksEngine
from ..errors import InvalidError, TinystoreError
from ..protocol.locks import (
    ABANDON,
    ACQUIRE,
    ACQUIRE_MANY,
    RELEASE,
    RELEASE_MANY,
    RENEW,
    SETTLED,
    Abandon,
    Acquire,
    AcquireMany,
    AcquireOutcome,
    Grant,
    Granted,
    NotGranted,
    Release,
    Released,
    ReleaseMany,
    Renew,
    Renewed,
    to_ms,
)

if TYPE_CHECKING:
    from .core import Core, Session

_NOT_GRANTED = NotGranted()
GRANTED_KEPT = 4096
"""How many granted tickets of ``locks.acquire_many`` each session's ``locks.abandon`` can still name."""
ORPHANS_KEPT = 16384
"""How many granted tickets of sessions that have closed ``locks.abandon`` can still name (from any session: the
SDK's tickets are random, so only the client that was given one knows it)."""


def install(core: Core) -> None:
    """Create ``core.locks`` and register the lock methods, the session-close hook, the status hook
    (``status()["locks"]``) and a stop hook that closes the engine (waiters get ``ClosedError``)."""
    from .core import Method

    engine = LocksEngine(core.clock, core.limits, core.epoch)
    core.locks = engine  # type: ignore[attr-defined]
    core.engines["locks"] = engine
    start = engine.acquire_start
    release_ = engine.release
    # queued items of locks.acquire_many: session id -> ticket -> the engine's future (in the key's line)
    queued: dict[int, dict[int, asyncio.Future[Grant]]] = {}
    # the last GRANTED_KEPT tickets of each session that were granted: ticket -> lease id, so that a client that
    # gave up on a ticket without hearing its outcome (a cancel) can abandon it and let go of what it got
    granted: dict[int, OrderedDict[int, int]] = {}
    # the granted tickets of sessions that have closed: ticket -> lease id. A grant whose answer (or settled push)
    # the dropped connection lost is held by nobody; the client lets go of it from its next connection
    orphans: OrderedDict[int, int] = OrderedDict()

    def remember(session: Session, ticket: int, lease: int) -> None:
        mine = granted.get(session.id)
        if mine is None:
            mine = granted[session.id] = OrderedDict()
        mine[ticket] = lease
        if len(mine) > GRANTED_KEPT:
            mine.popitem(last=False)

    def acquire(session: Session, req: Acquire) -> Any:
        got = start(
            session,
            req.lock,
            req.key,
            limit=req.limit,
            ttl=req.ttl_ms / 1000,
            max_hold=None if req.max_hold_ms is None else req.max_hold_ms / 1000,
            wait=None if req.wait_ms is None else req.wait_ms / 1000,
        )
        if got is None:
            return None if session.local else _NOT_GRANTED
        if isinstance(got, Grant):
            return got if session.local else got.to_wire()
        return _waiting(session, got)

    def _waiting(session: Session, fut: asyncio.Future[Grant]) -> Coroutine[Any, Any, Grant | Granted]:
        # ``fut`` is in the key's line already (first come, first served from the request's arrival).
        started = [False]

        async def waiting() -> Grant | Granted:
            started[0] = True
            try:
                grant = await fut
            except asyncio.CancelledError:  # a CANCEL from the client, or its connection closed
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    release_(session, fut.result().lease)  # granted in the same loop turn: nobody will hold it
                raise
            return grant if session.local else grant.to_wire()

        coro = waiting()
        if not session.local:
            # The listener runs the coroutine in a task; a CANCEL that comes before the task's first step
            # throws into a coroutine that never started, so nothing in it runs: see to it after that step.
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, _never_started, session, coro, fut, started)
        return coro

    def _never_started(
        session: Session, coro: Coroutine[Any, Any, Any], fut: asyncio.Future[Grant], started: list[bool]
    ) -> None:
        if started[0] or inspect.getcoroutinestate(coro) != inspect.CORO_CLOSED:
            return
        _give_up(session, fut)

    def _give_up(session: Session, fut: asyncio.Future[Grant]) -> None:
        if not fut.done():
            fut.cancel()  # leaves the line
        elif not fut.cancelled() and fut.exception() is None:
            release_(session, fut.result().lease)

    def acquire_many(session: Session, req: AcquireMany) -> list[AcquireOutcome]:
        if len(req.tickets) != len(req.items):
            raise InvalidError(f"locks.acquire_many: {len(req.items)} items but {len(req.tickets)} tickets")
        out: list[AcquireOutcome] = []
        mine: dict[int, asyncio.Future[Grant]] | None = None
        asked = time.monotonic()
        for item, ticket in zip(req.items, req.tickets, strict=True):
            try:
                got = start(
                    session,
                    item.lock,
                    item.key,
                    limit=item.limit,
                    ttl=item.ttl_ms / 1000,
                    max_hold=None if item.max_hold_ms is None else item.max_hold_ms / 1000,
                    wait=None if item.wait_ms is None else item.wait_ms / 1000,
                    on_grant=functools.partial(_granted, session, ticket, asked),
                )
            except TinystoreError as exc:
                out.append(AcquireOutcome(ticket=ticket, code=exc.code, message=exc.message))
                continue
            if got is None:
                out.append(AcquireOutcome(ticket=ticket, held=True))
            elif isinstance(got, Grant):
                remember(session, ticket, got.lease)
                out.append(AcquireOutcome.of(got, ticket))
            else:
                if mine is None:
                    mine = queued.setdefault(session.id, {})
                old = mine.pop(ticket, None)
                if old is not None:
                    _give_up(session, old)  # a ticket used twice: the older item gives way
                mine[ticket] = got
                got.add_done_callback(functools.partial(_settled, session, ticket))
                out.append(AcquireOutcome(ticket=ticket, queued=True))
        return out

    def _granted(session: Session, ticket: int, asked: float, grant: Grant) -> None:
        # called by the engine as it passes the key on, before the answer to the release that let go of it is
        # written: the next holder hears first
        mine = queued.get(session.id)
        if mine is not None:
            mine.pop(ticket, None)
            if not mine:
                del queued[session.id]
        if session.closed:
            release_(session, grant.lease)  # granted to a client that is gone and never heard of it
            return
        remember(session, ticket, grant.lease)
        session.push(SETTLED, AcquireOutcome.of(grant, ticket, time.monotonic() - asked))

    def _settled(session: Session, ticket: int, fut: asyncio.Future[Grant]) -> None:
        if fut.cancelled() or fut.exception() is None:
            return  # abandoned, or granted (told by _granted)
        mine = queued.get(session.id)
        if mine is not None and mine.get(ticket) is fut:
            del mine[ticket]
            if not mine:
                del queued[session.id]
        exc = fut.exception()
        err = exc if isinstance(exc, TinystoreError) else TinystoreError(str(exc))
        session.push(SETTLED, AcquireOutcome(ticket=ticket, code=err.code, message=err.message))

    def abandon(session: Session, req: Abandon) -> None:
        waiting = queued.get(session.id)
        given = granted.get(session.id)
        for ticket in req.tickets:
            fut = None if waiting is None else waiting.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.cancel()  # leaves the line
                continue
            lease = None if given is None else given.pop(ticket, None)
            if lease is None and orphans:
                lease = orphans.pop(ticket, None)  # given to this client's connection that dropped
            if lease is not None:
                release_(session, lease)  # nothing if it was let go already: releases go by lease id
        if waiting is not None and not waiting:
            queued.pop(session.id, None)

    def renew(session: Session, req: Renew) -> float | Renewed:
        deadline = engine.renew(session, req.lease)
        return deadline if session.local else Renewed(expires_at_ms=to_ms(deadline))

    def release(session: Session, req: Release) -> bool | Released:
        released = release_(session, req.lease)
        return released if session.local else Released(released=released)

    def release_many(session: Session, req: ReleaseMany) -> list[bool]:
        return [release_(session, lease) for lease in req.leases]

    def status() -> dict[str, Any]:
        out = lock_status(engine, core.clock.datetime)
        # what is kept beyond the leases, each capped: run-out leases (for their late renewals), granted tickets
        # of open sessions and of closed ones (for abandon)
        out["ended_kept"] = engine.statistics()["ended"]
        out["granted_kept"] = sum(len(g) for g in granted.values())
        out["orphans_kept"] = len(orphans)
        return out

    def on_close(session: Session) -> None:
        engine.drop_peer(session)  # its waiters leave their lines (queued items too); its leases stay
        queued.pop(session.id, None)
        given = granted.pop(session.id, None)
        if given:
            for ticket, lease in given.items():
                orphans.pop(ticket, None)
                orphans[ticket] = lease
            while len(orphans) > ORPHANS_KEPT:
                orphans.popitem(last=False)

    async def stop() -> None:
        engine.close()
        queued.clear()
        granted.clear()
        orphans.clear()

    core.session_close_hooks.append(on_close)
    core.status_hooks["locks"] = status
    core.stop_hooks.append(stop)
    core.stopping_hooks.append(engine.stop_granting)
    core.register(Method(ACQUIRE, Acquire, acquire, write=True))
    core.register(Method(ACQUIRE_MANY, AcquireMany, acquire_many, write=True))
    core.register(Method(ABANDON, Abandon, abandon, write=True))
    core.register(Method(RENEW, Renew, renew, write=True))
    core.register(Method(RELEASE, Release, release, write=True))
    core.register(Method(RELEASE_MANY, ReleaseMany, release_many, write=True))


def lock_status(engine: LocksEngine, to_datetime: Any) -> dict[str, Any]:
    """``status()["locks"]``: ``{"epoch": int (ms), "leases": int, "waiters": int, "keys_total": int, "keys": [...]}``
    (the first 1,000 keys of ``keys_total``; and, from
    the status hook, ``ended_kept``, ``granted_kept``, ``orphans_kept``: capped memory kept beyond leases) with one
    row per key held or waited for: ``lock``, ``key``, ``limit``, ``held`` (live leases), ``waiters``,
    ``fences`` (a list of decimal texts, oldest first), ``expires`` (the earliest deadline as ISO text, or
    ``"never"``: a lease of the embedded process, or one ending past year 9999), ``sessions`` (a list of the
    holders' session ids, as ``fences``).
    """
    raw = engine.status()
    keys: list[dict[str, Any]] = []
    for entry in raw["keys"]:
        leases = entry["leases"]
        deadlines = [x["expires_at"] for x in leases if x["expires_at"] is not None]
        if deadlines:
            try:
                expires = to_datetime(min(deadlines)).isoformat(timespec="milliseconds")
            except (ValueError, OverflowError, OSError):
                expires = "never"  # (past the end of year 9999, which a datetime cannot hold: trial DK)
        else:
            expires = "never" if leases else ""
        keys.append(
            {
                "lock": entry["lock"],
                "key": entry["key"],
                "limit": entry["limit"],
                "held": len(leases),
                "waiters": entry["waiters"],
                "fences": [x["fence"] for x in leases],
                "expires": expires,
                "sessions": [x["peer"] for x in leases],
            }
        )
    return {
        "epoch": raw["epoch"],
        "leases": raw["leases"],
        "waiters": raw["waiters"],
        "keys_total": raw["keys_total"],
        "keys": keys,
    }
