"""A ``CANCEL`` from a client stops the call it names, whatever runs it on the server: a task (a coroutine's),
or a future (a read on a reader thread, a statement of a transaction); the cancelled stream is not answered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import tinystore
from tinystore.protocol.frames import Frame, Kind, encode_frame
from tinystore.protocol.messages import decode, encode
from tinystore.protocol.sql import Begin, Query, Rows, TxRef
from tinystore.server import paths

from ..helpers import open_store
from .raw import RawClient

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]
# about a second of work for SQLite, on a reader thread (inline_read=0 sends every read there)
SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 4000000) select count(*) from c"


async def wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def server_side(store: tinystore.Store) -> Any:
    """The one connection of the embedded store's socket listener (the raw client's)."""
    core: Any = store._core
    conns = [c for lst in core.listeners for c in lst.connections]
    assert len(conns) == 1, conns
    return conns[0]


async def frames_for(raw: RawClient, stream: int, until: int) -> list[Frame]:
    """The frames of ``stream`` that come before the answer to ``until`` (which is read too)."""
    got: list[Frame] = []
    while True:
        f = await raw.frame(timeout=20)
        assert isinstance(f, Frame), "the server closed the connection"
        if f.stream == stream:
            got.append(f)
        if f.stream == until:
            return got


@contextlib.asynccontextmanager
async def raw_session(tmp_path: Path, limits: tinystore.Limits | None = None) -> AsyncIterator[tuple[RawClient, Any]]:
    """An embedded store with database ``app``, a raw client past its handshake, and the server's side of
    that client's connection."""
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        await store.database("app", migrations=MIGRATIONS)
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            yield raw, server_side(store)
        finally:
            await raw.close()


async def start_slow(raw: RawClient, conn: Any, stream: int, tx: int = 0) -> Any:
    """Send the slow read on ``stream`` (in transaction ``tx``); return its future on the server once it runs."""
    raw.send(raw.conn.send_request(stream, "sql.query", encode(Query("app", SLOW, [], "scalar", tx))))
    await wait_for(lambda: stream in conn.futures, "the read to be under way")
    return conn.futures[stream]


async def test_cancel_of_a_read_on_a_reader_thread_cancels_its_future(tmp_path: Path) -> None:
    async with raw_session(tmp_path, tinystore.Limits(inline_read=0)) as (raw, conn):
        fut = await start_slow(raw, conn, 1)
        raw.send(encode_frame(Kind.CANCEL, 1, "", b""))
        await wait_for(fut.done, "the read's future to end")
        assert fut.cancelled(), "the CANCEL left the read's future running"
        assert 1 not in conn.futures and 1 not in conn.conn.inflight
        # the same read again, not cancelled: answered; the cancelled one never is
        raw.send(raw.conn.send_request(2, "sql.query", encode(Query("app", SLOW, [], "scalar"))))
        assert await frames_for(raw, 1, until=2) == []
        await asyncio.sleep(0.3)  # the first read (started first) has ended on its thread by now
        raw.send(raw.conn.send_request(3, "store.ping", encode({})))
        assert await frames_for(raw, 1, until=3) == []


async def test_cancel_of_a_statement_in_a_transaction_cancels_its_future(tmp_path: Path) -> None:
    async with raw_session(tmp_path) as (raw, conn):
        f = await raw.call(1, "sql.begin", encode(Begin("app", False)))
        assert f.kind is Kind.RESPONSE
        tx = decode(f.body, int)
        fut = await start_slow(raw, conn, 2, tx)
        raw.send(encode_frame(Kind.CANCEL, 2, "", b""))
        await wait_for(fut.done, "the statement's future to end")
        assert fut.cancelled()
        # the transaction goes on (the client decides what to do with it): it answers, then rolls back
        f = await raw.call(3, "sql.query", encode(Query("app", "select 7", [], "scalar", tx)))
        assert f.kind is Kind.RESPONSE
        f = await raw.call(4, "sql.rollback", encode(TxRef(tx)))
        assert f.kind is Kind.RESPONSE, f


async def test_a_stream_cancelled_then_used_again_gets_the_new_answer(tmp_path: Path) -> None:
    async with raw_session(tmp_path, tinystore.Limits(inline_read=0)) as (raw, conn):
        await start_slow(raw, conn, 5)
        raw.send(encode_frame(Kind.CANCEL, 5, "", b""))
        # the frame parser gives the credit back as it reads the CANCEL (a REQUEST right after it may use the
        # stream again, even in the same read)
        await wait_for(lambda: 5 not in conn.conn.inflight, "the CANCEL to be read")
        f = await raw.call(5, "sql.query", encode(Query("app", "select 42", [], "scalar")))
        assert f.kind is Kind.RESPONSE and decode(f.body, Rows).rows == [[42]], f
        await asyncio.sleep(1.5)  # the cancelled read ends meanwhile: nothing more comes for stream 5
        raw.send(raw.conn.send_request(6, "store.ping", encode({})))
        assert await frames_for(raw, 5, until=6) == []
