"""A request over the frame limit (``Limits.frame_body_bytes``, 16 MiB) is refused with ``LimitError`` before
anything is sent, in every way of reaching the store, and the connection goes on; a server that refuses a frame
closes that connection with a reason, and the client fails what was pending at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.client.transport import RemoteTransport
from tinystore.errors import LimitError, OutcomeUnknownError
from tinystore.protocol import frames
from tinystore.protocol.frames import HEADER_SIZE, Connection, Kind
from tinystore.protocol.messages import GoAway, Welcome, encode
from tinystore.protocol.sql import Exec
from tinystore.server import paths

from ..helpers import ServerProcess, open_store
from .raw import RawClient, goaway_of

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]
LIMIT = 16 * 1024 * 1024
HUGE = "x" * (17 * 1024 * 1024)


def assert_frame_limit(exc: LimitError, *words: str) -> None:
    assert exc.limit == LIMIT and exc.wanted is not None and exc.wanted > LIMIT, (exc.limit, exc.wanted)
    for w in (*words, str(LIMIT), str(exc.wanted)):
        assert w in exc.message, exc.message


async def test_an_oversized_request_is_refused_before_sending(any_store: tinystore.Store) -> None:
    store = any_store
    db = await store.database("app", migrations=MIGRATIONS)
    with pytest.raises(LimitError) as err:
        await asyncio.wait_for(db.exec("insert into t (a) values (?)", HUGE), 30)
    assert_frame_limit(err.value, "database app", "sql.exec", "frame")
    # the connection goes on: nothing was sent, nothing was written
    await db.exec("insert into t (a) values ('small')")
    assert await db.scalar("select count(*) from t") == 1
    # reads too, by every path (one has a fast path in this process)
    for call in (db.one, db.all, db.scalar):
        with pytest.raises(LimitError) as err:
            await asyncio.wait_for(call("select * from t where a = ?", HUGE), 30)
        assert_frame_limit(err.value, "database app", "sql.query")
    assert await db.one("select a from t") == {"a": "small"}

    async def in_tx(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (a) values ('in tx')")
        with pytest.raises(LimitError):
            await tx.exec("insert into t (a) values (?)", HUGE)

    await db.tx(in_tx)
    assert await db.scalar("select count(*) from t") == 2
    # jobs: each value is within its own limit (1 MiB), together they are past the frame's
    queue = store.queue("big")
    with pytest.raises(LimitError) as err:
        await asyncio.wait_for(queue.add_many(["y" * (1000 * 1000)] * 18), 60)
    assert_frame_limit(err.value, "queue big: add_many: 18 jobs")
    assert (await queue.list()).jobs == []
    job = await queue.add("small")
    assert (await queue.get(job)) is not None


async def test_the_frame_limit_is_the_one_the_server_announced(tmp_path: Path) -> None:
    limits = tinystore.Limits(frame_body_bytes=64 * 1024)
    async with contextlib.AsyncExitStack() as stack:
        for mode in ("embedded", "private"):
            store = await stack.enter_async_context(open_store(mode, tmp_path / mode, limits=limits))
            db = await store.database("app", migrations=MIGRATIONS)
            with pytest.raises(LimitError) as err:
                await db.exec("insert into t (a) values (?)", "z" * 70_000)
            assert err.value.limit == 64 * 1024, (mode, err.value.message)
            await db.exec("insert into t (a) values (?)", "z" * 60_000)
            assert await db.scalar("select count(*) from t") == 1


async def test_a_refused_frame_fails_the_pending_call_at_once(remote_store: tinystore.Store) -> None:
    """Past the SDK's own check (as an older SDK would send it): the server refuses the frame and closes the
    connection with a reason; the write fails at once (its outcome unknown to the SDK), and the store is
    reached again for the next call. A private server used to leave this connection open for ever."""
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)
    transport = store.transport
    assert isinstance(transport, RemoteTransport)
    transport.max_body = 1 << 30  # skip the SDK's check
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as err:
        await asyncio.wait_for(db.exec("insert into t (a) values (?)", HUGE), 20)
    assert "over the limit" in err.value.message, err.value.message
    assert time.monotonic() - started < 10
    await db.exec("insert into t (a) values ('after')")
    assert transport.max_body == LIMIT  # learned again from the server's WELCOME
    assert await db.scalar("select count(*) from t") == 1


async def test_a_private_server_closes_its_first_connection(tmp_path: Path) -> None:
    """A private server (``--private``) hands its stdout back once ready; the first connection it accepts
    then must not end up on fd 1, which the event loop never closes: a refused frame closes it for real."""
    d = tmp_path / "store"
    server = ServerProcess(d, "--private", "--parent-pid", str(os.getpid())).start()
    try:
        deadline = time.monotonic() + 20
        while b"ready" not in (d / "serve.log").read_bytes():  # stdout handed back: the next fd is free
            assert time.monotonic() < deadline, "the server did not say ready"
            await asyncio.sleep(0.02)
        raw = await RawClient.open(("unix", paths.socket_path(d)))
        f = await raw.hello()
        assert f.kind is Kind.WELCOME
        raw.send(struct.pack(">IBBIB", HEADER_SIZE - 4 + 8 + 17 * 1024 * 1024, Kind.REQUEST, 0, 1, 8) + b"sql.exec")
        got = await raw.frames_until_closed(timeout=10)  # before: the GOAWAY came, the close never did
        assert "over the limit" in goaway_of(got).reason
        await raw.close()
    finally:
        assert server.stop() == 0


@contextlib.asynccontextmanager
async def goaway_server(path: Path) -> AsyncIterator[list[asyncio.StreamWriter]]:
    """A server that answers the handshake, then answers a request with a GOAWAY and keeps the connection open
    (reading nothing more): what a client sees of a server that is slow to close."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        conn = Connection("server")
        while True:
            data = await reader.read(65536)
            conn.receive_data(data)
            for kind, _flags, _stream, _method, _body in conn.next_frames():
                if kind is Kind.HELLO:
                    conn.handshaken = True
                    welcome = Welcome(
                        version=frames.PROTOCOL_VERSION,
                        server_version="test",
                        epoch=1,
                        capability="admin",
                        max_inflight=16,
                        max_body=LIMIT,
                        pid=os.getpid(),
                    )
                    writer.write(conn.send_welcome(encode(welcome)))
                elif kind is Kind.REQUEST:
                    writer.write(conn.send_goaway(encode(GoAway(reason="go away, and come back later"))))
                    await asyncio.Event().wait()  # never closes, never reads again
            if not data:
                return

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield writers
    finally:
        server.close()
        for w in writers:
            w.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


async def test_a_goaway_fails_pending_calls_at_once(tmp_path: Path) -> None:
    sock = tmp_path / "sock"
    async with goaway_server(sock):

        async def endpoint() -> tuple[str, Any]:
            return "unix", str(sock)

        transport = RemoteTransport(endpoint, description="goaway test", reconnect_timeout=5)
        await transport.connect()
        try:
            with pytest.raises(OutcomeUnknownError) as err:
                await asyncio.wait_for(transport.call("sql.exec", Exec("app", "select 1", []), write=True), 10)
            assert "come back later" in err.value.message
        finally:
            await transport.close()
