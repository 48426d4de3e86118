"""STORE-06: the SDK reconnects by itself; reads are retried; a write whose answer was lost raises
OutcomeUnknownError and is never sent twice."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.errors import OutcomeUnknownError, TinystoreError

from ..helpers import ServerProcess, drop_connection, stop_sidecar, write_tokens

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]
SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 300000) select count(*) from c"


async def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def cut_right_after_sending(store: tinystore.Store, method: str) -> None:
    """Make the next ``method`` call cut the connection once its request is written, before any answer can
    arrive: the call is started, runs up to its wait for the answer (one turn of the loop: the request is
    on the wire), and the connection is then aborted as a network fault would."""
    transport = store.transport
    original = transport.call

    async def call(m: str, *args: Any, **kw: Any) -> Any:
        if m != method:
            return await original(m, *args, **kw)
        transport.call = original  # type: ignore[method-assign]
        inner = asyncio.ensure_future(original(m, *args, **kw))
        await asyncio.sleep(0)  # the inner call queues its request and waits for the answer
        await asyncio.sleep(0)  # the queued writes of that loop turn go out
        assert not inner.done()
        conn = transport._conn  # type: ignore[attr-defined]
        assert conn is not None and len(conn.pending) == 1, "the request was not in flight"
        assert not conn.unsent, "the request was not written yet"
        drop_connection(store)
        return await inner

    transport.call = call  # type: ignore[method-assign]


async def count(db: Any, a: str) -> int:
    n: int = await db.scalar("select count(*) from t where a = ?", a)
    return n


# contract: STORE-06
async def test_reads_are_retried_across_drops(remote_store: tinystore.Store) -> None:
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)
    await db.exec("insert into t (a) values ('x')")
    before = store.transport.reconnects  # type: ignore[attr-defined]
    for _ in range(3):
        drop_connection(store)
        assert await db.scalar("select count(*) from t") == 1
        assert (await store.status())["pid"] > 0
    # a read in flight when the connection drops is sent again and answers
    cut_right_after_sending(store, "sql.query")
    assert await db.scalar(SLOW) == 300000
    assert store.transport.reconnects >= before + 4  # type: ignore[attr-defined]
    # writes work again after the drops
    await db.exec("insert into t (a) values ('y')")
    assert await db.scalar("select count(*) from t") == 2


# contract: STORE-06
async def test_a_write_cut_in_flight_is_outcome_unknown_and_never_sent_twice(remote_store: tinystore.Store) -> None:
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)
    for i in range(3):
        cut_right_after_sending(store, "sql.exec")
        with pytest.raises(OutcomeUnknownError) as info:
            await db.exec("insert into t (a) values (?)", f"cut {i}")
        # it names what it is about (trial ES: "sql.exec: the connection dropped ...", no database)
        assert info.value.message.startswith("sql.exec: database app: the connection dropped"), info.value.message
        # the request reached the server before the cut: it commits there, once; nothing sends it again
        await wait_for_count(db, f"cut {i}", 1)
        await asyncio.sleep(0.2)
        assert await count(db, f"cut {i}") == 1
    assert await db.scalar("select count(*) from t") == 3


# contract: STORE-06
async def test_a_lost_answer_names_the_channel_queue_or_lock_it_is_about(remote_store: tinystore.Store) -> None:
    # (trial ES: each OutcomeUnknownError said only its method, "channels.publish: ...", "jobs.add: ...")
    store = remote_store
    calls: list[tuple[str, Callable[[], Awaitable[Any]], str]] = [
        ("channels.publish", lambda: store.channel("news").under("7").publish("x"), "channel news: branch ['7']"),
        ("jobs.add", lambda: store.queue("mail", dict).add({"to": "a"}), "queue mail"),
    ]
    await store.queue("mail", dict).list(limit=1)  # (opened before the cut)
    for method, call, about in calls:
        cut_right_after_sending(store, method)
        with pytest.raises(OutcomeUnknownError) as info:
            await call()
        assert info.value.message.startswith(f"{method}: {about}: the connection dropped"), info.value.message


async def wait_for_count(db: Any, a: str, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := await count(db, a)) != n:
        assert got < n, f"{a!r} applied {got} times"
        assert time.monotonic() < deadline, f"{a!r}: {got} rows, wanted {n}"
        await asyncio.sleep(0.02)


# contract: STORE-06
async def test_a_write_right_after_a_drop_goes_out_once_on_the_next_connection(
    remote_store: tinystore.Store,
) -> None:
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)
    for i in range(3):
        # the connection is aborted but asyncio has not told the SDK yet: the write must not be written
        # into the dying connection (it would be lost unsent, yet reported as outcome unknown)
        drop_connection(store)
        done = await db.exec("insert into t (a) values (?)", f"after drop {i}")
        assert done.changes == 1
        assert await count(db, f"after drop {i}") == 1


# contract: STORE-06
async def test_a_commit_cut_in_flight_is_outcome_unknown(remote_store: tinystore.Store) -> None:
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (a) values ('in tx')")

    cut_right_after_sending(store, "sql.commit")
    with pytest.raises(
        OutcomeUnknownError, match=r"^database app: sql\.commit: transaction \d+: the connection dropped"
    ):
        await db.tx(fn)
    # it committed or it did not, once at most; the writer is free again either way
    await asyncio.sleep(0.2)
    assert await count(db, "in tx") <= 1
    await asyncio.wait_for(db.exec("insert into t (a) values ('after')"), 10)
    assert await count(db, "after") == 1
    await asyncio.wait_for(db.tx(fn), 10)


# contract: STORE-06
async def test_a_transaction_whose_connection_dropped_is_rolled_back(remote_store: tinystore.Store) -> None:
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (a) values ('lost')")
        drop_connection(store)
        await asyncio.sleep(0.05)
        await tx.exec("insert into t (a) values ('lost too')")

    with pytest.raises(TinystoreError):
        await asyncio.wait_for(db.tx(fn), 10)
    assert await count(db, "lost") == 0
    assert await count(db, "lost too") == 0
    # the writer was let go: a new transaction gets it at once
    await asyncio.wait_for(db.exec("insert into t (a) values ('next')"), 10)


# contract: STORE-06
async def test_a_transaction_used_after_the_sdk_reconnected_says_it_was_rolled_back(
    remote_store: tinystore.Store,
) -> None:
    """The SDK reconnects before the transaction's next call: that call said "transaction N is not open (it
    ended, timed out, or belongs to another client)" from the new session; it says what happened now."""
    store = remote_store
    db = await store.database("app", migrations=MIGRATIONS)
    before = store.transport.reconnects  # type: ignore[attr-defined]

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (a) values ('lost')")
        drop_connection(store)
        async with asyncio.timeout(10):
            while store.transport.reconnects == before:  # type: ignore[attr-defined]
                await asyncio.sleep(0.02)
        await tx.exec("insert into t (a) values ('lost too')")

    with pytest.raises(tinystore.UnavailableError, match="was rolled back with it"):
        await asyncio.wait_for(db.tx(fn), 20)
    assert await count(db, "lost") == 0
    await asyncio.wait_for(db.exec("insert into t (a) values ('next')"), 10)


