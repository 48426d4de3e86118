"""What a job's handler may still send: the calls a handler makes (in its task, and the tasks it starts) are
looked at by its attempt first, so that an attempt this worker counts as past its lease sends nothing more.

A worker whose process was paused (SIGSTOP, a VM frozen) past an attempt's lease wakes with the handler's timers
and its own renewal due in one loop turn; the handler's write went out first, after another worker had run the
job (trial IL). The transport asks :data:`CURRENT` before it sends a call; the jobs engine sets it around a
handler. Nothing here knows of jobs or sockets."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

CURRENT: ContextVar[Callable[[str], None] | None] = ContextVar("tinystore_attempt_guard", default=None)
"""In a handler's context: called with each call's method before it is sent; raises (``LostError``) to stop it."""

LETTING_GO = frozenset({"locks.release", "locks.release_many", "locks.abandon", "sql.rollback", "channels.unsubscribe"})
"""What a handler past its lease may still send: letting go of what it holds (a lock's release: trial IM, a lost
handler's lock stayed held for its ttl, and the job's next attempt waited for it in vain)."""


class Withdrawn(Exception):
    """Raised by a transport's call, instead of sending it, when its ``still`` said nothing is left to send: a batch
    of several callers' items (a turn's publishes, lock requests) each of whose guards refused its item (each
    item's caller was told why); nothing was sent."""


def check(method: str) -> None:
    """Ask the guard of this context, if any, about a call of ``method`` (raises to stop it)."""
    guard = CURRENT.get()
    if guard is not None and method not in LETTING_GO:
        guard(method)


def passes(guard: Callable[[str], None] | None, method: str, fut: asyncio.Future[Any]) -> bool:
    """Whether an item of a batch, made under ``guard`` (``None``: by code outside a handler) and awaited by
    ``fut``, may still be sent; when not, ``fut`` gets the guard's error (``LostError``)."""
    if guard is None:
        return True
    try:
        guard(method)
    except Exception as exc:
        if not fut.done():
            fut.set_exception(exc)
        return False
    return True


def free(fn: Callable[[], T]) -> T:
    """``fn()`` run in a copy of this context without a guard: what it starts (tasks, a connection's callbacks)
    is the SDK's own (trial IO: a reconnect begun by a handler's call made the next connection in the handler's
    context, and every subscription of the process was refused on it once the attempt was past its lease)."""
    if CURRENT.get() is None:
        return fn()
    context = contextvars.copy_context()
    context.run(CURRENT.set, None)
    return context.run(fn)


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of ``coro`` in a copy of this context without a guard: the SDK's own tasks (a turn's publishes, or
    lock requests, sent in one call) carry the calls of other code too, each checked as it is made (trial IM: a
    batch started by a handler past its lease refused another caller's publish, and one started by other code
    carried the lost handler's)."""
    context = contextvars.copy_context()
    context.run(CURRENT.set, None)
    return asyncio.get_running_loop().create_task(coro, context=context)
