"""A client's big requests that are read and not yet answered are bounded: past ``INFLIGHT_HIGH`` bytes of them
its next requests wait unread (the socket pushes back) until they are answered. Its request credit alone let a
client have 1,024 requests of up to the frame limit in the server's memory (a tester's 4 clients of 25 inserts
of 15 MiB held 1.9 GB). Nothing is refused or lost: every request runs once the earlier ones are answered."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tinystore.protocol.frames import Frame, Kind, encode_frame
from tinystore.protocol.messages import encode
from tinystore.protocol.sql import Exec
from tinystore.server import listener, paths

from ..helpers import open_store
from .raw import RawClient
from .test_cancel import server_side, wait_for
from .test_cancelled_writes import MIGRATIONS, writer_held

BODY = 6 * 1024 * 1024
SENT = 2 * listener.INFLIGHT_HIGH // BODY  # twice the bound


async def test_big_requests_under_way_are_bounded_and_all_run(tmp_path: Path) -> None:
    # contract: STORE-04
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=MIGRATIONS)
        release, holder = await writer_held(db)  # none of the inserts can run yet
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            blob = b"x" * BODY
            for stream in range(1, SENT + 1):
                raw.send(
                    encode_frame(
                        Kind.REQUEST, stream, "sql.exec", encode(Exec("app", "insert into t (b) values (?)", [blob]))
                    )
                )
            transport = raw.writer.transport
            await asyncio.sleep(1.0)  # time for the server to read all of it, had it kept reading
            assert transport.get_write_buffer_size() > 0, "the server read every big request while none could run"
            assert conn.big_bytes < listener.INFLIGHT_HIGH + 2 * BODY, conn.big_bytes
            release.set()
            await holder
            answered = set()
            while len(answered) < SENT:
                f = await raw.frame(timeout=60)
                assert isinstance(f, Frame), "the server closed the connection"
                assert f.kind is Kind.RESPONSE, f
                answered.add(f.stream)
            await wait_for(lambda: conn.big_bytes == 0 and not conn.loaded, "the bound to be let go")
        finally:
            await raw.close()
        assert await db.scalar("select count(*) from t") == SENT  # every one ran, once


async def test_a_client_that_sends_big_reads_and_stops_reading_costs_a_bounded_amount(tmp_path: Path) -> None:
    """Reads (outside a transaction) begin only while the client reads its answers, at most ``READS_MAX`` at
    once: a data token's 300 queries of a 5 MiB row, sent in one write and never read, made the server hold 3 GB
    of answers. Once the client reads, every answer comes."""
    # contract: STORE-04
    from tinystore.protocol.sql import Query

    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=MIGRATIONS)
        await db.exec("insert into t (b) values (?)", b"y" * (1 << 20))
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            n = 120
            query = encode(Query("app", "select b from t", [], "scalar"))
            raw.send(b"".join(encode_frame(Kind.REQUEST, s, "sql.query", query) for s in range(1, n + 1)))
            await asyncio.sleep(1.5)  # the server does what it will while nothing is read
            assert conn.transport is not None
            held = conn.transport.get_write_buffer_size() + sum(map(len, conn.out))
            bound = listener.HIGH_WATER + (listener.READS_MAX + 2) * (1 << 20) + (1 << 20)
            assert held <= bound, f"{held} bytes of answers held for a client that reads nothing"
            reads = conn.reads
            assert len(reads.running) <= listener.READS_MAX and reads.waiting, (len(reads.running), len(reads.waiting))
            answered = set()
            while len(answered) < n:  # now it reads: every answer comes
                f = await raw.frame(timeout=60)
                assert isinstance(f, Frame), "the server closed the connection"
                assert f.kind is Kind.RESPONSE, f
                if not f.flags:  # (a big answer comes in several frames; the last has no MORE flag)
                    answered.add(f.stream)
            assert answered == set(range(1, n + 1))
            assert not conn.reads.running and not conn.reads.waiting
        finally:
            await raw.close()


async def test_a_client_whose_requests_the_server_holds_back_is_told_the_server_is_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from trial BS: with its big requests under way past INFLIGHT_HIGH, the server read nothing more of the
    # client, its keep-alive ping included; 25 s later the SDK took the server for frozen and dropped the
    # connection: every write then raised OutcomeUnknownError. The server says it is alive to a connection it does
    # not read (listener.ALIVE_EVERY), and the calls wait, as docs/serving.md says
    # contract: STORE-06
    monkeypatch.setattr(listener, "ALIVE_EVERY", 0.2, raising=False)  # (the SDK's keep-alive is lowered as much)
    # (the transaction that holds the writer idles through the wait: a tx_idle of its own, not the default 5 s
    # that a loaded machine's setup and wait went past)
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(tx_idle=60.0)) as store:
        db = await store.database("app", migrations=MIGRATIONS)
        release, holder = await writer_held(db)
        client = await tinystore.open(tmp_path / "s")
        try:
            client.transport.keepalive_idle = 1.0  # type: ignore[attr-defined]
            client.transport.keepalive_timeout = 1.0  # type: ignore[attr-defined]
            cdb = await client.database("app")
            blob = b"x" * (1 << 20)
            writes = [
                asyncio.ensure_future(cdb.exec("insert into t (b) values (?)", blob))
                for _ in range(listener.INFLIGHT_HIGH // len(blob) + 16)
            ]
            conn = server_side(store)
            ours = client.transport._conn  # type: ignore[attr-defined]
            await wait_for(lambda: conn.loaded, "the server to hold the client's requests back")
            await asyncio.sleep(4.0)  # two keep-alive periods of the client's (idle, then timeout), unread
            assert client.transport._conn is ours and not ours.lost  # type: ignore[attr-defined]
            release.set()
            await holder
            got = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 60)
            assert [g for g in got if isinstance(g, BaseException)] == []
        finally:
            await client.close()
