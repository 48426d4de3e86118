"""Python's cyclic garbage collector held off while a big queue is read into memory.

Reading a queue of a million waiting jobs makes millions of objects that all live on. Each full collection
that their growth sets off walks every one of them: on this project's test machine, 11 full collections during
such a load took 2.9 s of its 14.6 s, the longest stopping the event loop for 0.7 s. Held off, the load took
7.9 s and the loop never stopped for more than 0.08 s.

:func:`held` holds the collector off (``gc.disable``) while any load runs, and gives it back as it was found
when the last one ends. In a process that is only a store's server, set :data:`FREEZE`: the objects then alive
move to the permanent generation (``gc.freeze``, Python 3.7+), so that no later full collection walks them
either. An application running its store embedded keeps its collector as it had it, and pays one full
collection after the load.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FREEZE = False
"""Freeze what is alive when the last load ends: set by a process that is only a store's server."""

_holding = 0
_was_enabled = False


@contextmanager
def held() -> Iterator[None]:
    """The collector off while the ``with`` block runs (and any other one's); as found after the last one.

    Blocks may nest and overlap (loads of several queues at once, interleaved on one loop)."""
    global _holding, _was_enabled
    if _holding == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
        if _holding == 0:
            if FREEZE:
                gc.freeze()
            if _was_enabled:
                gc.enable()
