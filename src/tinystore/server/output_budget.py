"""What the server's connections hold written for their clients and not yet taken, all connections together.

One connection's share is bounded by the listener (answers begin only while its client reads them, a few at a
time; see ``listener.BOUNDED_READS``), but not the sum: a client with many connections, each holding the answers of
its few big reads unread, could make the server hold their number times as much, up to the descriptor limit (trial
FK). Past ``Limits.client_output_bytes``, the connection holding the most of those whose client took nothing of it
for :data:`STALLED` seconds is closed at once, its unsent bytes dropped, as Redis closes its clients past
``maxmemory-clients`` (largest first) or past a ``client-output-buffer-limit`` held for some seconds. A client that
reads is never closed for it, however much it asked for (trial FU: one reading 12 answers of 8 MB at once was
closed again and again past a hard bound; each time its reads were sent again, and it never got them): what a
client that reads holds is bounded by its connection's own share.

The sizes are what each connection's transport says it holds unsent, noted as each write is handed to it (with
how much was written, so that a client that takes less than is written is still seen taking); a client that reads
its answers tells the server nothing, so the sizes noted may be too large: they are read again from every transport
before any connection is closed. No I/O here: a holder reads its own transport.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

STALLED = 1.0
"""Seconds a client must have taken nothing of what it holds before it may be closed for the bound."""


class Holder(Protocol):
    """A connection whose unsent bytes count against the budget."""

    def unsent_now(self) -> int:
        """Bytes its transport holds unsent now (0 once it is closed)."""
        ...

    def evict(self, held: int, total: int, limit: int) -> None:
        """Close the connection at once, dropping what it holds unsent (``held`` bytes of ``total``, past
        ``limit``)."""
        ...


Later = Callable[[float, Callable[[], None]], Any]
"""``later(seconds, fn)``: call ``fn`` once, that many seconds from now (``loop.call_later``)."""


class OutputBudget:
    """The bytes noted for each holder, their sum, and the bound (``limit``, bytes). ``clock``: seconds, only
    ever compared (``time.monotonic``); ``later``: how to look again once a holder past the bound may have
    stalled, when no write comes meanwhile (None: only at the next write)."""

    __slots__ = ("clock", "evicted", "evicting", "held", "later", "limit", "looking", "took_at", "total")

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic, later: Later | None = None) -> None:
        self.limit = limit
        self.clock = clock
        self.later = later
        self.looking = False  # a look is due (see later)
        self.total = 0
        self.held: dict[Holder, int] = {}  # only holders with bytes unsent
        self.took_at: dict[Holder, float] = {}  # when each was last seen taking bytes (or began to hold some)
        self.evicting = False
        self.evicted = 0  # connections closed for the budget since the server began (told by status)

    def note(self, holder: Holder, size: int, written: int = 0, shed: bool = True) -> None:
        """``holder`` holds ``size`` bytes unsent now, ``written`` bytes having been handed to it since it was last
        noted; past the limit, stalled holders are closed (see the module) until the sum is within it again, or
        none may be (not when ``shed`` is false: from inside a transport's own call, such as ``pause_writing``;
        the write that made it call looks again)."""
        old = self.held.get(holder, 0)
        if size == old and (not written or not size):
            return
        if size:
            self.held[holder] = size
            if size < old + written or not old:  # it took some (or it begins to hold)
                self.took_at[holder] = self.clock()
        elif old:
            del self.held[holder]
            del self.took_at[holder]
        self.total += size - old
        if shed and self.total > self.limit and not self.evicting and not self.looking:
            self.shed()  # (while a look is due, nobody had stalled: not looked at again at each write)

    def forget(self, holder: Holder) -> None:
        """``holder`` is closed: it holds nothing any more."""
        self.total -= self.held.pop(holder, 0)
        self.took_at.pop(holder, None)

    def refresh(self) -> None:
        """Read every holder's size again (a client that read what it held said nothing: trial FS, a status showed
        it still held); closes nothing."""
        evicting, self.evicting = self.evicting, True
        try:
            for holder in list(self.held):
                self.note(holder, holder.unsent_now())
        finally:
            self.evicting = evicting

    def shed(self) -> None:
        """Read every holder's size again; while the sum is still past the limit, close the holder the module
        says, or look again once one may have stalled."""
        self.evicting = True
        try:
            self.refresh()
            now = self.clock()
            while self.total > self.limit and self.held:
                stalled = [h for h in self.held if now - self.took_at[h] >= STALLED]
                if not stalled:
                    # each of them took bytes within STALLED: looked at again at the next write, or once the
                    # first of them may have stalled
                    if self.later is not None and not self.looking:
                        self.looking = True
                        first = min(self.took_at.values())
                        self.later(max(first + STALLED - now, 0.01), self._look)
                    return
                holder = max(stalled, key=self.held.__getitem__)
                held = self.held[holder]
                total = self.total
                self.forget(holder)
                self.evicted += 1
                holder.evict(held, total, self.limit)
        finally:
            self.evicting = False

    def _look(self) -> None:
        self.looking = False
        if self.total > self.limit and not self.evicting:
            self.shed()
