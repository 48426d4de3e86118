"""Channel contracts (CHAN-01..08) over the embedded, private and sidecar ways of reaching the store, and CHAN-04
(reconnects) over the private, sidecar and TCP ways. Includes the situations of issue 3 and the seed's snippets."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

import msgspec
import pytest

import tinystore
from tinystore import ClosedError, InvalidError, LimitError, Limits, Message, Missed

from ..channels.support import (
    Heard,
    drop,
    eventually,
    publish_all,
    publish_paced,
    second_store,
    subscriptions,
)
from ..helpers import drop_connection, open_store

LOCAL_MODES = ["embedded", "private", "sidecar"]
REMOTE_MODES = ["private", "sidecar", "tcp"]


@pytest.fixture(params=LOCAL_MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """A way of reaching the store that contracts run over (for tests that open with their own limits)."""
    return str(request.param)


@pytest.fixture(params=REMOTE_MODES)
def remote_mode(request: pytest.FixtureRequest) -> str:
    """A way of reaching the store over a connection (CHAN-04)."""
    return str(request.param)


@dataclasses.dataclass
class ChatEvent:
    kind: str
    id: int


class Point(msgspec.Struct):
    x: int
    y: int


class Note(TypedDict):
    text: str
    n: int


# ---------------------------------------------------------------------------- CHAN-01


# contract: CHAN-01
async def test_subscribe_then_hear_everything_after_in_order(store: tinystore.Store) -> None:
    events = store.channel("chat-events", ChatEvent)
    await events.under(7).publish(ChatEvent("message", 0))  # before the subscription: not heard
    heard = Heard()
    active = 0
    overlap: list[int] = []

    async def handler(m: Message[ChatEvent]) -> None:
        nonlocal active
        active += 1
        if active > 1:
            overlap.append(active)
        heard.on_message(m)
        await asyncio.sleep(0)  # give a second call every chance to start
        active -= 1

    sub = await events.under(7).subscribe(handler)
    ids = [await events.under("7").publish(ChatEvent("message", i)) for i in range(1, 51)]
    await eventually(lambda: len(heard.values) == 50)
    assert [v.id for v in heard.values] == list(range(1, 51))
    assert overlap == []  # one message at a time, never two at once
    first = heard.messages[0]
    assert first.branch == ["7"]
    assert [m.seq for m in heard.messages] == list(range(first.seq, first.seq + 50))
    assert [m.id for m in heard.messages] == ids
    epoch = ids[0].split("-")[0]
    assert all(re.fullmatch(rf"{epoch}-\d+", i) for i in ids)
    assert isinstance(first.value, ChatEvent)
    assert sub.statistics()["handled"] == 50
    await sub.stop()
    await sub.stop()  # idempotent
    assert not sub.active
    await events.under(7).publish(ChatEvent("message", 99))
    await asyncio.sleep(0.1)
    assert len(heard.values) == 50  # nothing after stop
    assert await subscriptions(store) == 0


# contract: CHAN-01
async def test_subscribe_returns_once_the_store_has_it(store: tinystore.Store) -> None:
    """A publish from another connection right after subscribe returned is heard."""
    async with second_store(store) as other:
        heard = Heard()
        await store.channel("ticks").subscribe(heard.on_message)
        await other.channel("ticks").publish("right after")
        await eventually(lambda: heard.values == ["right after"])


# contract: CHAN-01
async def test_a_raising_handler_goes_to_on_error_and_the_subscription_goes_on(
    store: tinystore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    ch = store.channel("numbers", int)
    seen: list[int] = []
    errors: list[Exception] = []

    async def handler(m: Message[int]) -> None:
        seen.append(m.value)
        if m.value % 2:
            raise ValueError(f"odd {m.value}")

    sub = await ch.subscribe(handler, on_error=errors.append)
    for i in range(10):
        await ch.publish(i)
    await eventually(lambda: len(seen) == 10)
    assert seen == list(range(10))
    assert [str(e) for e in errors] == [f"odd {i}" for i in range(1, 10, 2)]
    await sub.stop()

    # without on_error: a rate-limited warning in the log, and it goes on
    def sync_handler(m: Message[int]) -> None:
        seen.append(m.value)
        raise RuntimeError("always")

    caplog.set_level(logging.WARNING, logger="tinystore.channels")
    sub2 = await ch.subscribe(sync_handler)
    for i in range(20):
        await ch.publish(100 + i)
    await eventually(lambda: sub2.handled == 20)
    warnings = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(warnings) == 1  # one warning, the rest counted for the next
    assert sub2.statistics()["errors"] == 20
    await sub2.stop()


# ---------------------------------------------------------------------------- CHAN-02


# contract: CHAN-02
async def test_blocked_handler_gets_prefetch_then_exact_missed_then_the_rest(mode: str, tmp_path: Path) -> None:
    """The issue's situation: log bound 100, a handler blocks while 250 messages are published."""
    async with open_store(mode, tmp_path / "store", limits=Limits(channel_log=100)) as store:
        ch = store.channel("feed", int)
        release = asyncio.Event()
        slow = Heard()

        async def blocked(m: Message[int]) -> None:
            slow.on_message(m)
            await release.wait()

        fast = Heard()
        slow_sub = await ch.subscribe(blocked, on_missed=slow.on_missed)
        fast_sub = await ch.subscribe(fast.on_message, on_missed=fast.on_missed)
        latencies: list[float] = []

        async def publish(v: int) -> None:
            t = time.perf_counter()
            await asyncio.wait_for(ch.publish(v), 5)
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0)

        for v in range(1, 65):
            await publish(v)
        # the 64 of the prefetch window reached the SDK while the handler blocks on the first
        await eventually(lambda: slow_sub.statistics()["buffered"] == 63, what="the prefetch to arrive")
        for v in range(65, 251):
            await publish(v)
        assert max(latencies) < 1.0, "a publish waited"
        await eventually(lambda: fast.count == 250)
        assert fast.values == list(range(1, 251)) and fast.notices == []
        assert slow.values == [1]
        release.set()
        await eventually(lambda: slow.count == 250)
        expected = [("m", v) for v in range(1, 65)] + [("missed", "behind", 86)] + [("m", v) for v in range(151, 251)]
        assert slow.shape() == expected
        assert len(slow.values) + slow.missed == 250
        assert slow_sub.statistics()["missed"] == 86
        await slow_sub.stop()
        await fast_sub.stop()


