"""The line of reads waiting for a database's reader threads, fair between the clients that send them.

A first-in-first-out line let one client that sent many slow reads hold up every other client's reads until all of
its own had run (trial BB: a one-row read waited 58 s behind two clients' slow reads, each up to
``statement_timeout``). Here a free reader takes the read of the client with the fewest reads running, the clients
that tie taking turns (round robin), each client's reads in the order it sent them: a client whose reads wait
behind another's waits for the first reader to come free, not for the other's whole line. No reader is kept idle
for a client that may come (a web process is often the store's only client, and runs all its reads through one
connection), so a client can still wait for the slowest of the reads under way.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Generic, TypeVar

T = TypeVar("T")

_ITEM = 0  # a doorbell ring: one item more waits
_STOP = 1  # one taker may go


class FairReads(Generic[T]):
    """Items put by owners (any hashable: a client's session; ``None``: the store's own), taken by threads.

    Thread-safe: :meth:`put` and :meth:`stop` on any thread (the loop's), :meth:`get` and :meth:`done` on the
    taking threads. Each item taken must be given back with :meth:`done` under the same owner once it ran.

    The takers wait on a C queue (a doorbell rung once per item put, and once per taker let go), and choose the
    item under a plain lock: a line of Python's ``threading.Condition`` made reads on reader threads a fifth
    slower (trial BD)."""

    __slots__ = ("_bell", "_lock", "_running", "_waiting")

    def __init__(self) -> None:
        self._bell: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # owners with items waiting, in the order they take turns (an owner served goes to the end)
        self._waiting: dict[object, collections.deque[T]] = {}
        self._running: dict[object, int] = {}

    def put(self, item: T, owner: object = None) -> None:
        with self._lock:
            line = self._waiting.get(owner)
            if line is None:
                line = self._waiting[owner] = collections.deque()
            line.append(item)
        self._bell.put(_ITEM)

    def stop(self, threads: int) -> None:
        """Let ``threads`` takers go: each :meth:`get` returns ``None`` once the items put before are taken."""
        for _ in range(threads):
            self._bell.put(_STOP)

    def idle(self) -> bool:
        """Whether no item waits or runs."""
        with self._lock:
            return not self._waiting and not self._running

    def get(self) -> tuple[T, object] | None:
        """The next item and its owner, waiting for one; ``None`` once let go by :meth:`stop`."""
        if self._bell.get() == _STOP:
            return None
        with self._lock:
            return self._take()

    def done(self, owner: object) -> None:
        """An item of ``owner`` taken with :meth:`get` has run."""
        with self._lock:
            n = self._running[owner] - 1
            if n:
                self._running[owner] = n
            else:
                del self._running[owner]

    def _take(self) -> tuple[T, object]:
        waiting = self._waiting
        running = self._running
        if len(waiting) == 1:  # (the usual case: one client's reads wait)
            owner = next(iter(waiting))
            fewest = running.get(owner, 0)
        else:
            owner = None
            fewest = -1
            for candidate in waiting:  # (few owners wait at once: one per client with reads waiting)
                n = running.get(candidate, 0)
                if fewest < 0 or n < fewest:
                    owner, fewest = candidate, n
                    if not n:
                        break
        line = waiting.pop(owner)
        item = line.popleft()
        if line:
            waiting[owner] = line  # back of the turns
        running[owner] = fewest + 1
        return item, owner
