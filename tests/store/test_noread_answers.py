"""A connection that sends many calls whose answers are big and reads none of them makes the server hold a bounded
number of those answers (STORE-04), whatever the call: a read, an ``exec`` whose statement answers with rows (a
SELECT, a RETURNING), or a transaction's call. From trial AO: an exec's or a transaction's answers were all made,
1,024 of 8 MB, and the server grew past 4 GB."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tinystore.protocol import frames
from tinystore.protocol.frames import Frame, Kind
from tinystore.protocol.messages import decode, encode
from tinystore.protocol.sql import Begin, Exec, OpenDb, Query, TxRef
from tinystore.server import paths
from tinystore.server.listener import READS_MAX

from ..helpers import open_store
from .raw import RawClient
from .test_cancel import server_side

ANSWER = 1_000_000
CALLS = 64


async def answer(raw: RawClient, stream: int) -> Any:
    while True:
        f = await raw.frame(timeout=20)
        assert isinstance(f, Frame) and f.kind is not Kind.GOAWAY, f
        if f.stream == stream:
            assert f.kind is Kind.RESPONSE, f
            return decode(f.body)


# contract: STORE-04
@pytest.mark.parametrize("call", ["exec_select", "exec_returning", "tx_query", "tx_exec_returning"])
async def test_big_answers_a_connection_does_not_read_are_made_a_few_at_a_time(tmp_path: Path, call: str) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("x", migrations=[("001.sql", "create table t (v);")])
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            raw.send(frames.request_frame(1, "sql.open", encode(OpenDb(db="x"))))
            await answer(raw, 1)
            tx = 0
            if call.startswith("tx_"):
                raw.send(frames.request_frame(2, "sql.begin", encode(Begin("x", call == "tx_query"))))
                tx = await answer(raw, 2)
                assert isinstance(tx, int) and tx > 0, tx
            made = 0
            pieces = []
            for i in range(CALLS):
                if call == "exec_select":
                    req: Any = Exec("x", f"select zeroblob({ANSWER})", [], tx)
                elif call in ("exec_returning", "tx_exec_returning"):
                    req = Exec("x", f"insert into t values ({i}) returning zeroblob({ANSWER})", [], tx)
                else:
                    req = Query("x", f"select zeroblob({ANSWER})", [], "all", tx)
                pieces.append(
                    frames.request_frame(10 + i, "sql.exec" if isinstance(req, Exec) else "sql.query", encode(req))
                )
            raw.send(b"".join(pieces))  # then it reads nothing
            most = 0
            for _ in range(100):
                await asyncio.sleep(0.02)
                waiting = len(conn.waiting) + len(getattr(conn, "tx_waiting", ()))
                made = CALLS - waiting
                most = max(most, made)
            # answers made: those the transport took before it said "stop" (a few MB), and at most READS_MAX more
            assert most <= 24 + READS_MAX, f"{most} of {CALLS} big answers made for a connection that does not read"
            assert conn.paused
            # another client is served meanwhile
            assert await db.scalar("select count(*) from t") == 0 or call.endswith("returning")
        finally:
            await raw.close()
        await asyncio.sleep(0.1)
        assert await db.scalar("select 1") == 1


# contract: STORE-04
async def test_a_connection_that_ends_in_the_middle_of_a_frame_leaves_nothing_of_it(tmp_path: Path) -> None:
    # from trial AO: each ended connection's part of a frame (up to 16 MiB) stayed until a full garbage collection
    async with open_store("embedded", tmp_path / "s") as store:
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            frame = frames.request_frame(1, "sql.query", b"\x00" * (8 << 20))
            raw.send(frame[:-1024])
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(conn.conn._buf) > 4 << 20:
                    break
            assert len(conn.conn._buf) > 4 << 20, "the server did not get the part of the frame"
        finally:
            await raw.close()
        for _ in range(200):
            if conn.closing:
                break
            await asyncio.sleep(0.01)
        assert conn.closing and len(conn.conn._buf) == 0


# contract: STORE-04
async def test_a_transactions_commit_waits_behind_its_reads_that_wait(tmp_path: Path) -> None:
    # the reads of a transaction wait while the client does not read; its commit, sent after them, waits too
    # (run at once, it ended the transaction under its own reads)
    async with open_store("embedded", tmp_path / "s") as store:
        await store.database("x")
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            raw.send(frames.request_frame(1, "sql.open", encode(OpenDb(db="x"))))
            await answer(raw, 1)
            raw.send(frames.request_frame(2, "sql.begin", encode(Begin("x", True))))
            tx = await answer(raw, 2)
            reads = [
                frames.request_frame(
                    10 + i, "sql.query", encode(Query("x", f"select zeroblob({ANSWER})", [], "all", tx))
                )
                for i in range(CALLS)
            ]
            raw.send(b"".join(reads) + frames.request_frame(9, "sql.commit", encode(TxRef(tx))))
            await asyncio.sleep(0.3)  # not reading meanwhile
            order = []
            while len(order) < CALLS + 1:
                f = await raw.frame(timeout=20)
                assert isinstance(f, Frame)
                if f.kind is Kind.RESPONSE and f.stream not in order and not (f.flags & frames.MORE):
                    order.append(f.stream)
                assert f.kind is not Kind.ERROR, decode(f.body)
            assert order[-1] == 9 and sorted(order[:-1]) == list(range(10, 10 + CALLS))
        finally:
            await raw.close()
