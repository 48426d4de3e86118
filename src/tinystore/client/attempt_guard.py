"""What a job's handler may still send: the calls a handler makes (in its task, and the tasks it starts) are
looked at by its attempt first, so that an attempt this worker counts as past its lease sends nothing more.

A worker whose process was paused (SIGSTOP, a VM frozen) past an attempt's lease wakes with the handler's timers
and its own renewal due in one loop turn; the handler's write went out first, after another worker had run the
job (trial IL). The transport asks :data:`CURRENT` before it sends a call; the jobs engine sets it around a
handler. Nothing here knows of jobs or sockets."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

CURRENT: ContextVar[Callable[[str], None] | None] = ContextVar("tinystore_attempt_guard", default=None)
"""In a handler's context: called with each call's method before it is sent; raises (``LostError``) to stop it."""
