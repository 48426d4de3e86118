"""How this process's SDK lets the event loop turn between calls that do not wait (an embedded store's)."""

from __future__ import annotations

import asyncio

TURN_PASS = 1e-9
"""The delay (seconds) with which :func:`pass_turn` lets the loop turn: a timer's, not ``asyncio.sleep(0)``'s."""


async def pass_turn() -> None:
    """Let the event loop turn, the timers that fell due meanwhile first. ``asyncio.sleep(0)`` puts the task back
    among the callbacks ready now, which the next turn runs before the timers that fall due by then: a task that
    let the loop turn after each 5 ms of calls ran 5 ms more before a 10 ms ticker's timer ran (gaps of 25 ms,
    trial IE). As a timer itself, of no delay, it runs after those. A cancel while it waits leaves nothing."""
    await asyncio.sleep(TURN_PASS)
