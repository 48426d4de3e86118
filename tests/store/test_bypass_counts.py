"""The way past a connection's full execs' line (see ``server.listener``): execs that wait for another
connection's transaction take at most half of it, whether that transaction holds the writer already or waits for
it, and an exec refused at the head of the line does not keep the ones behind it from going (trial BF)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import tinystore
from tinystore.client.transport import TX_EXTRA, parking_cap
from tinystore.protocol import frames
from tinystore.server.listener import BYPASS_HELD_MAX, EXECS_MAX

from .full_line import behind_full_line, hold_busy

SLOW = (
    "insert into t (a) select x from (with recursive c(x) as (select 1 union all select x + 1 from c "
    "where x < 1500000) select x from c)"
)


async def _setup(
    tmp_path: Path, names: tuple[str, ...]
) -> tuple[tinystore.Store, tinystore.Store, dict[str, tinystore.Database], dict[str, tinystore.Database]]:
    owner = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(tx_idle=2.0, tx_max=60.0))
    odb = {n: await owner.database(n) for n in names}
    for x in odb.values():
        await x.exec("create table t (id integer primary key, a int)")
    client = await tinystore.open(tmp_path / "s")
    cdb = {n: await client.database(n) for n in names}
    return owner, client, odb, cdb


async def _stuck_transaction(
    odb: dict[str, tinystore.Database], cdb: dict[str, tinystore.Database], go_on: asyncio.Event, took: list[float]
) -> tuple[asyncio.Future[int], list[asyncio.Future[Any]]]:
    """Our client's transaction on app, with its connection's execs' line full of execs waiting for it; once
    ``go_on`` is set, its own exec on ``third`` (a free database), timed in ``took``."""
    in_tx = asyncio.Event()

    async def fn(tx: tinystore.SqlTx) -> int:
        await tx.exec("insert into t (a) values (1)")
        in_tx.set()
        await go_on.wait()
        t0 = time.monotonic()
        done = await cdb["third"].exec("insert into t (a) values (7) returning id")
        took.append(time.monotonic() - t0)
        return len(done.rows)

    ours, returning = await behind_full_line(odb["app"], cdb["app"], fn)
    await in_tx.wait()
    return ours, returning


async def _hold(db: tinystore.Database, seconds: float, held: asyncio.Event) -> None:
    async def body(tx: tinystore.SqlTx) -> None:  # calling all along: never idle
        held.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await tx.exec("insert into t (a) values (0)")
            await asyncio.sleep(0.3)

    await db.tx(body)


# contract: SQL-03
async def test_execs_behind_a_transaction_waiting_for_the_writer_are_counted(tmp_path: Path) -> None:
    owner, client, odb, cdb = await _setup(tmp_path, ("app", "other", "third"))
    try:
        go_on = asyncio.Event()
        took: list[float] = []
        ours, returning = await _stuck_transaction(odb, cdb, go_on, took)
        slow = asyncio.ensure_future(odb["other"].exec(SLOW))  # the writer busy; a transaction waits behind it
        held = asyncio.Event()
        holder = asyncio.ensure_future(_hold(odb["other"], 3.0, held))
        await asyncio.sleep(0.05)
        execs = [
            asyncio.ensure_future(cdb["other"].exec("insert into t (a) values (?) returning id", 500 + i))
            for i in range(8)
        ]
        await asyncio.sleep(0.1)
        conn: Any = next(c for lst in owner._core.listeners for c in lst.connections)
        assert len(conn.bypass_held) <= BYPASS_HELD_MAX
        go_on.set()
        assert await asyncio.wait_for(ours, 20) == 1
        assert took[0] < 1.5, took
        await asyncio.gather(slow, holder, *execs, *returning)
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_an_exec_refused_at_the_head_of_the_line_does_not_hold_the_ones_behind_it(tmp_path: Path) -> None:
    owner, client, odb, cdb = await _setup(tmp_path, ("app", "other", "slowdb", "third"))
    try:
        go_on = asyncio.Event()
        took: list[float] = []
        ours, returning = await _stuck_transaction(odb, cdb, go_on, took)
        held = asyncio.Event()
        holder = asyncio.ensure_future(_hold(odb["other"], 4.0, held))
        await held.wait()
        slow = asyncio.ensure_future(odb["slowdb"].exec(SLOW))  # slowdb's writer busy for a moment
        await asyncio.sleep(0.05)
        execs = [
            asyncio.ensure_future(cdb["other"].exec("insert into t (a) values (?) returning id", i))
            for i in range(BYPASS_HELD_MAX)
        ]  # counted: they wait for the other connection's transaction
        execs += [
            asyncio.ensure_future(cdb["slowdb"].exec("insert into t (a) values (?) returning id", i))
            for i in range(BYPASS_HELD_MAX)
        ]  # behind the slow write: the way past is full
        await asyncio.sleep(0.05)
        execs.append(asyncio.ensure_future(cdb["other"].exec("insert into t (a) values (9) returning id")))
        await asyncio.sleep(0.05)
        go_on.set()  # our transaction's own call comes now, behind the one refused at the head
        assert await asyncio.wait_for(ours, 20) == 1
        await asyncio.gather(slow, holder, *execs, *returning)
    finally:
        await client.close()
        await owner.close()


async def _hold_until(db: tinystore.Database, held: asyncio.Event, release: asyncio.Event) -> None:
    async def body(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (a) values (0)")
        held.set()
        await release.wait()

    await db.tx(body)


async def _returning(db: tinystore.Database, a: int) -> int:
    return int((await db.exec("insert into t (a) values (?) returning id", a)).rows[0][0])


# contract: SQL-03
async def test_an_exec_is_not_let_past_an_earlier_one_of_its_database_waiting_in_the_line(tmp_path: Path) -> None:
    # from trial BH: a later exec on x went past the full line while an earlier one on x waited in it: ran first
    owner = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(tx_idle=10.0, tx_max=60.0))
    client: tinystore.Store | None = None
    try:
        for n in ("app", "x"):
            await (await owner.database(n)).exec("create table t (id integer primary key, a int)")
        client = await tinystore.open(tmp_path / "s")
        capp, cx = await client.database("app"), await client.database("x")
        held, release = asyncio.Event(), asyncio.Event()
        other = asyncio.ensure_future(_hold_until(await owner.database("app"), held, release))
        await held.wait()
        ours_held, ours_release = asyncio.Event(), asyncio.Event()
        ours = asyncio.ensure_future(_hold_until(capp, ours_held, ours_release))
        await asyncio.sleep(0.2)
        fill = [asyncio.ensure_future(_returning(capp, i)) for i in range(EXECS_MAX)]
        await asyncio.sleep(0.2)
        x1 = asyncio.ensure_future(_returning(cx, 1))  # waits in the full line
        await asyncio.sleep(0.2)
        release.set()
        await other
        await asyncio.wait_for(ours_held.wait(), 10)  # the line is stuck behind our transaction now
        x2 = asyncio.ensure_future(_returning(cx, 2))
        await asyncio.sleep(0.3)
        ours_release.set()
        await ours
        await asyncio.gather(*fill)
        assert await x1 < await x2
    finally:
        if client is not None:
            await client.close()
        await owner.close()


# contract: SQL-03
async def test_an_exec_kept_aside_for_a_transaction_does_not_pass_an_earlier_one_of_its_database(
    tmp_path: Path,
) -> None:
    # from trial BH: an exec on z kept aside while the connection's transaction held z went back to the head of
    # the line when it ended, ahead of an earlier exec on z still waiting in the line
    owner = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(tx_idle=10.0, tx_max=60.0))
    client: tinystore.Store | None = None
    try:
        for n in ("y", "z"):
            await (await owner.database(n)).exec("create table t (id integer primary key, a int)")
        client = await tinystore.open(tmp_path / "s")
        cy, cz = await client.database("y"), await client.database("z")
        y_held, y_release = asyncio.Event(), asyncio.Event()
        other = asyncio.ensure_future(_hold_until(await owner.database("y"), y_held, y_release))
        await y_held.wait()
        fill = [asyncio.ensure_future(_returning(cy, i)) for i in range(EXECS_MAX)]  # wait for y's writer
        await asyncio.sleep(0.3)
        z1 = asyncio.ensure_future(_returning(cz, 1))  # waits in the line
        await asyncio.sleep(0.3)
        z_held, z_release = asyncio.Event(), asyncio.Event()
        ours = asyncio.ensure_future(_hold_until(cz, z_held, z_release))
        await asyncio.wait_for(z_held.wait(), 10)
        z2 = asyncio.ensure_future(_returning(cz, 2))
        await asyncio.sleep(0.3)
        z_release.set()
        await ours
        await asyncio.sleep(0.3)
        y_release.set()
        await other
        await asyncio.gather(*fill)
        assert await z1 < await z2
    finally:
        if client is not None:
            await client.close()
        await owner.close()


# contract: SQL-03
async def test_a_transactions_own_write_is_not_held_in_the_sdk_behind_writes_waiting_elsewhere(tmp_path: Path) -> None:
    # from trial BH: with 170 execs of the connection waiting for another connection's transaction, the SDK held
    # the transaction's own exec on a free database behind them (its share of the request credit, 160), until the
    # transaction was rolled back at tx_idle
    owner, client, odb, cdb = await _setup(tmp_path, ("app", "other", "third"))
    try:
        held = asyncio.Event()
        holder = asyncio.ensure_future(_hold(odb["other"], 4.0, held))
        await held.wait()
        waiting = [asyncio.ensure_future(cdb["other"].exec("insert into t (a) values (?)", i)) for i in range(170)]
        await asyncio.sleep(0.3)

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            await cdb["third"].exec("insert into t (a) values (2)")  # the transaction's own call elsewhere
            await tx.exec("insert into t (a) values (3)")

        await asyncio.wait_for(cdb["app"].tx(fn), 20)
        await asyncio.gather(holder, *waiting)
        assert await cdb["app"].scalar("select count(*) from t") == 2
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_writes_a_transactions_fn_spawns_do_not_take_the_credit_its_statements_need(tmp_path: Path) -> None:
    # from trial BI: writes made inside an open transaction went past their share of the request credit without
    # bound; a fn that spawned 1,100 execs waiting elsewhere took all of it, and its own next statement waited
    # until tx_idle
    owner, client, odb, cdb = await _setup(tmp_path, ("app", "other"))
    try:
        held = asyncio.Event()
        holder = asyncio.ensure_future(_hold(odb["other"], 4.0, held))
        await held.wait()
        spawned: list[asyncio.Task[Any]] = []

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            for i in range(1100):
                spawned.append(asyncio.ensure_future(cdb["other"].exec("insert into t (a) values (?)", i)))
            await asyncio.sleep(0.3)
            await tx.exec("insert into t (a) values (2)")  # the transaction's own statement

        await asyncio.wait_for(cdb["app"].tx(fn), 20)
        await holder
        await asyncio.gather(*spawned)
        assert await cdb["app"].scalar("select count(*) from t") == 2
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_an_exec_behind_one_of_its_database_that_came_before_the_line_was_stuck_goes(tmp_path: Path) -> None:
    # from trial BI: an exec on third waited in the full line before it was stuck behind our transaction; our
    # transaction's own exec on third went behind it (their order kept), and nothing looked at the line again
    owner, client, odb, cdb = await _setup(tmp_path, ("app", "third"))
    try:
        held, release = asyncio.Event(), asyncio.Event()
        other = asyncio.ensure_future(_hold_until(odb["app"], held, release))
        await held.wait()
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t (a) values (1)")
            t0 = time.monotonic()
            got = await _returning(cdb["third"], 2)
            took.append(time.monotonic() - t0)
            return got

        ours = asyncio.ensure_future(cdb["app"].tx(fn))  # its begin waits for app's writer
        await asyncio.sleep(0.2)
        fill = [asyncio.ensure_future(_returning(cdb["app"], 100 + i)) for i in range(EXECS_MAX + 4)]
        await asyncio.sleep(0.2)
        first = asyncio.ensure_future(_returning(cdb["third"], 1))  # waits in the full line, not stuck yet
        await asyncio.sleep(0.2)
        release.set()
        await other
        second = await asyncio.wait_for(ours, 20)
        assert await first < second
        await asyncio.gather(*fill)
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_other_transactions_writes_do_not_take_a_transactions_own_room_past_the_share(tmp_path: Path) -> None:
    # from trial BJ: with one allowance past the share for all transactions, 8 other transactions' fns, each
    # awaiting a write that waits for our transaction, took it: our fn's own write elsewhere waited until tx_idle

    names = ("app", "third", *(f"d{k}" for k in range(TX_EXTRA)))
    owner, client, _odb, cdb = await _setup(tmp_path, names)
    tasks: list[asyncio.Future[Any]] = []
    try:
        holding, go = asyncio.Event(), asyncio.Event()

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")  # holds app's writer
            holding.set()
            await go.wait()
            await cdb["third"].exec("insert into t (a) values (7)")  # its own write elsewhere
            await tx.exec("insert into t (a) values (2)")

        async def other_fn(tx: tinystore.SqlTx) -> None:  # waits for ours: it writes to app
            await tx.exec("insert into t (a) values (1)")
            await cdb["app"].exec("insert into t (a) values (3)")

        ours = asyncio.ensure_future(cdb["app"].tx(fn))
        await holding.wait()
        for i in range(parking_cap(frames.DEFAULT_MAX_INFLIGHT)):  # app writes: the method's whole share
            tasks.append(asyncio.ensure_future(cdb["app"].exec("insert into t (a) values (?)", 100 + i)))
        await asyncio.sleep(0.3)
        tasks += [asyncio.ensure_future(cdb[f"d{k}"].tx(other_fn)) for k in range(TX_EXTRA)]
        await asyncio.sleep(0.3)
        go.set()
        await asyncio.wait_for(ours, 20)
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_a_transactions_exec_elsewhere_goes_past_a_line_waiting_for_another_connections_transaction(
    tmp_path: Path,
) -> None:
    # from trial BK: the connection's execs' line full of execs waiting for ANOTHER connection's (long, busy)
    # transaction; the transaction's fn's exec on a free database waited behind them until tx_idle rolled the
    # transaction back (the way past was only for a line waiting for this connection's own transaction)
    owner, client, odb, cdb = await _setup(tmp_path, ("x", "app", "other"))
    try:
        held, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(hold_busy(odb["x"], held, release, 0.2))
        await held.wait()
        fill = [asyncio.ensure_future(_returning(cdb["x"], i)) for i in range(EXECS_MAX + 8)]
        await asyncio.sleep(0.3)
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            t0 = time.monotonic()
            await _returning(cdb["other"], 2)
            took.append(time.monotonic() - t0)
            await tx.exec("insert into t (a) values (3)")

        try:
            await asyncio.wait_for(cdb["app"].tx(fn), 20)
        finally:
            release.set()
        assert took[0] < 1.0, took
        await holder
        await asyncio.gather(*fill)
        assert await odb["app"].scalar("select count(*) from t") == 2
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_a_transactions_fn_writes_past_its_allowance_go_as_its_earlier_ones_are_answered(tmp_path: Path) -> None:
    # from trial BK: with the method's share taken by writes waiting for the transaction itself, fn's writes past
    # its allowance (TX_EXTRA) waited for a general turn, which only those writes' end gives back: until tx_idle
    owner, client, _odb, cdb = await _setup(tmp_path, ("app", "other"))
    try:
        in_tx, go = asyncio.Event(), asyncio.Event()
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            in_tx.set()
            await go.wait()
            t0 = time.monotonic()
            await asyncio.gather(*(cdb["other"].exec("insert into t (a) values (?)", i) for i in range(TX_EXTRA + 2)))
            took.append(time.monotonic() - t0)

        ours = asyncio.ensure_future(cdb["app"].tx(fn))
        await in_tx.wait()
        cap = parking_cap(frames.DEFAULT_MAX_INFLIGHT)
        outside = [
            asyncio.ensure_future(cdb["app"].exec("insert into t (a) values (?)", 100 + i)) for i in range(cap + 10)
        ]  # they wait for our transaction's writer, and take the method's whole share
        await asyncio.sleep(0.3)
        go.set()
        await asyncio.wait_for(ours, 20)
        assert took[0] < 1.0, took
        await asyncio.gather(*outside)
        assert await cdb["other"].scalar("select count(*) from t") == TX_EXTRA + 2
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_execs_waiting_for_a_writer_busy_with_a_long_statement_leave_room_past_the_line(tmp_path: Path) -> None:
    # from trial BP: execs on x, whose writer a long statement (no transaction) kept busy, took all 8 places past
    # the full line; the transaction's own exec on a free database waited behind them until tx_idle
    owner, client, odb, cdb = await _setup(tmp_path, ("x", "y", "z"))
    try:
        slow = asyncio.ensure_future(odb["x"].exec(SLOW.replace("1500000", "10000000")))  # x's writer busy, seconds
        await asyncio.sleep(0.1)
        spawned: list[asyncio.Future[int]] = []
        took: list[float] = []

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (1)")
            spawned.extend(asyncio.ensure_future(_returning(cdb["x"], i)) for i in range(EXECS_MAX + 16))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await _returning(cdb["z"], 2)  # a free database
            took.append(time.monotonic() - t0)
            await tx.exec("insert into t (a) values (3)")

        await asyncio.wait_for(cdb["y"].tx(fn), 20)
        assert took[0] < 1.0, took
        await slow
        await asyncio.gather(*spawned)
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_an_exec_without_rows_waits_behind_an_earlier_one_of_its_database_in_the_line(tmp_path: Path) -> None:
    # from trial BR: with the line full, A (insert … returning) waited in it; B (a plain insert on the same database,
    # sent after A) was in no line, ran at once, and committed first
    owner, client, odb, cdb = await _setup(tmp_path, ("x",))
    try:
        held, release = asyncio.Event(), asyncio.Event()
        other = asyncio.ensure_future(_hold_until(odb["x"], held, release))
        await held.wait()
        fill = [asyncio.ensure_future(_returning(cdb["x"], i)) for i in range(EXECS_MAX)]
        a = asyncio.ensure_future(cdb["x"].exec("insert into t (a) values (-1) returning id"))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(cdb["x"].exec("insert into t (a) values (-2)"))
        await asyncio.sleep(0.3)
        release.set()
        await other
        await asyncio.gather(*fill, a, b)
        rows = await cdb["x"].all("select a from t where a < 0 order by id")
        assert [r["a"] for r in rows] == [-1, -2]
    finally:
        await client.close()
        await owner.close()


# contract: SQL-03
async def test_an_exec_kept_aside_for_a_transaction_goes_back_behind_an_earlier_one_of_its_database(
    tmp_path: Path,
) -> None:
    # from trial BS: E1 (insert … returning on y) waited in the full line; the client then began a transaction on
    # y, and E2 (a plain insert on y, sent after E1) was kept aside for it. As the transaction ended, E2 went back
    # to the head of the line, ahead of E1, and committed first
    owner, client, odb, cdb = await _setup(tmp_path, ("x", "y"))
    try:
        held, release = asyncio.Event(), asyncio.Event()
        other = asyncio.ensure_future(_hold_until(odb["x"], held, release))
        await held.wait()
        fill = [asyncio.ensure_future(_returning(cdb["x"], i)) for i in range(EXECS_MAX)]
        await asyncio.sleep(0.2)
        e1 = asyncio.ensure_future(cdb["y"].exec("insert into t (a) values (-1) returning id"))
        await asyncio.sleep(0.2)
        in_fn, go = asyncio.Event(), asyncio.Event()

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values (-3)")
            in_fn.set()
            await go.wait()

        ours = asyncio.ensure_future(cdb["y"].tx(fn))
        await in_fn.wait()
        e2 = asyncio.ensure_future(cdb["y"].exec("insert into t (a) values (-2)"))
        await asyncio.sleep(0.2)
        go.set()
        await ours
        await asyncio.sleep(0.2)
        release.set()
        await other
        await asyncio.gather(*fill, e1, e2)
        rows = await cdb["y"].all("select a from t order by id")
        assert [r["a"] for r in rows if r["a"] in (-1, -2)] == [-1, -2]
    finally:
        await client.close()
        await owner.close()
