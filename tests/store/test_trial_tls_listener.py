"""Trial L, findings 6, 9, 10, 11: TLS handshakes count against the handshake cap; TLS spoken to a plain listener
is recognised on both sides; the TLS-failure log line says why; the rate-limited log counts each kind apart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import ssl
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import UnavailableError
from tinystore.server.core import Core
from tinystore.server.listener import Listener, RateLimitedLog

from ..helpers import ServerProcess, write_tokens
from .test_store03_auth import make_cert
from .test_trial_server_listener import where

HELLO_START = b"\x16\x03\x01\x02\x00"  # the first 5 bytes of a TLS ClientHello (a record header)


async def tls_listener(tmp_path: Path, cap: int, timeout: float = 60.0) -> tuple[Core, Listener, int, Path, str]:
    cert, key = make_cert(tmp_path)
    core = Core(tmp_path / "store")
    await core.start()
    token = secrets.token_hex(16)
    listener = Listener(core, {token: "admin"}, handshake_timeout=timeout)
    listener.max_handshaking = cap
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    port = await listener.start_tcp("127.0.0.1", 0, ctx)
    return core, listener, port, cert, token


async def closed_soon(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closed the connection within ``within`` seconds (what it sent before is read)."""
    with contextlib.suppress(TimeoutError):
        try:
            await asyncio.wait_for(reader.read(), within)
        except ConnectionError:
            pass
        return True
    return False


# contract: STORE-03
async def test_stalled_tls_handshakes_count_against_the_cap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Peers that send 5 bytes of a ClientHello and stall: past the cap, the oldest are closed (they were all kept
    until the handshake timeout: the cap counted only connections past TLS), and a good client still gets in."""
    core, listener, port, cert, token = await tls_listener(tmp_path, cap=16)
    peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        with caplog.at_level(logging.WARNING, "tinystore.server"):
            for _ in range(200):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(HELLO_START)
                peers.append((reader, writer))
            await asyncio.sleep(0.5)
            assert len(listener.starting) + len(listener.handshaking) <= 16
            # the oldest were closed, the newest wait still
            assert await closed_soon(peers[0][0], 2.0)
            assert not await closed_soon(peers[-1][0], 0.2)
            closed = sum([await closed_soon(r, 0.05) for r, _ in peers[:150]])
            assert closed == 150, closed
            ctx = ssl.create_default_context(cafile=str(cert))
            store = await tinystore.connect(f"tls://127.0.0.1:{port}", token=token, ssl_context=ctx)
            try:
                assert (await store.status())["version"]
            finally:
                await store.close()
        assert re.search(
            r"closed a connection from 127\.0\.0\.1:\d+ in its TLS handshake: over 16 connections", caplog.text
        )
    finally:
        for _, writer in peers:
            writer.close()
        await core.stop(1.0)


async def test_a_failed_tls_handshake_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    core, _listener, port, _cert, _token = await tls_listener(tmp_path, cap=16, timeout=0.5)
    try:
        with caplog.at_level(logging.WARNING, "tinystore.server"):
            # a peer that stalls in its handshake, and one that sends what is not TLS
            _, slow = await asyncio.open_connection("127.0.0.1", port)
            slow.write(HELLO_START)
            reader, bad = await asyncio.open_connection("127.0.0.1", port)
            bad.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await closed_soon(reader, 3.0)
            await asyncio.sleep(1.0)
            slow.close()
            bad.close()
        lines = [r.getMessage() for r in caplog.records if "closed a connection" in r.getMessage()]
        assert any("TLS handshake took over 0.5s" in m for m in lines), lines
        assert any("TLS handshake failed: " in m and not m.endswith(": ") for m in lines), lines
        # (the peer named: trial HV)
        assert all(re.search(r"closed a connection from 127\.0\.0\.1:\d+: ", m) for m in lines), lines
    finally:
        await core.stop(1.0)


def test_the_rate_limited_log_counts_each_kind_apart(caplog: pytest.LogCaptureFixture) -> None:
    core_like = Listener.__new__(Listener)
    core_like.silent_logs = {}
    with caplog.at_level(logging.WARNING, "tinystore.server"):
        for _ in range(5):
            core_like.silent_log("expired").warning("expired")
        core_like.silent_log("crowded").warning("crowded")
        log = core_like.silent_log("crowded")
        log.last -= 120  # a minute later
        log.warning("crowded")
    messages = [r.getMessage() for r in caplog.records]
    # the 4 expirations not logged are not counted as crowded-out events
    assert messages == ["expired", "crowded", "crowded"], messages
    assert isinstance(core_like.silent_log("expired"), RateLimitedLog)
    assert core_like.silent_log("expired").skipped == 4


async def test_tls_spoken_to_a_plain_listener_is_named_on_both_sides(tmp_path: Path) -> None:
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        tls = server.tcp.replace("tcp://", "tls://")
        with pytest.raises(UnavailableError, match="if the server listens without TLS, use tcp://"):
            await tinystore.connect(tls, token=admin, ssl_context=ssl.create_default_context(), reconnect_timeout=1)
        # a raw ClientHello start: the server recognises it
        reader, writer = await asyncio.open_connection(*where(server.tcp))
        writer.write(HELLO_START + bytes(64))
        assert await closed_soon(reader, 3.0)
        writer.close()
        await asyncio.sleep(0.2)
        log = (server.directory / "serve.log").read_text()
        assert "a TLS client at a plain listener" in log, log
        assert "over the limit" not in log, log
    finally:
        server.stop()


# contract: STORE-04
async def test_a_burst_of_tls_clients_past_the_cap_gets_in_and_breaks_no_accept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A TLS connection crowded out in its handshake had its socket closed at once while asyncio's transport still
    held the descriptor: the next connection accepted on that number failed "File descriptor N is used by
    transport". Every client gets in (trying again), and nothing but the crowding is logged."""
    core, _listener, port, cert, token = await tls_listener(tmp_path, cap=4)
    ctx = ssl.create_default_context(cafile=str(cert))
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(str(context.get("exception") or context)))
    stores: list[tinystore.Store] = []
    try:
        got = await asyncio.gather(
            *[
                tinystore.connect(f"tls://127.0.0.1:{port}", token=token, ssl_context=ctx, reconnect_timeout=30)
                for _ in range(60)
            ],
            return_exceptions=True,
        )
        stores = [s for s in got if isinstance(s, tinystore.Store)]
        failed = [repr(e) for e in got if not isinstance(e, tinystore.Store)]
        assert failed == [], failed[:3]
        assert not [e for e in errors if "is used by transport" in e], errors[:3]
        assert "is used by transport" not in caplog.text
    finally:
        loop.set_exception_handler(previous)
        for store in stores:
            await store.close()
        await core.stop(1.0)


async def test_a_burst_of_one_kind_is_counted_at_the_end_of_its_minute(caplog: pytest.LogCaptureFixture) -> None:
    """Trial FK: four silent connections within a minute logged one line, and the count of the other three only if
    one more came after the minute; a burst then quiet is told once its minute ends."""
    limited = RateLimitedLog(every=0.2)
    caplog.set_level(logging.WARNING, logger="tinystore.server")
    for n in range(4):
        limited.warning("closed connection %d", n)
    assert [r.getMessage() for r in caplog.records] == ["closed connection 0"]
    await asyncio.sleep(0.4)
    assert [r.getMessage() for r in caplog.records] == [
        "closed connection 0",
        "closed connection 3 (and 2 more times in the last 0s)",
    ]
