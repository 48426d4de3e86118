"""The one clock every engine reads.

``Clock()`` follows the wall clock. ``Clock(start)`` is a test clock: it starts at ``start`` and then moves
with real time plus whatever :meth:`Clock.advance` adds, so tests of ttls and backoffs need not sleep.
Timers set with :meth:`Clock.call_at` fire when the clock reaches their deadline, whether real time or an
``advance`` got it there.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime

from .durations import Duration, seconds
from .errors import InvalidError

_FIRE_MAX = 100_000
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
"""The latest time a test clock may reach (the last second a ``datetime`` holds)."""
"""At most this many timers fire in one go of a test clock (see ``Clock._fire_in_order``)."""


class Timer:
    """A timer set by :meth:`Clock.call_at`; :meth:`cancel` stops it (idempotent)."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """Seconds since the Unix epoch, real or under test control."""

    def __init__(self, start: datetime | float | None = None) -> None:
        self.is_test = start is not None
        if start is None:
            self._base = time.time()
        elif isinstance(start, datetime):
            if start.tzinfo is None:
                start = start.replace(tzinfo=UTC)
            self._base = start.timestamp()
        else:
            self._base = float(start)
        self._mono0 = time.monotonic()
        self._offset = 0.0
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._handle_when: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        """Seconds since the Unix epoch, as a float."""
        if not self.is_test:
            return time.time()
        # (a test clock stops at the end of year 9999, running on by itself too: past it, every add failed; trial CT)
        return min(self._base + (time.monotonic() - self._mono0) + self._offset, LATEST)

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, as an int."""
        return int(self.now() * 1000)

    def datetime(self, when: float | None = None) -> datetime:
        """``when`` (default now) as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now() if when is None else when, UTC)

    def advance(self, by: Duration) -> None:
        """Move a test clock forward by ``by``; timers now due fire before this returns, in the order of their
        times (a lease that ends at 175 s ends after a wait that ends at 125 s), each with the clock at its own
        time: what a timer's callback does runs from then (a key passed on at 3,600 s of a 7,320 s advance gets a
        lease from 3,600 s, which ends within the advance when its ttl is an hour; a lost job's retry is due its
        backoff after its lease ended). Work a callback leaves to a task runs once the advance returns, at the
        clock's new time (a job claimed within it runs from then: its lease, timeout and expected time count from
        the advance's end, and its started_at says so). Raises ``InvalidError`` on a real clock, and for a step
        past the end of year 9999 (it stays where it was)."""
        if not self.is_test:
            raise InvalidError("clock: only a test clock (open(..., clock=datetime)) can be advanced")
        step = seconds(by, "clock advance")
        target = self.now() + step
        if target > LATEST:
            # past it, no time could be a datetime: every job's add failed (trial CQ)
            raise InvalidError(f"clock advance: {by!r} would take the test clock past the end of year 9999")
        self._fire_in_order(until=target)

    def _move_to(self, when: float) -> None:
        """Move a test clock forward to ``when`` (never back: real time may have taken it past already)."""
        now = self.now()
        if when > now:
            self._offset += when - now

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback()`` in the running loop once the clock reaches ``when`` (seconds since the epoch)."""
        timer = Timer(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), timer))
        self._schedule()
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback()`` after ``delay`` seconds of this clock."""
        return self.call_at(self.now() + delay, callback)

    async def sleep_until(self, when: float) -> None:
        """Wait until the clock reaches ``when``. A cancel leaves no timer behind."""
        if when <= self.now():
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_at(when, wake)
        try:
            await fut
        finally:
            timer.cancel()

    async def sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds of this clock."""
        await self.sleep_until(self.now() + delay)

    def close(self) -> None:
        """Drop every timer."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._heap.clear()

    def _schedule(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        if not self._heap:
            return
        when = self._heap[0][0]
        if self._handle is not None and self._handle_when is not None and self._handle_when <= when:
            return
        loop: asyncio.AbstractEventLoop | None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
        if loop is None:
            return
        self._loop = loop
        if self._handle is not None:
            self._handle.cancel()
        delay = max(0.0, when - self.now())
        self._handle_when = when
        self._handle = loop.call_later(delay, self._on_handle)

    def _fire_in_order(self, until: float | None = None) -> None:
        """A test clock's due timers, one at a time in the order of their times, each looked for again after every
        callback: a timer that a callback sets at a time already passed (an engine that ends what is due at one
        time, then sets its timer for the next) fires in its place, before the later ones, within ``advance``.
        ``until``: the time an advance moves the clock to: it moves there timer by timer, each callback run with
        the clock at its timer's time (trial ET: at the advance's end, a lease granted by a timer of the advance
        ran its ttl from there). (A callback that keeps setting timers in the past stops after ``_FIRE_MAX`` of
        them: the rest fire at the loop's next turn.)"""
        heap = self._heap
        budget = _FIRE_MAX
        while heap and budget:
            when, _, timer = heap[0]
            if timer.cancelled:
                heapq.heappop(heap)
                continue
            if when > (self.now() if until is None else until):
                break
            if until is not None:
                self._move_to(when)
            heapq.heappop(heap)
            timer.cancelled = True
            budget -= 1
            timer.callback()
        if until is not None:
            self._move_to(until)
        self._reschedule()

    def _on_handle(self) -> None:
        self._handle = None
        self._handle_when = None
        self._fire()

    def _fire(self) -> None:
        if self.is_test:
            self._fire_in_order()
            return
        now = self.now()
        due: list[Timer] = []
        while self._heap and (self._heap[0][0] <= now or self._heap[0][2].cancelled):
            _, _, timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                due.append(timer)
        for timer in due:
            timer.cancelled = True
            timer.callback()
        self._reschedule()

    def _reschedule(self) -> None:
        """After timers fired: the loop's wake-up goes to the earliest timer left (a callback may have set one)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._handle_when = None
        self._schedule()
