"""From trial HQ: in an embedded store, most calls are answered with nothing to await, so that a caller calling in
a loop with no other await (3,000 ``queue.get`` in a row) never let the event loop turn: every other task of the
process, and the store's own socket, waited for as long as it called. Past a turn's budget of calls, a call lets
the loop turn first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..helpers import LoopTurns, open_store


@pytest.mark.parametrize("how", ["job_get", "status", "queue_options"])
# contract: STORE-04
async def test_a_call_loop_with_no_other_await_lets_the_loop_turn(tmp_path: Path, how: str) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        jid = await q.add({"n": 1})
        calls: dict[str, Any] = {
            "job_get": lambda: q.get(jid),
            "status": store.status,
            "queue_options": q.options,
        }
        call = calls[how]
        async with LoopTurns() as turns:
            for _ in range(3_000):
                await call()
            assert turns.count >= 3  # (the other task ran, each time a turn's budget of calls was spent)


# contract: STORE-04
async def test_a_loop_of_costly_calls_lets_the_loop_turn_within_milliseconds(tmp_path: Path) -> None:
    """Trial HY: the budget counted calls alone, and 512 ``status()`` of a store with 100 queues (half a
    millisecond each) held the loop a second at a time; a turn's budget is spent after some milliseconds too."""
    async with open_store("embedded", tmp_path / "s") as store:
        for i in range(40):
            await store.queue(f"q{i}", dict).add({"n": i})
        async with LoopTurns() as turns:
            for _ in range(300):  # (fewer than a turn's budget of calls)
                await store.status()
            assert turns.count >= 2
