"""Handing a freed place to the first of its waiters."""

from __future__ import annotations

import asyncio
import collections
from typing import TypeVar

T = TypeVar("T")


def wake_first(waiters: collections.deque[asyncio.Future[T]], value: T) -> None:
    """Set ``value`` on the first of ``waiters`` not done yet (those done already, cancelled or woken by another
    way, are dropped on the way); nothing when none is left."""
    while waiters:
        w = waiters.popleft()
        if not w.done():
            w.set_result(value)
            return
