"""A connection that sends many calls whose answers are big and reads none of them makes the server hold a bounded
number of those answers (STORE-04), whatever the call: a read, an ``exec`` whose statement answers with rows (a
SELECT, a RETURNING), or a transaction's call. From trial AO: an exec's or a transaction's answers were all made,
1,024 of 8 MB, and the server grew past 4 GB."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.protocol import frames
from tinystore.protocol.frames import Frame, Kind
from tinystore.protocol.messages import decode, encode
from tinystore.protocol.sql import Begin, Exec, OpenDb, Query, TxRef
from tinystore.server import paths
from tinystore.server.listener import EXECS_MAX, READS_MAX

from ..helpers import open_store
from .full_line import behind_full_line, hold_busy
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
            calls = 4 * EXECS_MAX if call.startswith("exec") else CALLS
            for i in range(calls):
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
                waiting = sum(len(line.waiting) for line in conn.lines)
                made = calls - waiting
                most = max(most, made)
            # answers made: those the transport took before it said "stop" (a few MB), and at most two lines' more
            # (those under way then, and those begun as the answers of one commit, made together, were written)
            line = EXECS_MAX if call.startswith("exec") else READS_MAX
            assert most <= 24 + 2 * line, f"{most} of {calls} big answers made for a connection that does not read"
            assert conn.paused
            # another client is served meanwhile
            assert await db.scalar("select count(*) from t") == 0 or call.endswith("returning")
        finally:
            await raw.close()
        await asyncio.sleep(0.1)
        assert await db.scalar("select 1") == 1


# contract: SQL-01
async def test_a_transaction_whose_client_does_not_read_is_still_rolled_back_at_tx_idle(tmp_path: Path) -> None:
    # a transaction's calls waiting because its client reads none of its answers do not keep it from being idle
    # (only those waiting behind other calls do): it is rolled back at tx_idle, not left holding the writer
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(tx_idle=0.5, tx_max=60)) as store:
        db = await store.database("x", migrations=[("001.sql", "create table t (v);")])
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            raw.send(frames.request_frame(1, "sql.open", encode(OpenDb(db="x"))))
            await answer(raw, 1)
            raw.send(frames.request_frame(2, "sql.begin", encode(Begin("x", False))))
            tx = await answer(raw, 2)
            pieces = [
                frames.request_frame(
                    10 + i, "sql.query", encode(Query("x", f"select zeroblob({ANSWER})", [], "all", tx))
                )
                for i in range(CALLS)
            ]
            raw.send(b"".join(pieces))  # then it reads nothing
            for _ in range(200):
                await asyncio.sleep(0.02)
                if conn.paused and conn.txs.waiting:
                    break
            assert conn.paused and conn.txs.waiting
            started = time.monotonic()
            await asyncio.wait_for(db.exec("insert into t values (1)"), 10)  # the writer is given back
            assert time.monotonic() - started < 5
        finally:
            await raw.close()


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
            order: list[int] = []
            while len(order) < CALLS + 1:
                f = await raw.frame(timeout=20)
                assert isinstance(f, Frame)
                if f.kind is Kind.RESPONSE and f.stream not in order and not (f.flags & frames.MORE):
                    order.append(f.stream)
                assert f.kind is not Kind.ERROR, decode(f.body)
            assert order[-1] == 9 and sorted(order[:-1]) == list(range(10, 10 + CALLS))
        finally:
            await raw.close()


# contract: SQL-03
@pytest.mark.parametrize("mode", ["private", "embedded"])
async def test_a_read_never_waits_behind_writes_with_rows_waiting_for_the_writer(tmp_path: Path, mode: str) -> None:
    # from trial AP: 8 execs with RETURNING waiting for the writer (held by this connection's transaction) took every
    # place of the reads' line: the transaction's read outside it waited until tx_idle rolled the transaction back
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, a int)")
        entered = asyncio.Event()
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t (a) values (1)")
            entered.set()
            await asyncio.sleep(0.3)  # the others wait for the writer meanwhile
            t0 = time.monotonic()
            n = await db.scalar("select count(*) from t")  # a read outside the transaction, same connection
            took.append(time.monotonic() - t0)
            await tx.exec("insert into t (a) values (2)")
            return int(n)

        async def returning(i: int) -> Any:
            await entered.wait()
            return (await db.exec("insert into t (a) values (?) returning id", 100 + i)).rows

        got = await asyncio.gather(db.tx(fn), *(returning(i) for i in range(20)))
        assert got[0] == 0 and took[0] < 2.0, took
        assert await db.scalar("select count(*) from t") == 22


# contract: SQL-01
async def test_pipelined_calls_of_one_transaction_run_in_the_order_they_were_sent(tmp_path: Path) -> None:
    # from trial AP: once 8 calls with rows were under way, the later ones waited and plain execs sent after them
    # ran first: a count saw inserts sent after it
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, a int)")

        async def fn(tx: tinystore.SqlTx) -> list[Any]:
            calls: list[Any] = []
            for i in range(50):
                calls.append(tx.scalar("select count(*) from t"))
                calls.append(tx.exec("insert into t (a) values (?)", i))
                calls.append(tx.exec("insert into t (a) values (?) returning id", i))
            return list(await asyncio.gather(*calls))

        got = await db.tx(fn)
        assert got[0::3] == [2 * i for i in range(50)]


async def app_and_audit(store: tinystore.Store) -> tuple[tinystore.Database, tinystore.Database]:
    """Two databases with a table each: ``app`` (t) and ``audit`` (log)."""
    db = await store.database("app")
    audit = await store.database("audit")
    await db.exec("create table t (id integer primary key, a int)")
    await audit.exec("create table log (id integer primary key, what text)")
    return db, audit


async def timed_audit(audit: tinystore.Database, took: list[float]) -> int:
    """An exec with rows on ``audit``; its time is added to ``took``; returns the id it inserted."""
    t0 = time.monotonic()
    done = await audit.exec("insert into log (what) values ('a') returning id")
    took.append(time.monotonic() - t0)
    return int(done.rows[0][0])


# contract: SQL-03
@pytest.mark.parametrize("mode", ["private", "tcp"])
async def test_a_transactions_exec_with_rows_on_another_database_never_waits_behind_writes_to_its_own(
    tmp_path: Path, mode: str
) -> None:
    # from trial AR: 40 execs with RETURNING on app, sent while this connection's transaction held app's writer,
    # took every place of the execs' line; the transaction's own audit exec on another database waited behind
    # them until tx_idle rolled the transaction back
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(tx_idle=2.0)) as store:
        db, audit = await app_and_audit(store)
        entered = asyncio.Event()
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t (a) values (1)")
            entered.set()
            await asyncio.sleep(0.3)  # the others are sent meanwhile, and wait for app's writer
            return await timed_audit(audit, took)

        async def returning(i: int) -> Any:
            await entered.wait()
            return (await db.exec("insert into t (a) values (?) returning id", 100 + i)).rows

        got = await asyncio.gather(db.tx(fn), *(returning(i) for i in range(2 * EXECS_MAX)))
        assert got[0] == 1 and took[0] < 1.0, took
        assert all(len(rows) == 1 for rows in got[1:])
        assert await db.scalar("select count(*) from t") == 1 + 2 * EXECS_MAX


# contract: SQL-03
async def test_a_later_transactions_exec_elsewhere_is_let_past_execs_set_aside_before_it(tmp_path: Path) -> None:
    # from trial AW: execs with RETURNING kept aside while transaction T1 held app's writer went back to their line
    # when T1 ended; T2 of the same connection, begun meanwhile, then held the writer, and they took every place
    # of the line waiting for it: T2's own exec on another database waited behind them until tx_idle
    async with open_store("private", tmp_path / "s", limits=tinystore.Limits(tx_idle=2.0)) as store:
        db, audit = await app_and_audit(store)
        entered = asyncio.Event()
        took: list[float] = []

        async def first(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            entered.set()
            await asyncio.sleep(0.5)  # T2's begin and the execs are sent meanwhile

        async def then(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t (a) values (2)")
            return await timed_audit(audit, took)

        async def second() -> int:
            await entered.wait()
            return await db.tx(then)

        async def returning(i: int) -> Any:
            await entered.wait()
            await asyncio.sleep(0.05)
            return (await db.exec("insert into t (a) values (?) returning id", 100 + i)).rows

        got = await asyncio.gather(db.tx(first), second(), *(returning(i) for i in range(2 * EXECS_MAX)))
        assert got[1] == 1 and took[0] < 1.0, took
        assert await db.scalar("select count(*) from t") == 2 + 2 * EXECS_MAX


# contract: SQL-01
@pytest.mark.parametrize("mode", ["private", "tcp"])
async def test_a_transaction_whose_call_waits_behind_slow_calls_is_not_idle(tmp_path: Path, mode: str) -> None:
    # from trial AR: the transactions' line held a transaction's next call behind another transaction's slow
    # reads, and its tx_idle ran out meanwhile: rolled back, "stayed idle", though its client was never idle
    slow = "with recursive c(x) as (select 1 union all select x + 1 from c where x < ?) select count(*) from c"
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(tx_idle=0.2)) as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, a int)")
        begun = asyncio.Event()
        reads_sent = asyncio.Event()

        async def reader(tx: tinystore.SqlTx) -> list[Any]:
            await begun.wait()
            # READS_MAX calls of one transaction under way: the first slow, the rest behind it on its thread
            calls = [tx.scalar(slow, 4_000_000)] + [tx.scalar("select 1") for _ in range(READS_MAX - 1)]
            sent = asyncio.gather(*calls)
            await asyncio.sleep(0)  # (the calls are written in this loop turn)
            reads_sent.set()
            return list(await sent)

        timing: list[float] = []

        async def writer(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            begun.set()
            await reads_sent.wait()
            t0 = time.monotonic()
            assert await tx.scalar("select count(*) from t") == 1  # waits in the line behind the reads
            timing.append(time.monotonic() - t0)

        got = await asyncio.gather(db.tx(reader, read_only=True), db.tx(writer))
        assert got[0][0] == 4_000_000
        assert await db.scalar("select count(*) from t") == 1


# contract: SQL-03
async def test_an_exec_with_rows_is_not_starved_by_its_connections_transactions(tmp_path: Path) -> None:
    # from trial AY: execs with rows were kept aside while a transaction of the same connection began on their
    # database; with two tasks running transactions back to back one always began, and an exec waited 7.5 s
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, a int)")
        stop = asyncio.Event()

        async def loop() -> int:
            n = 0
            while not stop.is_set():
                await db.tx(lambda tx: tx.exec("insert into t (a) values (1)"))
                n += 1
            return n

        loops = [asyncio.ensure_future(loop()) for _ in range(2)]
        try:
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            done = await asyncio.wait_for(db.exec("insert into t (a) values (2) returning id"), 10)
            took = time.monotonic() - t0
        finally:
            stop.set()
            counts = await asyncio.gather(*loops)
        assert len(done.rows) == 1 and took < 1.0, (took, counts)


# contract: SQL-03
async def test_execs_waiting_for_another_connections_transaction_do_not_take_the_way_past_the_line(
    tmp_path: Path,
) -> None:
    # from trial BA: execs with rows on a database whose writer ANOTHER connection's transaction held took every
    # place of the way past the execs' line (kept for a transaction's own calls when the line is full of execs
    # waiting for it): the transaction's own exec on a third database waited behind them until tx_idle
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(tx_idle=2.0)) as owner:
        app = await owner.database("app")
        audit = await owner.database("audit")
        other_db = await owner.database("other")
        await app.exec("create table t (id integer primary key, a int)")
        await audit.exec("create table log (id integer primary key, what text)")
        await other_db.exec("create table t (id integer primary key, a int)")
        client = await tinystore.open(tmp_path / "s")
        try:
            db = await client.database("app")
            audit_c = await client.database("audit")
            other_c = await client.database("other")
            release = asyncio.Event()
            held = asyncio.Event()
            holder = asyncio.ensure_future(hold_busy(other_db, held, release, 0.2))  # another connection's transaction
            await held.wait()
            took: list[float] = []
            waiting_others: list[asyncio.Future[Any]] = []

            async def fn(tx: tinystore.SqlTx) -> int:
                await tx.exec("insert into t (a) values (1)")
                for i in range(READS_MAX):  # execs on ``other``: they wait for the other connection's transaction
                    waiting_others.append(
                        asyncio.ensure_future(other_c.exec("insert into t (a) values (?) returning id", i))
                    )
                await asyncio.sleep(0.3)
                return await timed_audit(audit_c, took)

            ours, returning = await behind_full_line(app, db, fn)
            got = await asyncio.wait_for(ours, 20)
            release.set()
            await holder
            await asyncio.gather(*returning, *waiting_others)
            assert got == 1 and took[0] < 1.0, took
            assert await db.scalar("select count(*) from t") == 2 + EXECS_MAX + 8
            assert await other_c.scalar("select count(*) from t where a < ?", READS_MAX) >= READS_MAX
        finally:
            release.set()
            await client.close()


# contract: SQL-03
async def test_a_transactions_exec_waiting_for_another_connections_writer_goes_once_that_ends(
    tmp_path: Path,
) -> None:
    # from trial BD: the transaction's own exec, on a database whose writer another connection's transaction held
    # for a moment, was not let past the execs' line full of execs waiting for its own writer, and nothing let it
    # go when that other transaction ended: it waited until tx_idle rolled its transaction back
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(tx_idle=2.0)) as owner:
        app = await owner.database("app")
        other_db = await owner.database("other")
        await app.exec("create table t (id integer primary key, a int)")
        await other_db.exec("create table t (id integer primary key, a int)")
        client = await tinystore.open(tmp_path / "s")
        try:
            db = await client.database("app")
            other_c = await client.database("other")
            release = asyncio.Event()
            held = asyncio.Event()
            holder = asyncio.ensure_future(hold_busy(other_db, held, release, 0.1))  # another connection's transaction
            await held.wait()

            async def fn(tx: tinystore.SqlTx) -> int:
                await tx.exec("insert into t (a) values (1)")
                asyncio.get_running_loop().call_later(0.5, release.set)  # the other transaction ends soon
                done = await other_c.exec("insert into t (a) values (7) returning id")
                return len(done.rows)

            ours, returning = await behind_full_line(app, db, fn)
            assert await asyncio.wait_for(ours, 20) == 1
            await holder
            await asyncio.gather(*returning)
            assert await db.scalar("select count(*) from t") == 2 + EXECS_MAX + 8
        finally:
            release.set()
            await client.close()


# contract: SQL-03
async def test_a_transactions_exec_is_not_starved_by_another_clients_transactions_back_to_back(
    tmp_path: Path,
) -> None:
    # from trial BE: with another client running transactions on ``other`` back to back (one always waiting to
    # begin), the transaction's own exec there was refused the way past its line at each end, until tx_idle
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(tx_idle=2.0)) as owner:
        app = await owner.database("app")
        other_db = await owner.database("other")
        await app.exec("create table t (id integer primary key, a int)")
        await other_db.exec("create table t (id integer primary key, a int)")
        client = await tinystore.open(tmp_path / "s")
        stop = asyncio.Event()

        async def busy() -> None:
            while not stop.is_set():
                await other_db.tx(lambda tx: tx.exec("insert into t (a) values (0)"))

        loops = [asyncio.ensure_future(busy()) for _ in range(2)]
        try:
            db = await client.database("app")
            other_c = await client.database("other")

            async def fn(tx: tinystore.SqlTx) -> int:
                await tx.exec("insert into t (a) values (1)")
                done = await other_c.exec("insert into t (a) values (7) returning id")
                return len(done.rows)

            ours, returning = await behind_full_line(app, db, fn)
            assert await asyncio.wait_for(ours, 20) == 1
            await asyncio.gather(*returning)
        finally:
            stop.set()
            await asyncio.gather(*loops, return_exceptions=True)
            await client.close()
