"""What the server's connections hold written for their clients and not yet taken, all connections together.

One connection's share is bounded by the listener (answers begin only while its client reads them, a few at a
time; see ``listener.BOUNDED_READS``), but not the sum: a client with many connections, each holding the answers of
its few big reads unread, could make the server hold their number times as much, up to the descriptor limit (trial
FK). Past ``Limits.client_output_bytes``, the connection holding the most of those whose client took nothing for
``Limits.client_output_stall`` seconds (:data:`STALLED` by default) is closed at once, its unsent bytes dropped,
and past :data:`HARD_FACTOR` times the limit, of those that took nothing for :data:`HARD_STALL`, as Redis closes
its clients past ``maxmemory-clients`` (largest first) or past a ``client-output-buffer-limit`` (its hard limit at
once, its soft one held for some seconds). A client whose progress shows within each second is never closed for
it, however much it asked for (trial FU: one reading 12 answers of 8 MB at once was closed again and again past a
hard bound on bytes alone); what a client that reads holds is bounded by its connection's share.

The sum is of what each connection's transport holds unsent, noted as each write is handed to it and read again
from every transport before any connection is closed (a client that reads tells the server nothing). Whether a
client took anything is seen from its progress, not from the transport alone: what it has been written in all
less what it still has to take, its socket's kernel buffer included (trial FW: the transport hands the kernel more
only once a share of a buffer of several MB is free, so a client reading steadily showed no progress for over a
second, and was closed). No I/O here: a holder reads its own transport and socket.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

STALLED = 30.0
"""Seconds a client must have taken nothing of what it holds before it may be closed for the bound, by default
(``Limits.client_output_stall``). A client's progress is seen only in steps of what its TCP peer lets the server
send at once (its receive window opens again a segment at a time: some 64 KiB over loopback, where a proxy on the
server's machine reads): at 1 s, trial FX's client reading 80 KB/s through such a proxy showed no progress for over a
second, and was closed again and again. 30 s lets a client taking a few KB a second keep its connection, and is half
of the 60 s Redis gives a ``client-output-buffer-limit``'s soft limit by default."""

HARD_FACTOR = 2
"""Past this many times the limit, a client that took nothing for :data:`HARD_STALL` may be closed, however long
the stall (trial GA: 40 connections that read nothing held 817 MiB against a bound of 1 MiB for the whole stall). As
Redis's hard ``client-output-buffer-limit`` beside its soft one: a client reading slowly enough that its progress
shows less often than that is closed only when the server holds this much."""
HARD_STALL = 1.0
"""Seconds a client must have taken nothing to be closed past :data:`HARD_FACTOR` times the limit."""


class Holder(Protocol):
    """A connection whose unsent bytes count against the budget."""

    def unsent_now(self) -> int:
        """Bytes its transport holds unsent now (0 once it is closed)."""
        ...

    def taken(self) -> int:
        """Bytes its client has taken in all, or near enough to see it grow: all it was written, less what its
        transport and its socket still hold."""
        ...

    def evict(self, held: int, total: int, limit: int, idle: float) -> None:
        """Close the connection at once, dropping what it holds unsent (``held`` bytes of ``total``, past
        ``limit``; its client took nothing for ``idle`` seconds)."""
        ...


Later = Callable[[float, Callable[[], None]], Any]
"""``later(seconds, fn)``: call ``fn`` once, that many seconds from now (``loop.call_later``)."""


class OutputBudget:
    """The bytes noted for each holder, their sum, and the bound (``limit``, bytes). ``clock``: seconds, only
    ever compared (``time.monotonic``); ``later``: how to look again once a holder past the bound may have
    stalled, when no write comes meanwhile (None: only at the next write); ``stall``: the seconds a holder must have
    taken nothing before it may be closed."""

    __slots__ = (
        "clock",
        "evicted",
        "evicting",
        "held",
        "later",
        "limit",
        "looking",
        "looking_hard",
        "seen",
        "stall",
        "total",
    )

    def __init__(
        self,
        limit: int,
        clock: Callable[[], float] = time.monotonic,
        later: Later | None = None,
        stall: float = STALLED,
    ) -> None:
        self.limit = limit
        self.stall = stall
        self.clock = clock
        self.later = later
        self.looking = False  # a look is due (see later)
        self.looking_hard = False  # ... at HARD_STALL, the sum being past HARD_FACTOR times the limit
        self.total = 0
        self.held: dict[Holder, int] = {}  # only holders with bytes unsent
        # holder → (when, what it had taken then): since when it has taken nothing, as last looked at
        self.seen: dict[Holder, tuple[float, int]] = {}
        self.evicting = False
        self.evicted = 0  # connections closed for the budget since the server began (told by status)

    def note(self, holder: Holder, size: int, shed: bool = True) -> None:
        """``holder`` holds ``size`` bytes unsent now; past the limit, stalled holders are closed (see the module)
        until the sum is within it again, or none may be (not when ``shed`` is false: from inside a transport's own
        call, such as ``pause_writing``; the write that made it call looks again)."""
        old = self.held.get(holder, 0)
        if size != old:
            if size:
                self.held[holder] = size
            else:
                del self.held[holder]
                self.seen.pop(holder, None)
            self.total += size - old
        # (looked at even when the size was noted already: a TLS transport notes it as it pauses, with shed false,
        # and the write that made it pause finds it noted; trial GC: past ten times the bound, nothing was closed)
        if (
            shed
            and self.total > self.limit
            and not self.evicting
            and (not self.looking or (not self.looking_hard and self.total > self.limit * HARD_FACTOR))
        ):
            self.shed()  # (while a look is due, nobody had stalled: not looked at again at each write)

    def forget(self, holder: Holder) -> None:
        """``holder`` is closed: it holds nothing any more."""
        self.total -= self.held.pop(holder, 0)
        self.seen.pop(holder, None)

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
        """Read every holder's size again; while the sum is still past the limit, close the largest holder that
        took nothing for ``stall`` seconds (for :data:`HARD_STALL` while the sum is past :data:`HARD_FACTOR` times
        the limit), or look again once one may have."""
        self.evicting = True
        try:
            self.refresh()
            if self.total <= self.limit:
                return
            now = self.clock()
            idle: dict[Holder, float] = {}  # holder → seconds it has taken nothing, as looked at
            for holder in self.held:
                taken = holder.taken()
                was = self.seen.get(holder)
                if was is None or taken > was[1]:
                    self.seen[holder] = (now, taken)  # (first looked at, or it took some since)
                    idle[holder] = 0.0
                else:
                    idle[holder] = now - was[0]
            hard = self.limit * HARD_FACTOR
            short = min(HARD_STALL, self.stall)
            # the largest first; one skipped stays skipped as the sum falls (the stall asked of it only grows)
            for holder in sorted(idle, key=self.held.__getitem__, reverse=True):
                if self.total <= self.limit:
                    return
                if idle[holder] < (short if self.total > hard else self.stall):
                    continue
                held = self.held[holder]
                total = self.total
                self.forget(holder)
                self.evicted += 1
                holder.evict(held, total, self.limit, idle[holder])
            over_hard = self.total > hard
            if (
                self.total > self.limit
                and self.held
                and self.later is not None
                and (not self.looking or (over_hard and not self.looking_hard))
            ):
                # each of the others took bytes within the stall (or was first looked at now): looked at again once
                # the first of them may have stalled (writes meanwhile do not look: see note)
                self.looking = True
                self.looking_hard = over_hard
                first = min(when for when, _ in self.seen.values())
                self.later(max(first + (short if over_hard else self.stall) - now, 0.05), self._look)
        finally:
            self.evicting = False

    def _look(self) -> None:
        self.looking = self.looking_hard = False
        if self.total > self.limit and not self.evicting:
            self.shed()
