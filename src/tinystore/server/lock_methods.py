"""Lock methods: ``locks.acquire``, ``locks.renew``, ``locks.release``; a lease that ends without its release
is told to its holder with a ``locks.lost`` push (see :mod:`tinystore.protocol.locks`).

The engine (:class:`~tinystore.engines.locks.LocksEngine`) is created here as ``core.locks``, with the core's
clock, limits and persisted fence epoch (LOCK-02). Everything it holds is in memory: after a restart nobody
holds anything (LOCK-07).

- A session's waiters leave their lines when the session closes; its leases stay until their ttl runs out, so
  that a client whose connection dropped can reconnect and renew them by id (LOCK-07).
- A try, and a hold whose key is free, is answered in the same loop turn without a coroutine. A hold that must
  wait is a coroutine; a ``CANCEL`` from the client cancels it, which takes it out of the line and keeps
  nothing (a lease given in the same loop turn as the cancel is released at once).
- The embedded store's own session (``session.local``) gets the engine's objects as they are: a
  :class:`~tinystore.protocol.locks.Grant` or ``None``, a float deadline, a bool. A connection gets the wire
  bodies: :class:`~tinystore.protocol.locks.Granted` or :class:`~tinystore.protocol.locks.NotGranted`,
  :class:`~tinystore.protocol.locks.Renewed`, :class:`~tinystore.protocol.locks.Released`.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..engines.locks import LocksEngine
from ..protocol.locks import (
    ACQUIRE,
    RELEASE,
    RELEASE_MANY,
    RENEW,
    Acquire,
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


def install(core: Core) -> None:
    """Create ``core.locks`` and register the lock methods, the session-close hook, the status hook
    (``status()["locks"]``) and a stop hook that closes the engine (waiters get ``ClosedError``)."""
    from .core import Method

    engine = LocksEngine(core.clock, core.limits, core.epoch)
    core.locks = engine  # type: ignore[attr-defined]
    core.engines["locks"] = engine
    acquire_nowait = engine.acquire_nowait

    def acquire(session: Session, req: Acquire) -> Any:
        ttl = req.ttl_ms / 1000
        max_hold = None if req.max_hold_ms is None else req.max_hold_ms / 1000
        grant = acquire_nowait(session, req.lock, req.key, limit=req.limit, ttl=ttl, max_hold=max_hold)
        if grant is not None:
            return grant if session.local else grant.to_wire()
        if req.wait_ms is None:
            return None if session.local else _NOT_GRANTED
        return _wait(session, req, ttl, max_hold, req.wait_ms / 1000)

    def _wait(
        session: Session, req: Acquire, ttl: float, max_hold: float | None, wait: float
    ) -> Coroutine[Any, Any, Grant | Granted]:
        async def waiting() -> Grant | Granted:
            grant = await engine.acquire(
                session, req.lock, req.key, limit=req.limit, ttl=ttl, max_hold=max_hold, wait=wait
            )
            assert grant is not None
            return grant if session.local else grant.to_wire()

        return waiting()

    def renew(session: Session, req: Renew) -> float | Renewed:
        deadline = engine.renew(session, req.lease)
        return deadline if session.local else Renewed(expires_at_ms=to_ms(deadline))

    def release(session: Session, req: Release) -> bool | Released:
        released = engine.release(session, req.lease)
        return released if session.local else Released(released=released)

    def release_many(session: Session, req: ReleaseMany) -> list[bool]:
        return [engine.release(session, lease) for lease in req.leases]

    def status() -> dict[str, Any]:
        return lock_status(engine, core.clock.datetime)

    async def stop() -> None:
        engine.close()

    core.session_close_hooks.append(engine.drop_peer)
    core.status_hooks["locks"] = status
    core.stop_hooks.append(stop)
    core.register(Method(ACQUIRE, Acquire, acquire, write=True))
    core.register(Method(RENEW, Renew, renew, write=True))
    core.register(Method(RELEASE, Release, release, write=True))
    core.register(Method(RELEASE_MANY, ReleaseMany, release_many, write=True))


def lock_status(engine: LocksEngine, to_datetime: Any) -> dict[str, Any]:
    """``status()["locks"]``: ``{"epoch": int (ms), "leases": int, "waiters": int, "keys": [...]}`` with one
    row per key held or waited for: ``lock``, ``key``, ``limit``, ``held`` (live leases), ``waiters``,
    ``fences`` (decimal, comma-separated, oldest first), ``expires`` (the earliest deadline as ISO text, or
    ``"never"``: a lease of the embedded process), ``sessions`` (the holders' session ids, comma-separated).
    """
    raw = engine.status()
    keys: list[dict[str, Any]] = []
    for entry in raw["keys"]:
        leases = entry["leases"]
        deadlines = [x["expires_at"] for x in leases if x["expires_at"] is not None]
        if deadlines:
            expires = to_datetime(min(deadlines)).isoformat(timespec="milliseconds")
        else:
            expires = "never" if leases else ""
        keys.append(
            {
                "lock": entry["lock"],
                "key": entry["key"],
                "limit": entry["limit"],
                "held": len(leases),
                "waiters": entry["waiters"],
                "fences": ",".join(x["fence"] for x in leases),
                "expires": expires,
                "sessions": ",".join(str(x["peer"]) for x in leases),
            }
        )
    return {"epoch": raw["epoch"], "leases": raw["leases"], "waiters": raw["waiters"], "keys": keys}
