"""A directory this process owns already: the second open says what to do, even when the first store's event loop
has ended without closing it (trial FT: a test that forgot to close its store, its asyncio.run over)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, tinystore

    kept = {}

    async def forget() -> None:
        kept["store"] = await tinystore.open(sys.argv[1], embedded=True)

    async def again() -> None:
        try:
            await tinystore.open(sys.argv[1], embedded=True)
        except tinystore.InUseError as exc:
            print(exc.message)
        try:  # (trial FU: through the socket, it waited 15 s, then said the server was suspended)
            await asyncio.wait_for(tinystore.open(sys.argv[1]), 5)
        except tinystore.InUseError as exc:
            print("sidecar:", exc.message)

    asyncio.run(forget())
    asyncio.run(again())
    """
)


# contract: STORE-01
def test_a_store_left_open_by_an_ended_loop_is_named_so(tmp_path: Path) -> None:
    script = tmp_path / "forget.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "in an event loop that has ended without closing it" in done.stdout, (done.stdout, done.stderr)
    assert "async with await tinystore.open(...)" in done.stdout
    assert "sidecar: " in done.stdout and done.stdout.count("in an event loop that has ended") == 2, done.stdout


PRIVATE = textwrap.dedent(
    """
    import asyncio, sys, tinystore

    kept = {}

    async def forget() -> None:
        kept["store"] = await tinystore.open(sys.argv[1], private=True)

    async def again() -> None:
        for how in ({"private": True}, {"embedded": True}):
            try:
                await tinystore.open(sys.argv[1], **how)
            except tinystore.InUseError as exc:
                print(exc.message)

    asyncio.run(forget())
    asyncio.run(again())
    # a process this program starts is told of another process (trial GE: it was told "this program")
    child = "import asyncio, sys, tinystore\\n"
    child += "async def go():\\n"
    child += "    try:\\n"
    child += "        await tinystore.open(sys.argv[1], embedded=True)\\n"
    child += "    except tinystore.InUseError as exc:\\n"
    child += "        print('child:', exc.message)\\n"
    child += "asyncio.run(go())\\n"
    import subprocess
    print(subprocess.run([sys.executable, "-c", child, sys.argv[1]], capture_output=True, text=True).stdout.strip())
    """
)


# contract: STORE-01
def test_a_private_server_left_open_is_named_as_this_programs(tmp_path: Path) -> None:
    """It was called "another process" (the second private server, this program's child too, failed on the lock)."""
    script = tmp_path / "forget.py"
    script.write_text(PRIVATE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    for line in lines[:2]:
        assert "owned by a private server (pid" in line and "that this program (pid" in line, line
        assert "another process" not in line, line
    assert lines[2].startswith("child: ") and "owned by another process" in lines[2], lines[2]