# contract: CHAN-02
async def test_seed_stream_tells_a_tab_that_falls_behind_to_reload(mode: str, tmp_path: Path) -> None:
    """The seed's ``stream(chat_id, send, closed)`` ("A tab that falls behind"), as written."""
    async with open_store(mode, tmp_path / "store", limits=Limits(channel_log=10)) as store:
        events = store.channel("chat-events", ChatEvent)

        async def stream(chat_id: int, send, closed: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
            sub = await events.under(chat_id).subscribe(
                lambda m: send(m.value),
                on_missed=lambda missed: send({"kind": "reload"}),
            )
            await closed.wait()  # the browser went away
            await sub.stop()

        sent: list[Any] = []
        closed = asyncio.Event()
        task = asyncio.ensure_future(stream(7, sent.append, closed))
        await _wait_subscribed(store, 1)
        await events.under(7).publish(ChatEvent("message", 1))
        await eventually(lambda: sent == [ChatEvent("message", 1)])
        # a burst published in one go: the branch log (10) drops most before they can be sent
        await publish_all(events.under(7), [ChatEvent("message", i) for i in range(2, 202)], chunk=200)
        tail = [ChatEvent("message", i) for i in range(192, 202)]
        await eventually(lambda: sent[-10:] == tail)
        # the tab heard some of the burst, in order, and was told to reload before each gap (where the burst is cut
        # depends on when the loop turned: an embedded store's publishes let it turn after 5 ms of one turn)
        assert sent[0] == ChatEvent("message", 1) and {"kind": "reload"} in sent
        last = 1
        for before, item in itertools.pairwise(sent):
            if isinstance(item, ChatEvent):
                assert item.id > last, sent
                if item.id != last + 1:
                    assert before == {"kind": "reload"}, sent  # (a gap, told)
                last = item.id
        closed.set()
        await asyncio.wait_for(task, 10)
        assert await subscriptions(store) == 0


# contract: CHAN-02
# contract: CHAN-05
async def test_100k_ints_in_order_through_the_callback_and_each(store: tinystore.Store) -> None:
    n = 100_000
    ch = store.channel("ints", int)
    by_callback: list[int] = []
    by_each: list[int] = []
    missed: list[Missed] = []
    cb_sub = await ch.subscribe(lambda m: by_callback.append(m.value), on_missed=missed.append)

    async def loop() -> None:
        async with contextlib.aclosing(ch.each(on_missed=missed.append)) as it:
            async for m in it:
                by_each.append(m.value)
                if len(by_each) == n:
                    break

    task = asyncio.ensure_future(loop())  # each() subscribes at its first turn
    await _wait_subscribed(store, 2)
    t = time.perf_counter()
    await publish_paced(ch, list(range(n)), lambda: min(len(by_callback), len(by_each)), window=512, chunk=256)
    await eventually(lambda: len(by_callback) == n and len(by_each) == n, timeout=60)
    took = time.perf_counter() - t
    await asyncio.wait_for(task, 10)
    assert missed == []
    assert by_callback == list(range(n))
    assert by_each == by_callback
    print(f"\n{store.mode}: {n} messages to 2 subscribers in {took:.2f}s ({2 * n / took:,.0f} deliveries/s)")
    if store.mode == "embedded":
        assert took < 30
    await cb_sub.stop()


async def _wait_subscribed(store: tinystore.Store, count: int) -> None:
    deadline = time.monotonic() + 10
    while await subscriptions(store) < count:
        assert time.monotonic() < deadline, "the subscriptions did not appear"
        await asyncio.sleep(0.01)


# contract: CHAN-02
async def test_100k_ints_with_a_small_bound_received_plus_missed_is_exact(mode: str, tmp_path: Path) -> None:
    n = 100_000
    async with open_store(mode, tmp_path / "store", limits=Limits(channel_log=100)) as store:
        ch = store.channel("ints", int)
        cb = Heard()
        sub = await ch.subscribe(cb.on_message, on_missed=cb.on_missed)
        each = Heard()

        async def loop() -> None:
            async with contextlib.aclosing(ch.each(on_missed=each.on_missed)) as it:
                async for m in it:
                    each.on_message(m)
                    if each.count >= n:
                        break

        task = asyncio.ensure_future(loop())
        await _wait_subscribed(store, 2)
        await publish_all(ch, range(n), chunk=1024)  # back to back, nobody waits for the subscribers
        await eventually(lambda: cb.count >= n and each.count >= n, timeout=60)
        await asyncio.wait_for(task, 10)
        for h in (cb, each):
            assert h.count == n
            assert h.unknown == 0
            assert h.values == sorted(set(h.values)), "out of order or duplicated"
            assert h.values[-1] == n - 1  # the newest always arrives
            assert all(x.reason == "behind" for x in h.notices)
        assert cb.missed > 0  # the bound was hit
        await sub.stop()


# ---------------------------------------------------------------------------- CHAN-03

SCHEMA = [
    (
        "001_init.sql",
        "create table t (id integer primary key, v text);\n"
        "insert into t values (1, 'old');\n"
        "create table messages (id integer primary key, chat_id integer, role text, text text, "
        "created_at integer, reply_to integer);\n",
    )
]


# contract: CHAN-03
async def test_tx_publish_is_heard_only_after_the_commit_returned(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=SCHEMA)
    ch = store.channel("rows", int)
    committed = False
    heard: list[tuple[bool, Any]] = []

    async def handler(m: Message[int]) -> None:
        # a subscriber that hears it can already read the committed row
        heard.append((committed, await db.scalar("select v from t where id = ?", m.value)))

    sub = await ch.under(1).subscribe(handler)

    async def change(tx: tinystore.SqlTx) -> None:
        await tx.exec("update t set v = 'new' where id = 1")
        await tx.with_(ch).under(1).publish(1)
        await asyncio.sleep(0.2)
        assert heard == []  # nothing before the commit

    await db.tx(change)
    committed = True
    await eventually(lambda: len(heard) == 1)
    assert heard == [(True, "new")]
    await sub.stop()


# contract: CHAN-01
# contract: CHAN-03
async def test_a_publish_after_the_commit_returned_comes_after_the_transactions_own(store: tinystore.Store) -> None:
    """Publish order per branch holds across ``db.tx``: what the transaction published, then what its caller
    publishes once it returned (trial Z: an embedded store gave the later publish the lower seq)."""
    db = await store.database("app", migrations=SCHEMA)
    ch = store.channel("order", str)
    heard: list[tuple[str, int]] = []
    sub = await ch.under(1).subscribe(lambda m: heard.append((m.value, m.seq)))
    for round_ in range(3):

        async def save(tx: tinystore.SqlTx, round_: int = round_) -> None:
            await tx.exec("update t set v = ? where id = 1", f"r{round_}")
            await tx.with_(ch).under(1).publish(f"tx {round_}")
            await tx.with_(ch).under(1).publish(f"tx {round_} again")

        await db.tx(save)
        await ch.under(1).publish(f"after {round_}")
    await eventually(lambda: len(heard) >= 9)
    assert [v for v, _ in heard] == [v for r in range(3) for v in (f"tx {r}", f"tx {r} again", f"after {r}")], heard
    assert [seq for _, seq in heard] == sorted(seq for _, seq in heard)
    await sub.stop()


# contract: CHAN-03
async def test_tx_rollback_publishes_nothing_and_tells_no_gap(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=SCHEMA)
    ch = store.channel("rows", int)
    heard = Heard()
    sub = await ch.under(1).subscribe(heard.on_message, on_missed=heard.on_missed)

    class Boom(Exception):
        pass

    async def change(tx: tinystore.SqlTx) -> None:
        await tx.exec("update t set v = 'never' where id = 1")
        await tx.with_(ch).under(1).publish(1)
        await tx.with_(ch).under(1).publish(2)
        await asyncio.sleep(0.2)
        raise Boom

    with pytest.raises(Boom):
        await db.tx(change)

    # a cancelled transaction drops its messages too
    inside = asyncio.Event()

    async def cancelled(tx: tinystore.SqlTx) -> None:
        await tx.with_(ch).under(1).publish(3)
        inside.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(db.tx(cancelled))
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    assert heard.events == []
    assert await db.scalar("select v from t where id = 1") == "old"
    await ch.under(1).publish(4)
    await eventually(lambda: len(heard.values) == 1)
    assert heard.notices == []  # no one is told of a gap
    assert heard.values == [4] and heard.messages[0].seq == 1  # the dropped ones never took a seq
    await sub.stop()


# contract: CHAN-03
async def test_seed_save_reply_and_publish_in_one_transaction(store: tinystore.Store) -> None:
    """The seed's ``save`` (live updates: "Tell every open tab"), as written."""
    import time  # the snippet's own import

    db = await store.database("app", migrations=SCHEMA)
    events = store.channel("chat-events", ChatEvent)
    chat_id, answer, message_id = 7, "Hello! How can I help?", 41
    rows: list[Any] = []

    async def tab(m: Message[ChatEvent]) -> None:
        rows.append((m.value, await db.one("select * from messages where id = ?", m.value.id)))

    sub = await events.under(chat_id).subscribe(tab)

    async def save(tx: tinystore.SqlTx) -> None:
        reply = await tx.exec(
            "insert into messages (chat_id, role, text, created_at, reply_to) values (?, 'assistant', ?, ?, ?)",
            chat_id, answer, time.time_ns() // 1_000_000, message_id,
        )  # fmt: skip
        await tx.with_(events).under(chat_id).publish(ChatEvent(kind="message", id=reply.last_insert_rowid))

    await db.tx(save)
    await eventually(lambda: len(rows) == 1)
    event, row = rows[0]
    assert event.kind == "message"
    assert row is not None and row["text"] == answer and row["reply_to"] == message_id and row["chat_id"] == 7
    await sub.stop()


# contract: CHAN-03
async def test_tx_publish_checks_at_publish_and_keeps_nothing_refused(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=SCHEMA)
    events = store.channel("chat-events", ChatEvent)
    heard = Heard()
    sub = await events.under(1).subscribe(heard.on_message, on_missed=heard.on_missed)

    async def bad(tx: tinystore.SqlTx) -> str:
        with pytest.raises(InvalidError):
            await tx.with_(events).under(1).publish({"kind": 3})  # type: ignore[arg-type]
        with pytest.raises(LimitError):
            await tx.with_(events).under(1).publish(ChatEvent("x" * 70_000, 1))
        await tx.with_(events).under(1).publish(ChatEvent("message", 1))
        return "ok"

    assert await db.tx(bad) == "ok"
    await eventually(lambda: len(heard.values) == 1)
    assert heard.values == [ChatEvent("message", 1)] and heard.messages[0].seq == 1

    kept: list[tinystore.SqlTx] = []

    async def keep(tx: tinystore.SqlTx) -> None:
        kept.append(tx)

    await db.tx(keep)
    with pytest.raises(ClosedError):  # the transaction has ended
        await kept[0].with_(events).under(1).publish(ChatEvent("late", 2))
    with pytest.raises(InvalidError):
        kept[0].with_(object())
    await sub.stop()


# ---------------------------------------------------------------------------- CHAN-04


async def _held(heard: Heard, n: int) -> None:
    await eventually(lambda: len(heard.values) >= n, what=f"{n} messages")


# contract: CHAN-04
async def test_reconnect_is_told_with_count_zero_and_nothing_repeats(remote_store: tinystore.Store) -> None:
    ch = remote_store.channel("feed", int)
    heard = Heard()
    sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
    for v in range(1, 6):
        await ch.publish(v)
    await _held(heard, 5)
    await drop(remote_store)
    for v in range(6, 11):
        await ch.publish(v)  # waits for the reconnect
    await eventually(lambda: len(heard.values) == 10)
    assert heard.shape() == [("m", v) for v in range(1, 6)] + [("missed", "reconnect", 0)] + [
        ("m", v) for v in range(6, 11)
    ]
    assert sub.reconnects == 1
    assert await subscriptions(remote_store) == 1  # the old one is gone with its connection
    await sub.stop()


@contextlib.asynccontextmanager
async def _gate(store: tinystore.Store) -> AsyncIterator[asyncio.Event]:
    """Hold the store's reconnects until the yielded event is set."""
    t: Any = store.transport
    gate = asyncio.Event()
    original = t.endpoint

    async def gated() -> Any:
        await gate.wait()
        return await original()

    t.endpoint = gated
    try:
        yield gate
    finally:
        gate.set()
        t.endpoint = original


# contract: CHAN-04
async def test_reconnect_count_is_exact_when_the_log_dropped_some(remote_mode: str, tmp_path: Path) -> None:
    async with open_store(remote_mode, tmp_path / "store", limits=Limits(channel_log=10)) as store:
        ch = store.channel("feed", int)
        heard = Heard()
        sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
        for v in range(1, 6):
            await ch.publish(v)
        await _held(heard, 5)
        async with _gate(store) as gate, second_store(store) as other:
            drop_connection(store)
            await eventually(lambda: not store.transport._up.is_set())  # type: ignore[attr-defined]
            for v in range(6, 31):
                await other.channel("feed", int).publish(v)
            gate.set()
            await eventually(lambda: len(heard.values) == 15)
        # 6..20 were dropped by the log (it holds 21..30): exactly 15
        assert heard.shape() == [("m", v) for v in range(1, 6)] + [("missed", "reconnect", 15)] + [
            ("m", v) for v in range(21, 31)
        ]
        assert len(heard.values) + heard.missed == 30
        await sub.stop()


# contract: CHAN-04
async def test_a_recursive_subscription_that_fell_behind_still_counts_a_reconnect_exactly(
    remote_mode: str, tmp_path: Path
) -> None:
    """A "behind" notice of a recursive subscription says where each branch resumes: a later reconnect (no
    restart) is told with the exact count (0 here), not None, and handled + missed = published."""
    async with open_store(remote_mode, tmp_path / "store", limits=Limits(channel_log=10)) as store:
        ch = store.channel("ev", int)
        heard = Heard()
        release = asyncio.Event()

        async def handler(m: Message[int]) -> None:
            heard.on_message(m)
            if m.value == 1:
                await release.wait()

        sub = await ch.subscribe(handler, on_missed=heard.on_missed, recursive=True)
        await ch.under("a").publish(1)
        await eventually(lambda: len(heard.values) == 1)
        published = 1
        # more than the subscription's window on two branches while the handler is held: the logs drop some
        for v in range(2, 2 + 3 * Limits().channel_prefetch):
            await ch.under("a" if v % 2 else "b").publish(v)
            published += 1
        release.set()
        await eventually(lambda: heard.count == published)
        assert heard.missed > 0 and heard.unknown == 0, heard.shape()
        drop_connection(store)
        last = heard.values[-1]
        for v in range(last + 1, last + 6):
            await ch.under("a").publish(v)  # waits for the reconnect
            published += 1
        await eventually(lambda: heard.count == published)
        assert ("missed", "reconnect", 0) in heard.shape(), heard.shape()
        assert heard.unknown == 0 and heard.values[-5:] == list(range(last + 1, last + 6))
        await sub.stop()


# contract: CHAN-04
async def test_reconnect_resumes_after_the_last_message_handled(remote_store: tinystore.Store) -> None:
    """Messages received but not handled when the connection drops are sent again, none twice."""
    ch = remote_store.channel("feed", int)
    heard = Heard()
    release = asyncio.Event()

    async def handler(m: Message[int]) -> None:
        heard.on_message(m)
        if m.value == 3:
            await release.wait()

    sub = await ch.subscribe(handler, on_missed=heard.on_missed)
    for v in range(1, 9):
        await ch.publish(v)
    await eventually(lambda: sub.statistics()["buffered"] == 5)  # 3 in hand, 4..8 received
    drop_connection(remote_store)
    await eventually(lambda: sub.reconnects == 1)
    release.set()
    await eventually(lambda: len(heard.values) == 8)
    assert heard.shape() == [("m", v) for v in (1, 2, 3)] + [("missed", "reconnect", 0)] + [
        ("m", v) for v in range(4, 9)
    ]
    await sub.stop()


# contract: CHAN-04
async def test_each_is_told_of_a_reconnect_too(remote_store: tinystore.Store) -> None:
    ch = remote_store.channel("feed", int)
    heard = Heard()
    got: list[int] = []

    async def loop() -> None:
        async with contextlib.aclosing(ch.each(on_missed=heard.on_missed)) as it:
            async for m in it:
                got.append(m.value)
                if len(got) == 4:
                    return

    task = asyncio.ensure_future(loop())
    await _wait_subscribed(remote_store, 1)
    await ch.publish(1)
    await ch.publish(2)
    await eventually(lambda: len(got) == 2)
    await drop(remote_store)
    await ch.publish(3)
    await ch.publish(4)
    await asyncio.wait_for(task, 20)
    assert got == [1, 2, 3, 4]
    assert heard.notices == [Missed("reconnect", 0)]


# contract: CHAN-04
async def test_reconnect_after_a_server_restart_counts_none(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "store") as store:
        ch = store.channel("feed", int)
        heard = Heard()
        sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
        first = [await ch.publish(v) for v in (1, 2, 3)]
        await _held(heard, 3)
        pid = (await store.status())["pid"]
        os.kill(pid, signal.SIGKILL)  # the SDK starts a new sidecar and reconnects to it
        await eventually(lambda: sub.reconnects == 1, timeout=30)
        later = await ch.publish(4)
        await eventually(lambda: len(heard.values) == 4)
        assert heard.shape() == [("m", 1), ("m", 2), ("m", 3), ("missed", "reconnect", None), ("m", 4)]
        assert (await store.status())["pid"] != pid
        assert later not in first and later.split("-")[0] != first[0].split("-")[0]  # ids never repeat
        await sub.stop()


# ---------------------------------------------------------------------------- CHAN-05


# contract: CHAN-05
async def test_callback_and_each_hear_the_same_and_break_stops(store: tinystore.Store) -> None:
    ch = store.channel("chat-events", ChatEvent)
    cb = Heard()
    sub = await ch.under(7).subscribe(cb.on_message, on_missed=cb.on_missed)
    by_each: list[Message[ChatEvent]] = []

    async def loop() -> None:
        async for m in ch.under(7).each():
            by_each.append(m)
            if len(by_each) == 300:
                break  # stops the subscription

    task = asyncio.ensure_future(loop())
    await _wait_subscribed(store, 2)
    values = [ChatEvent("message", i) for i in range(300)]
    await publish_paced(ch.under(7), values, lambda: min(len(cb.values), len(by_each)), window=256, chunk=64)
    await asyncio.wait_for(task, 20)
    await eventually(lambda: len(cb.values) == 300)
    assert [(m.id, m.value) for m in by_each] == [(m.id, m.value) for m in cb.messages]
    deadline = time.monotonic() + 10
    while await subscriptions(store) != 1:  # the each() subscription ended with the loop
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await sub.stop()


# contract: CHAN-05
async def test_each_ends_when_the_store_closes(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store") as store:
        got: list[int] = []

        async def loop() -> str:
            async for m in store.channel("n", int).each():
                got.append(m.value)
            return "ended"

        task = asyncio.ensure_future(loop())
        await _wait_subscribed(store, 1)
        await store.channel("n", int).publish(1)
        await eventually(lambda: got == [1])
        sub_heard = Heard()
        sub = await store.channel("n", int).subscribe(sub_heard.on_message)
        await store.close()
        assert await asyncio.wait_for(task, 10) == "ended"
        assert not sub.active


# ---------------------------------------------------------------------------- CHAN-06


# contract: CHAN-06
async def test_a_branch_hears_only_its_own_and_recursive_hears_below(store: tinystore.Store) -> None:
    ch = store.channel("org")
    root, org1, deep, deep2, rec = Heard(), Heard(), Heard(), Heard(), Heard()
    subs = [
        await ch.subscribe(root.on_message),
        await ch.under("org-1").subscribe(org1.on_message),
        await ch.under("org-1", 7).subscribe(deep.on_message),
        await ch.under("org-1").under("7").subscribe(deep2.on_message),
        await ch.under("org-1").subscribe(rec.on_message, recursive=True),
    ]
    sent = [
        ((), "root"),
        (("org-1",), "org"),
        (("org-1", 7), "seven-a"),
        (("org-2", 7), "other org"),
        (("org-1", "8"), "eight"),  # a branch that did not exist when rec subscribed
        (("org-1", "7"), "seven-b"),
        (("org-1", 8, "x"), "deeper"),
    ]
    for branch, value in sent:
        await ch.under(*branch).publish(value)
    await eventually(lambda: len(rec.values) == 5)
    await asyncio.sleep(0.05)
    assert root.values == ["root"]
    assert org1.values == ["org"]
    assert deep.values == ["seven-a", "seven-b"] == deep2.values
    assert sorted(rec.values) == sorted(["org", "seven-a", "eight", "seven-b", "deeper"])
    by_branch: dict[tuple[str, ...], list[Any]] = {}
    for m in rec.messages:
        by_branch.setdefault(tuple(m.branch), []).append(m.value)
    assert by_branch == {
        ("org-1",): ["org"],
        ("org-1", "7"): ["seven-a", "seven-b"],
        ("org-1", "8"): ["eight"],
        ("org-1", "8", "x"): ["deeper"],
    }
    assert deep.messages[0].branch == ["org-1", "7"]
    for s in subs:
        await s.stop()
    with pytest.raises(InvalidError):
        ch.under(True)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        ch.under("")
    with pytest.raises(InvalidError):
        ch.under(None)  # type: ignore[arg-type]


# contract: CHAN-06
async def test_linger_keeps_a_branch_for_a_resume_then_keeps_nothing(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "store", limits=Limits(channel_linger=1.0)) as store:
        ch = store.channel("tabs", int).under(7)
        heard = Heard()
        sub = await ch.subscribe(heard.on_message)
        ids = [await ch.publish(v) for v in (1, 2, 3)]
        await eventually(lambda: len(heard.values) == 3)
        await sub.stop()
        id4 = await ch.publish(4)  # nobody listens, but someone did within the linger: kept
        again = Heard()
        sub = await ch.subscribe(again.on_message, on_missed=again.on_missed, after=ids[1])
        await eventually(lambda: len(again.values) == 2)
        assert again.shape() == [("m", 3), ("m", 4)]  # a tab that reconnects resumes
        await sub.stop()
        await asyncio.sleep(1.6)  # past the linger: the branch keeps nothing
        await ch.publish(5)
        await ch.publish(6)
        late = Heard()
        sub = await ch.subscribe(late.on_message, on_missed=late.on_missed, after=id4)
        await ch.publish(7)
        await eventually(lambda: len(late.values) == 1)
        # nothing was kept of the branch (not even its seqs), so the store cannot tell how many were missed
        assert late.shape() == [("missed", "behind", None), ("m", 7)]
        await sub.stop()
        # an id from another epoch cannot be counted
        other = Heard()
        sub = await ch.subscribe(other.on_message, on_missed=other.on_missed, after="1-5")
        await ch.publish(8)
        await eventually(lambda: len(other.values) == 1)
        assert other.shape() == [("missed", "behind", None), ("m", 8)]
        await sub.stop()
        with pytest.raises(InvalidError):
            await ch.subscribe(other.on_message, after="not-an-id")


# ---------------------------------------------------------------------------- CHAN-07


# contract: CHAN-07
async def test_typed_values_round_trip_and_bad_values_are_refused(store: tinystore.Store) -> None:
    cases: list[tuple[Any, list[Any], list[Any]]] = [
        (ChatEvent, [ChatEvent("message", 1)], [{"kind": "message"}, ChatEvent(1, "x"), "text"]),  # type: ignore[arg-type]
        (Point, [Point(1, 2)], [Point("a", 2), {"x": 1}]),  # type: ignore[arg-type]
        (Note, [{"text": "hé\x00\n", "n": 3}], [{"text": 1, "n": 3}, {"n": 3}]),
        (int, [7, -(2**63)], ["7", 1.5, 2**64]),
        (list[str], [["a", "b"], []], [[1], "ab"]),
        (None, [{"a": [1, 2.5, None, True, "x"]}, "text", 3], [object(), {1j}]),
    ]
    for i, (type_, good, bad) in enumerate(cases):
        ch = store.channel(f"typed-{i}", type_)
        heard = Heard()
        sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
        for value in bad:
            with pytest.raises(InvalidError):
                await ch.publish(value)
        for value in good:
            await ch.publish(value)
        await eventually(lambda h=heard, n=len(good): len(h.values) == n)  # type: ignore[misc]
        assert heard.values == good, type_
        assert heard.notices == []
        assert [m.seq for m in heard.messages] == list(range(1, len(good) + 1))  # nothing refused was published
        if type_ is ChatEvent:
            assert all(isinstance(v, ChatEvent) for v in heard.values)
        if type_ is Point:
            assert all(isinstance(v, Point) for v in heard.values)
        await sub.stop()
    with pytest.raises(InvalidError):
        store.channel("Bad Name")
    with pytest.raises(InvalidError):
        store.channel("x" * 65)

    class NotCarried:
        pass

    with pytest.raises(InvalidError):
        store.channel("ok", NotCarried)


def _text_of_encoded_size(size: int, unit: str) -> str:
    """A str whose MessagePack encoding is exactly ``size`` bytes, made of ``unit`` and ASCII filler."""
    for head in (3, 5):  # str16 or str32 header
        body = size - head
        n = body // len(unit.encode())
        text = unit * n + "a" * (body - n * len(unit.encode()))
        if len(msgspec.msgpack.encode(text)) == size:
            return text
    raise AssertionError(size)


# contract: CHAN-07
async def test_payloads_at_the_limit_arrive_identical_and_one_byte_over_is_refused(store: tinystore.Store) -> None:
    limit = 64 * 1024
    ch = store.channel("big", str)
    heard = Heard()
    sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
    sent: list[str] = []
    for unit in ("a", "😀", "line\n\x00end\r\n"):
        for size in (limit, limit - 1):
            text = _text_of_encoded_size(size, unit)
            assert len(msgspec.msgpack.encode(text)) == size
            await ch.publish(text)
            sent.append(text)
        over = _text_of_encoded_size(limit + 1, unit)
        with pytest.raises(LimitError) as err:
            await ch.publish(over)
        assert err.value.limit == limit and err.value.wanted == limit + 1
    await eventually(lambda: len(heard.values) == len(sent))
    assert heard.values == sent  # identical, byte for byte
    assert heard.notices == []
    assert [m.seq for m in heard.messages] == list(range(1, 7))  # nothing over the limit was published
    await sub.stop()


# ---------------------------------------------------------------------------- CHAN-08


# contract: CHAN-08
async def test_memory_stays_bounded_whatever_subscribers_do(mode: str, tmp_path: Path) -> None:
    limits = Limits(channel_total_bytes=256 * 1024, channel_log_bytes=64 * 1024, channel_log=1000)
    async with open_store(mode, tmp_path / "store", limits=limits) as store:
        ch = store.channel("load")
        release = asyncio.Event()
        heard = [Heard() for _ in range(12)]
        subs = []
        for i, h in enumerate(heard):

            async def blocked(m: Message[Any], h: Heard = h) -> None:
                h.on_message(m)
                await release.wait()

            subs.append(await ch.under(i).subscribe(blocked, on_missed=h.on_missed))
        payload = "x" * 1000
        peak = 0
        for _ in range(200):  # past the prefetch window of each subscriber (64)
            await asyncio.gather(*(ch.under(i).publish(payload) for i in range(12)))
            st = (await store.status())["channels"]
            peak = max(peak, st["bytes"])
            assert st["bytes"] <= limits.channel_total_bytes
        assert peak > limits.channel_total_bytes // 2
        release.set()
        await eventually(lambda: all(h.count == 200 for h in heard))
        assert sum(h.missed for h in heard) > 0  # the oldest unread were dropped, and counted
        for s in subs:
            await s.stop()


# contract: CHAN-08
async def test_nothing_of_a_channel_is_written_to_disk(store: tinystore.Store) -> None:
    assert store.directory is not None
    marker = "chan08-marker-" + os.urandom(8).hex()
    ch = store.channel("disk")
    heard = Heard()
    sub = await ch.subscribe(heard.on_message)
    for _ in range(50):
        await ch.publish(marker)
    await eventually(lambda: len(heard.values) == 50)
    for path in store.directory.rglob("*"):
        if path.is_file() and not path.is_socket():
            with contextlib.suppress(OSError):
                assert marker.encode() not in path.read_bytes(), path
    await sub.stop()


SUBSCRIBER = """
import asyncio, os, sys, tinystore
async def main():
    store = await tinystore.open(sys.argv[1], idle="5s")
    await store.channel("chat-events").under(7).subscribe(lambda m: None)
    await store.channel("chat-events").subscribe(lambda m: None, recursive=True)
    print("ready", flush=True)
    if sys.argv[2] == "exit":
        os._exit(0)  # gone without stopping anything
    await asyncio.sleep(3600)
asyncio.run(main())
"""


# contract: CHAN-08
@pytest.mark.parametrize("how", ["killed", "exit"])
async def test_a_subscriber_that_vanishes_is_cleaned_up(store: tinystore.Store, how: str) -> None:
    assert store.directory is not None
    child = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, str(store.directory), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.strip() == b"ready"
        if how == "killed":
            assert await subscriptions(store) == 2
            child.kill()
        await asyncio.to_thread(child.wait, 20)
        deadline = time.monotonic() + 10
        while True:
            st = (await store.status())["channels"]
            if st["subscriptions"] == 0 and st["peers"] == 0:
                break
            assert time.monotonic() < deadline, st
            await asyncio.sleep(0.02)
        # and the branch it listened to goes on working for others
        heard = Heard()
        sub = await store.channel("chat-events").under(7).subscribe(heard.on_message)
        await store.channel("chat-events").under(7).publish("still here")
        await eventually(lambda: heard.values == ["still here"])
        await sub.stop()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# contract: CHAN-08
async def test_a_dropped_connection_for_good_leaves_nothing(remote_store: tinystore.Store) -> None:
    async with second_store(remote_store) as other:
        await other.channel("x").subscribe(lambda m: None)
        await other.channel("x").under(1).subscribe(lambda m: None)
        assert await subscriptions(remote_store) == 2
        t: Any = other.transport
        t.closed = True  # no reconnect: the connection is gone for good
        t.abort()
        deadline = time.monotonic() + 10
        while await subscriptions(remote_store) != 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
