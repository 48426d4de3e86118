"""A cancel that arrives in the loop turn where the awaited thing completes is not lost.

On Python 3.11 ``asyncio.wait_for`` returns the inner result and drops the cancel when both happen in one turn
(CPython gh-86296, fixed in 3.12 by rewriting ``wait_for`` on ``asyncio.timeout``). A task that swallows its
cancel keeps running: a worker's renewer or a client's reader outlives the ``stop()`` that awaited it, and a
test's reader waited out its whole timeout (the CI failure of the CHAN-08 test). So nothing in ``src/`` awaits
through ``wait_for``; ``asyncio.timeout`` is used, which counts cancels (``Task.uncancel``).
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tinystore"


async def test_a_cancel_in_the_turn_the_read_completes_ends_the_task() -> None:
    reader = asyncio.StreamReader()
    after: list[bytes] = []

    async def read_loop() -> None:
        while True:
            async with asyncio.timeout(30):
                after.append(await reader.read(10))

    task = asyncio.create_task(read_loop())
    await asyncio.sleep(0)  # the task waits for data
    reader.feed_data(b"x")  # the read completes in the next turn...
    task.cancel()  # ...and the cancel comes in the same one
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the cancel was swallowed: the task went on waiting for data"
    assert task.cancelled()


def test_src_awaits_no_wait_for() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for":
                if isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio":
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"asyncio.wait_for may swallow a cancel on Python 3.11; use asyncio.timeout: {found}"
