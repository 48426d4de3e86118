"""A connection the SDK gave up on while its handshake was under way (its ``connect`` cancelled as the connection
was made): the handshake's failure is nobody's to
hear, and was logged as "Future exception was never retrieved / ... _HandshakeClosed" (seen from 24 clients
reconnecting through a sidecar's kill -9)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from typing import Any

import pytest

from tinystore.client import transport as transport_mod
from tinystore.client.transport import RemoteTransport


async def _silent_server() -> tuple[asyncio.Server, int]:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _never_retrieved(caplog: pytest.LogCaptureFixture) -> list[str]:
    gc.collect()
    return [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_a_connect_cancelled_as_its_connection_is_made_leaves_no_unretrieved_exception(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel reaches ``create_connection`` after the protocol's ``connection_made``: asyncio closes the
    transport, ``connection_lost`` fails the handshake's future, and no one awaits it."""
    server, port = await _silent_server()
    made = transport_mod._ClientConn.connection_made
    tasks: list[asyncio.Task[Any]] = []

    def connection_made(self: Any, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        tasks[0].cancel()  # (the task waits in create_connection for the transport to be ready)

    monkeypatch.setattr(transport_mod._ClientConn, "connection_made", connection_made)

    async def endpoint() -> tuple[str, Any]:
        return "tcp", ("127.0.0.1", port, None)

    caplog.set_level(logging.ERROR, "asyncio")
    try:
        for _ in range(3):
            t = RemoteTransport(endpoint, token="t" * 16, description=f"tcp://127.0.0.1:{port}")
            tasks[:] = [asyncio.ensure_future(t.connect())]
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[0]
            await t.close()
            await asyncio.sleep(0.05)  # connection_lost runs
        tasks.clear()
        assert _never_retrieved(caplog) == []
    finally:
        server.close()
        await server.wait_closed()
