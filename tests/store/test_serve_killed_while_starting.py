"""A client whose first ``open(DIR)`` finds a ``tinystore serve`` starting there waits for a server, and never
starts a sidecar in its place when that ``serve`` ends before it serves (trial JI, session of 2026-12-07, eighth:
killed as it started, a client that had not reached it started a sidecar, and the ``serve`` started again found the
directory taken)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths
from tinystore.server.dirlock import lock_holders

from ..helpers import ServerProcess

# a stand-in for a `tinystore serve DIR` that holds the directory and does not serve it yet (its command line is
# read as `tinystore serve`: a script named tinystore, given `serve DIR`)
STARTING = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tinystore.server.dirlock import DirLock

    DirLock(Path(sys.argv[2])).acquire()
    print("locked", flush=True)
    time.sleep(60)
    """
)


@contextlib.asynccontextmanager
async def starting_server(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A store (one table, ``t``) whose directory a stand-in for ``tinystore serve DIR *flags`` holds as it starts;
    killed at the end if it still runs."""
    d = tmp_path / "store"
    async with await tinystore.open(d, embedded=True, serve=False) as store:
        await (await store.database("app")).exec("create table t (x)")
    script = tmp_path / "bin" / "tinystore"
    script.parent.mkdir()
    script.write_text(STARTING)
    starting = subprocess.Popen([sys.executable, str(script), "serve", str(d), *flags], stdout=subprocess.PIPE)
    try:
        assert starting.stdout is not None
        assert await asyncio.to_thread(starting.stdout.readline) == b"locked\n"
        yield d, starting
    finally:
        if starting.poll() is None:
            starting.kill()
            starting.wait(10)


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


async def test_a_serve_that_ends_as_it_starts_is_waited_for_not_replaced(tmp_path: Path) -> None:
    server: ServerProcess | None = None
    opened: asyncio.Task[tinystore.Store] | None = None
    try:
        async with starting_server(tmp_path) as (d, starting):
            opened = asyncio.create_task(tinystore.open(d))
            await asyncio.sleep(1.0)  # the client waits for the starting server
            assert not opened.done()
            kill(starting)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # no sidecar takes the directory meanwhile
                assert not lock_holders(d), "a sidecar took the directory of the `serve` that ended"
                assert not opened.done(), opened
                await asyncio.sleep(0.05)
            server = ServerProcess(d)
            await asyncio.to_thread(server.start)
            store = await asyncio.wait_for(opened, 20)
            try:
                assert await (await store.database("app")).scalar("select count(*) from t") == 0
                assert (paths.read_address(d) or {}).get("pid") == server.proc.pid  # type: ignore[union-attr]
            finally:
                await store.close()
    finally:
        if opened is not None and not opened.done():
            opened.cancel()
        if server is not None:
            await asyncio.to_thread(server.stop)


@pytest.mark.parametrize("flag", ["--sidecar", "--private"])
async def test_a_server_the_sdk_started_that_ends_as_it_starts_is_replaced(tmp_path: Path, flag: str) -> None:
    """A sidecar (or another process's private server) is a ``tinystore serve DIR --sidecar`` (``--private``) too:
    one killed as it starts is replaced by a sidecar that a waiting client starts (trials JK, JL: taken for a user's
    ``serve``, every waiting ``open`` failed after 20 s)."""
    opened: asyncio.Task[tinystore.Store] | None = None
    try:
        async with starting_server(tmp_path, flag) as (d, starting):
            opened = asyncio.create_task(tinystore.open(d))
            await asyncio.sleep(2.5)  # past the client's first look again (every 2 s)
            assert not opened.done()
            kill(starting)
            store = await asyncio.wait_for(opened, 15)
            try:
                assert await (await store.database("app")).scalar("select count(*) from t") == 0
            finally:
                await store.stop_server()
                await store.close()
    finally:
        if opened is not None and not opened.done():
            opened.cancel()