# -- kill -9 and restart --------------------------------------------------------------------------


@dataclass
class Killable:
    store: tinystore.Store
    kill: Callable[[], None]
    restart: Callable[[], None]
    cleanup: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)


@pytest.fixture(params=["private", "sidecar", "tcp"])
async def killable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Killable]:
    d = tmp_path / "store"
    servers: list[ServerProcess] = []
    if request.param == "tcp":
        tokens, admin, _ = write_tokens(tmp_path)
        first = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
        servers.append(first)
        address = first.tcp
        store = await tinystore.connect(address, token=admin)

        def kill() -> None:
            first.kill(signal.SIGKILL)

        def restart() -> None:
            servers.append(ServerProcess(d, "--listen", address, "--tokens", str(tokens)).start())

    elif request.param == "private":
        store = await tinystore.open(d, private=True)
        child = store._child  # type: ignore[attr-defined]
        assert child is not None

        def kill() -> None:
            child.send_signal(signal.SIGKILL)
            child.wait(10)

        def restart() -> None:
            pass  # the SDK starts its private server again by itself

    else:
        store = await tinystore.open(d, idle="5s")
        pid = (await store.status())["pid"]

        def kill() -> None:
            os.kill(pid, signal.SIGKILL)

        def restart() -> None:
            pass  # the SDK starts a sidecar again by itself

    try:
        yield Killable(store, kill, restart)
    finally:
        await store.close()
        for s in servers:
            s.stop()
        if request.param == "sidecar":
            await stop_sidecar(d)


# contract: STORE-06
async def test_reconnects_by_itself_after_kill_9_and_restart(killable: Killable) -> None:
    store = killable.store
    transport: Any = store.transport
    db = await store.database("app", migrations=MIGRATIONS)
    await db.exec("insert into t (a) values ('before')")
    old_pid = (await store.status())["pid"]
    old_epoch = store.epoch
    # record when the SDK tries to connect, to see its backoff
    attempts: list[float] = []
    endpoint = transport.endpoint

    async def recording_endpoint() -> Any:
        attempts.append(time.monotonic())
        return await endpoint()

    transport.endpoint = recording_endpoint
    killable.kill()
    if store.mode != "sidecar":
        await asyncio.sleep(1.0)  # down for a while: the SDK keeps trying, backing off
        killable.restart()
    # it reconnects by itself, before any call is made
    await wait_for(lambda: transport.reconnects >= 1, 15, "the SDK to reconnect")
    if store.mode != "sidecar":
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert 3 <= len(attempts) <= 12, attempts
        assert gaps[-1] > gaps[0] and max(gaps) > 0.1, gaps  # backing off, not a hot loop
    # later calls work, against the new server
    status = await store.status()
    assert status["pid"] != old_pid
    assert store.epoch > old_epoch
    db = await store.database("app", migrations=MIGRATIONS)
    assert await count(db, "before") == 1
    await db.exec("insert into t (a) values ('after')")
    assert await count(db, "after") == 1


# contract: STORE-06
async def test_a_database_handle_survives_a_restart(killable: Killable) -> None:
    store = killable.store
    db = await store.database("app", migrations=MIGRATIONS)
    await db.exec("insert into t (a) values ('before')")
    killable.kill()
    killable.restart()
    assert await db.scalar("select count(*) from t") == 1


# contract: STORE-06
async def test_a_private_server_started_again_keeps_its_test_clock_where_it_was(tmp_path: Path) -> None:
    """The SDK starts a crashed private server again; with a test clock it started at open()'s ``clock=``, which
    undid every advance: a retry due in 10 s was due in an hour and 10 s."""
    from datetime import UTC, datetime

    start = datetime(2031, 1, 1, tzinfo=UTC)
    store = await tinystore.open(tmp_path / "d", private=True, clock=start)
    try:
        await store.clock.advance("1h")
        before = await store.clock.now()
        assert before >= start.timestamp() + 3600
        child = store._child  # type: ignore[attr-defined]
        assert child is not None
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        after = await store.clock.now()  # (a read: retried once the SDK reached the new server)
        assert before <= after < before + 60, (before, after)
    finally:
        await store.close()
