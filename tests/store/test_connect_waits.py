"""``connect()`` waits out what passes, within ``reconnect_timeout``, as reconnects do: a burst of clients refused
because too many connections waited for their handshake (400 at once: 144 failed at once), a server not listening
yet (a worker started before its server failed at once with "Connection refused"). A token refused fails at once.
Each error names the store's address."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import UnauthenticatedError, UnavailableError
from tinystore.protocol import frames
from tinystore.protocol.messages import ErrorBody, encode
from tinystore.server.core import Core
from tinystore.server.listener import Listener

from ..helpers import free_port


async def tcp_listener(tmp_path: Path, cap: int, port: int = 0) -> tuple[Core, Listener, str, str]:
    """A store served in this process on TCP, letting ``cap`` connections wait for their handshake at once."""
    core = Core(tmp_path / "store")
    await core.start()
    token = secrets.token_hex(16)
    listener = Listener(core, {token: "data"})
    listener.max_handshaking = cap
    port = await listener.start_tcp("127.0.0.1", port)
    return core, listener, f"tcp://127.0.0.1:{port}", token


# contract: STORE-06
async def test_a_burst_of_clients_past_the_handshake_cap_all_get_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Far more clients connect at once than the listener lets wait for their handshake: those crowded out are told
    why and try again, with backoff, and every one gets in. (A plain connection being made counted as one "in its
    TLS handshake", and was closed told nothing.)"""
    core, _, address, token = await tcp_listener(tmp_path, cap=4)
    stores: list[tinystore.Store] = []
    caplog.set_level(logging.WARNING, "tinystore.server")
    try:
        got = await asyncio.gather(
            *[tinystore.connect(address, token=token, reconnect_timeout=20) for _ in range(60)], return_exceptions=True
        )
        stores = [s for s in got if isinstance(s, tinystore.Store)]
        failed = [repr(e) for e in got if not isinstance(e, tinystore.Store)]
        assert failed == [], failed[:3]
        assert (await stores[-1].status())["version"]
        assert "in its TLS handshake" not in caplog.text
    finally:
        for store in stores:
            await store.close()
        await core.stop(1.0)


