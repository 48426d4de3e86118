"""``connect()`` (and ``open()``) cancelled while the server has not answered the handshake closes its
connection: left open, the server would keep it (a sidecar's idle timer with it), and its handshake's failure
would be logged as "Future exception was never retrieved" when the server closes it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import warnings
from pathlib import Path

import pytest

import tinystore


async def test_a_connect_cancelled_in_the_handshake_closes_its_connection(caplog: pytest.LogCaptureFixture) -> None:
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))  # a server that never answers the handshake

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        task = asyncio.ensure_future(tinystore.connect(f"tcp://127.0.0.1:{port}", token="t", reconnect_timeout=30))
        reader, writer = await asyncio.wait_for(accepted.get(), 10)
        await asyncio.sleep(0.1)  # the HELLO is sent; the client waits for the answer
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        data = await asyncio.wait_for(reader.read(), 5)  # EOF: the client closed it
        assert data is not None
        writer.close()
        caplog.set_level(logging.ERROR)
        await asyncio.sleep(0.05)
        gc.collect()
        assert "never retrieved" not in caplog.text
    finally:
        server.close()
        await server.wait_closed()


# contract: STORE-01
@pytest.mark.parametrize("after", [0.02, 0.15, 0.4])
async def test_a_private_open_cancelled_while_its_server_starts_leaves_no_owner(tmp_path: Path, after: float) -> None:
    """Trial AH: ``open(dir, private=True)`` cancelled (a ``wait_for`` timeout) while its child server started left
    the child running and owning the directory until this process ended: every later private open of it in this
    process failed with InUseError."""
    directory = tmp_path / "s"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        try:
            store = await asyncio.wait_for(tinystore.open(directory, private=True), after)
        except TimeoutError:
            pass
        else:
            await store.close()  # (started within the time: nothing was cancelled)
        gc.collect()
    # trial EN: the child's two pipes were left to the garbage collector ("unclosed file <_io.BufferedReader")
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
    async with await tinystore.open(directory, private=True) as store:
        db = await store.database("app")
        assert await db.scalar("select 1") == 1
