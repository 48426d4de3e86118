"""A write cannot be taken back: a ``CANCEL`` after it was sent leaves it to run, and gives the client its request
credit back at once. Such writes still count against their connection until they ran: a client that sends and
cancels writes faster than they run finds its next requests unread (the socket pushes back), so the server's
queue of writes (and its memory) stays bounded; once they ran, the connection is read again and answers as
before. Nothing is lost: every cancelled write still commits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tinystore
from tinystore.protocol.frames import Frame, Kind, encode_frame
from tinystore.protocol.jobs import Add, NewJob
from tinystore.protocol.messages import encode
from tinystore.protocol.sql import Exec, Query
from tinystore.server import listener, paths

from ..helpers import open_store
from .raw import RawClient
from .test_cancel import server_side, wait_for

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, b blob);")]
BLOB = 64 * 1024
# twice what a connection may have of cancelled writes still to run
SENT = 2 * listener.ORPHANS_HIGH // BLOB


async def writer_held(db: Any) -> tuple[asyncio.Event, asyncio.Task[Any]]:
    """Hold ``db``'s writer with a transaction until the returned event is set (the task ends then)."""
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: Any) -> None:
        held.set()
        await release.wait()

    holder = asyncio.create_task(db.tx(hold))
    await held.wait()
    return release, holder


async def flood_while_the_writer_is_held(tmp_path: Path, request: Callable[[int], bytes], count: str) -> None:
    """With the writer of database ``app`` held by a transaction, send ``SENT`` writes, each cancelled right
    after it: the server stops reading the connection (what the client sent stays in its buffers) with its
    cancelled writes bounded; once the writer is free, every write runs and the connection answers again."""
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=MIGRATIONS)
        q = store.queue("q", dict, database=db)
        await q.add({"warm": True})  # the queue's table exists before the writer is held
        release, holder = await writer_held(db)
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            for _ in range(SENT):
                raw.send(request(1) + encode_frame(Kind.CANCEL, 1, "", b""))  # the credit is back at once
            transport = raw.writer.transport
            await asyncio.sleep(1.0)  # time for the server to read all of it, had it kept reading
            assert transport.get_write_buffer_size() > 0, (
                "the server read every cancelled write while none could run: its queue grows without bound"
            )
            assert 0 < conn.orphan_bytes < listener.ORPHANS_HIGH + 2 * (1 << 20)
            release.set()
            await holder
            await wait_for(lambda: transport.get_write_buffer_size() == 0, "the server to read the rest")
            raw.send(raw.conn.send_request(2, "sql.query", encode(Query("app", count, [], "scalar"))))
            while True:
                f = await raw.frame(timeout=30)
                assert isinstance(f, Frame), "the server closed the connection"
                if f.stream == 2:
                    break
            assert f.kind is Kind.RESPONSE, f
            await wait_for(lambda: conn.orphan_bytes == 0, "the cancelled writes to have run")
            assert not conn.held
        finally:
            await raw.close()
        # nothing lost: a cancel after sending leaves the write to happen
        assert await db.scalar(count) == SENT + (1 if "job" in count else 0)


async def test_cancelled_execs_cannot_grow_the_servers_queue_without_bound(tmp_path: Path) -> None:
    blob = b"x" * BLOB

    def request(stream: int) -> bytes:
        return encode_frame(
            Kind.REQUEST, stream, "sql.exec", encode(Exec("app", "insert into t (b) values (?)", [blob]))
        )

    await flood_while_the_writer_is_held(tmp_path, request, "select count(*) from t")


async def test_cancelled_job_adds_cannot_grow_the_servers_queue_without_bound(tmp_path: Path) -> None:
    value = '{"pad": "' + "x" * BLOB + '"}'

    def request(stream: int) -> bytes:
        return encode_frame(Kind.REQUEST, stream, "jobs.add", encode(Add(queue="q", jobs=[NewJob(value=value)])))

    await flood_while_the_writer_is_held(tmp_path, request, "select count(*) from _tinystore_jobs")


async def test_the_sdk_does_not_buffer_without_bound_when_the_server_reads_no_more(tmp_path: Path) -> None:
    """The SDK's side of it: a caller that sends and cancels writes while the server holds the connection unread
    waits (its cancel then sends nothing), rather than piling requests up in this process's socket buffer."""
    from tinystore.client import transport as client_transport

    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=MIGRATIONS)
        release, holder = await writer_held(db)
        other = await tinystore.open(tmp_path / "s")  # a client over the embedded store's socket
        try:
            remote = await other.database("app")
            conn: Any = other.transport._conn  # type: ignore[attr-defined]
            blob = b"x" * BLOB
            most = 0
            for _ in range(SENT):
                t = asyncio.ensure_future(remote.exec("insert into t (b) values (?)", blob))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # written (or waiting for its turn)
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
                most = max(most, conn.transport.get_write_buffer_size())
            assert most <= client_transport.HIGH_WATER + 2 * BLOB, f"{most} bytes buffered in the client"
            release.set()
            await holder
            assert await remote.scalar("select count(*) from t") > 0  # the connection still answers
        finally:
            release.set()
            await other.close()