async def crowding_server() -> tuple[asyncio.Server, str, list[int]]:
    """A server that answers every HELLO as a crowded listener does (older servers: the message alone)."""
    tries: list[int] = []

    async def crowded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tries.append(1)
        await reader.read(1)
        body = encode(ErrorBody(code="unavailable", message="too many connections are waiting for their handshake"))
        writer.write(frames.Connection("server").send_error(0, body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(crowded, "127.0.0.1", 0)
    return server, f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}", tries


async def test_a_crowded_server_is_tried_again_until_reconnect_timeout_and_named(tmp_path: Path) -> None:
    server, address, tries = await crowding_server()
    try:
        began = time.monotonic()
        with pytest.raises(UnavailableError) as info:
            await tinystore.connect(address, token="t" * 16, reconnect_timeout=1)
        waited = time.monotonic() - began
        assert 0.9 < waited < 5, waited
        assert len(tries) > 2, tries
        message = info.value.message
        assert f"the store at {address}: too many connections are waiting for their handshake" in message, message
        assert f"the store at {address} could not be reached for " in message, message
        assert "reconnect_timeout 1s" in message, message
    finally:
        server.close()
        await server.wait_closed()


# contract: STORE-06
async def test_connect_waits_for_a_server_that_is_not_listening_yet(tmp_path: Path) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    began = time.monotonic()
    with pytest.raises(UnavailableError) as info:
        await tinystore.connect(address, token="t" * 16, reconnect_timeout=0.5)
    assert 0.4 < time.monotonic() - began < 5
    message = info.value.message
    assert f"the store at {address} could not be reached for " in message, message
    assert "reconnect_timeout 0.5s" in message and "refused" in message, message

    # the server comes up while the client waits for it
    token = secrets.token_hex(16)
    task = asyncio.ensure_future(tinystore.connect(address, token=token, reconnect_timeout=20))
    core: Core | None = None
    try:
        await asyncio.sleep(0.5)
        assert not task.done()
        core = Core(tmp_path / "store")
        await core.start()
        listener = Listener(core, {token: "data"})
        await listener.start_tcp("127.0.0.1", port)
        store = await asyncio.wait_for(task, 10)
        try:
            assert (await store.status())["version"]
        finally:
            await store.close()
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if core is not None:
            await core.stop(1.0)


# contract: STORE-03
async def test_a_wrong_token_fails_at_once_naming_the_store(tmp_path: Path) -> None:
    core, _, address, _ = await tcp_listener(tmp_path, cap=256)
    try:
        began = time.monotonic()
        with pytest.raises(UnauthenticatedError) as info:
            await tinystore.connect(address, token="w" * 32, reconnect_timeout=30)
        assert time.monotonic() - began < 2
        assert info.value.message == (
            f"the store at {address}: the token is wrong: it is none of the server's (its --tokens file)"
        )
        # trial DH: none given was told "missing or wrong"
        with pytest.raises(UnauthenticatedError) as info:
            await tinystore.connect(address, reconnect_timeout=30)
        assert info.value.message == (
            f"the store at {address}: no token was given, and this server asks for one (pass token=, one of the "
            "tokens in its --tokens file)"
        )
    finally:
        await core.stop(1.0)


async def test_a_connect_cancelled_while_it_waits_leaves_nothing(tmp_path: Path) -> None:
    """Cancelled between tries (nothing listens), it ends at once; nothing of it runs on."""
    address = f"tcp://127.0.0.1:{free_port()}"
    task = asyncio.ensure_future(tinystore.connect(address, token="t" * 16, reconnect_timeout=30))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert not [t for t in asyncio.all_tasks() if "RemoteTransport" in repr(t)]


@pytest.mark.parametrize("how", ["reset", "close"])
async def test_a_server_that_resets_or_closes_the_connection_in_the_handshake_is_tried_again(how: str) -> None:
    """A reset in the handshake (a server crowded, whose refusal the reset overtook, or one dying) passes too; a
    closed port of a TLS listener's crowding shows as a broken pipe alike. So does a clean close (trial HS: a
    forwarder such as docker-proxy, whose backend is not up yet, takes the connection and closes it; the first
    connect() failed at once), whose error, should it never pass, says what a TLS listener would want."""
    tries: list[int] = []

    async def end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tries.append(1)
        await reader.read(1)
        if how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # (an RST)
        else:
            writer.close()  # (a FIN)

    server = await asyncio.start_server(end, "127.0.0.1", 0)
    address = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(UnavailableError) as info:
            await tinystore.connect(address, token="t" * 16, reconnect_timeout=0.7)
        assert len(tries) > 2, tries
        message = info.value.message
        assert f"the store at {address} could not be reached for " in message, message
        assert "closed the connection during the handshake" in message, message
        assert ("use tls://" in message) == (how == "close"), message
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_broken_under_the_hello_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HELLO's write failed with EPIPE (the server closed the connection as it came: a TLS listener crowded
    with connections in their handshake): that passes as a reset does (it was final, "Broken pipe")."""
    from tinystore.client import transport as transport_mod

    made = transport_mod._ClientConn.connection_made
    tries: list[int] = []

    def connection_made(self: transport_mod._ClientConn, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        tries.append(1)
        self.loop.call_soon(self.connection_lost, BrokenPipeError(32, "Broken pipe"))

    monkeypatch.setattr(transport_mod._ClientConn, "connection_made", connection_made)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    address = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(UnavailableError) as info:
            await tinystore.connect(address, token="t" * 16, reconnect_timeout=0.5)
        assert len(tries) > 2, tries
        assert "Broken pipe" in info.value.message and "use tls://" not in info.value.message, info.value.message
    finally:
        server.close()
        await server.wait_closed()


# contract: STORE-04
async def test_a_server_that_is_not_a_store_is_named_as_such() -> None:
    """An HTTP server on the port: "frame body of 1213486105 bytes is over the limit" ("HTTP" read as a length),
    with nothing to say that what listens is not a store (trial CK)."""

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(10)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(UnavailableError, match=r"does not speak TinyStore's protocol; is it the store's address"):
            await tinystore.connect(f"tcp://127.0.0.1:{port}", token="x" * 20, reconnect_timeout=1)
    finally:
        server.close()
        await server.wait_closed()
