"""SSE-01..04 over a real uvicorn server and httpx, with the store embedded and behind its sidecar."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import tinystore

from ..helpers import open_store
from .app import ChatEvent, make_app
from .harness import client, open_sse, serve, stalled_reader
from .parser import EventStreamParser

MODES = ["embedded", "sidecar"]


@pytest.fixture(params=MODES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tinystore.Store]:
    async with open_store(request.param, tmp_path / "store", limits=tinystore.Limits(channel_log=8)) as s:
        yield s


@pytest.fixture
async def web(store: tinystore.Store) -> AsyncIterator[str]:
    async with serve(make_app(store)) as url:
        yield url


async def subscriptions(store: tinystore.Store) -> int:
    status = await store.status()
    return int(status["channels"]["subscriptions"])


async def wait_subscriptions(store: tinystore.Store, n: int, within: float = 5.0) -> float:
    """Seconds until the store holds exactly n subscriptions (fails after ``within``)."""
    start = time.monotonic()
    while (got := await subscriptions(store)) != n:
        if time.monotonic() - start > within:
            raise AssertionError(f"the store holds {got} subscriptions, not {n}, after {within}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def events_of(store: tinystore.Store) -> tinystore.Channel[ChatEvent]:
    return store.channel("chat-events", ChatEvent)


TRICKY = "line one\ndata: injected\nid: 99-99\n: not a comment\r\n\r\nevent: evil\rretry: 1\n\u2028 ünï 🎉 \x00 end"


# contract: SSE-01
async def test_tricky_text_arrives_as_one_event_with_its_id_and_type(store: tinystore.Store, web: str) -> None:
    events = events_of(store)
    async with client() as http, open_sse(http, f"{web}/events/7") as sse:
        await wait_subscriptions(store, 1)
        mid = await events.under(7).publish(ChatEvent("token", 3, TRICKY))
        ev = await sse.next()
        assert ev.type == "token"
        assert ev.last_event_id == mid
        assert json.loads(ev.data) == {"kind": "token", "id": 3, "text": TRICKY}  # exactly, \r and NUL too
        # one data line, as JSON escapes the line breaks
        assert sse.raw.count(b"\ndata: ") == 1


# contract: SSE-02
async def test_headers_no_buffering_no_compression(store: tinystore.Store, web: str) -> None:
    async with client() as http, open_sse(http, f"{web}/events/1", {"accept-encoding": "gzip, br"}) as sse:
        h = sse.response.headers
        assert sse.response.status_code == 200
        assert h["content-type"].split(";")[0] == "text/event-stream"
        assert h["cache-control"] == "no-cache"
        assert h["x-accel-buffering"] == "no"
        assert "content-length" not in h
        assert "content-encoding" not in h  # even behind GZipMiddleware with a client that takes gzip


# contract: SSE-02
async def test_each_event_is_flushed_as_produced(store: tinystore.Store, web: str) -> None:
    events = events_of(store)
    async with client() as http, open_sse(http, f"{web}/events/2") as sse:
        await wait_subscriptions(store, 1)
        for i in range(5):
            start = time.monotonic()
            await events.under(2).publish(ChatEvent("message", i))
            ev = await sse.next(timeout=2)
            assert json.loads(ev.data)["id"] == i
            assert time.monotonic() - start < 1.0  # each one on its own, not held back for the next


# contract: SSE-02
async def test_an_idle_stream_sends_keep_alive_comments(store: tinystore.Store, web: str) -> None:
    async with client() as http, open_sse(http, f"{web}/events/3?keepalive=0.2s") as sse:
        await sse.none_within(0.9)
        assert sse.comments.count(" keep-alive") >= 3
        # and the default is 15 s: a stream without the option stays quiet for a second
    async with client() as http, open_sse(http, f"{web}/events/3") as sse:
        await sse.none_within(1.0)
        assert " keep-alive" not in sse.comments


# contract: SSE-03
async def test_reconnect_with_last_event_id_gets_exactly_what_it_missed(store: tinystore.Store, web: str) -> None:
    events = events_of(store).under(4)
    async with client() as http:
        async with open_sse(http, f"{web}/events/4") as sse:
            await wait_subscriptions(store, 1)
            await events.publish(ChatEvent("message", 1))
            first = await sse.next()
        # the tab lost its connection; a message is published meanwhile
        await wait_subscriptions(store, 0)
        await events.publish(ChatEvent("message", 2))
        async with open_sse(http, f"{web}/events/4", {"last-event-id": first.last_event_id}) as sse:
            ev = await sse.next()
            assert ev.type == "message"
            assert json.loads(ev.data)["id"] == 2
            await sse.none_within(0.3)  # exactly once, and no reload
            # and the stream goes on live
            await events.publish(ChatEvent("message", 3))
            assert json.loads((await sse.next()).data)["id"] == 3


# contract: SSE-03
@pytest.mark.parametrize("own", [False, True])
async def test_a_message_that_does_not_decode_is_a_reload_of_one(store: tinystore.Store, web: str, own: bool) -> None:
    """A publisher without the channel's type (the command line, an untyped client) can publish what the stream's
    type cannot read: the stream counts it as missed, so that events plus reload counts still add up (trial AA: it
    vanished, and the log blamed "the handler")."""
    untyped = store.channel("chat-events").under(5)
    events = events_of(store).under(5)
    async with client() as http, open_sse(http, f"{web}/events/5{'?own=1' if own else ''}") as sse:
        await wait_subscriptions(store, 1)
        bad = [await untyped.publish("junk"), await untyped.publish({"kind": 5})]
        good = await events.publish(ChatEvent("message", 1))
        got = [await sse.next() for _ in range(3)]
        assert [(e.type, e.last_event_id) for e in got] == [("reload", bad[0]), ("reload", bad[1]), ("message", good)]
        assert [json.loads(e.data) for e in got[:2]] == [{"kind": "reload", "reason": "error", "missed": 1}] * 2
        await sse.none_within(0.2)


# contract: SSE-03
async def test_reload_when_more_was_published_than_the_log_holds(store: tinystore.Store, web: str) -> None:
    events = events_of(store).under(5)
    async with client() as http:
        async with open_sse(http, f"{web}/events/5") as sse:
            await wait_subscriptions(store, 1)
            await events.publish(ChatEvent("message", 0))
            first = await sse.next()
        await wait_subscriptions(store, 0)
        ids = [await events.publish(ChatEvent("message", i)) for i in range(1, 21)]  # the log holds 8
        async with open_sse(http, f"{web}/events/5", {"last-event-id": first.last_event_id}) as sse:
            ev = await sse.next()
            assert ev.type == "reload"
            assert json.loads(ev.data) == {"kind": "reload", "reason": "behind", "missed": 12}
            # what the log held follows: the page reloads anyway, and these are harmless "look again"s
            rest = [await sse.next() for _ in range(8)]
            assert [e.last_event_id for e in rest] == ids[12:]
        # the reload's id is where this stream went on, so a reconnect with it resumes there
        async with open_sse(http, f"{web}/events/5", {"last-event-id": ev.last_event_id}) as sse:
            got = [await sse.next() for _ in range(8)]
            assert [e.last_event_id for e in got] == ids[12:]
            await sse.none_within(0.2)


# contract: SSE-03
async def test_a_last_event_id_of_an_earlier_run_of_the_store_gets_a_reload_saying_so(
    store: tinystore.Store, web: str
) -> None:
    """Trial IH: a browser back after the store restarted was told "behind", which an app cannot tell from a slow
    tab: its reload says "restarted", the count not known."""
    epoch = (await store.status())["epoch"]
    async with client() as http, open_sse(http, f"{web}/events/6", {"last-event-id": f"{epoch - 1}-5"}) as sse:
        ev = await sse.next()
        assert ev.type == "reload" and json.loads(ev.data) == {"kind": "reload", "reason": "restarted", "missed": None}


# contract: SSE-03
@pytest.mark.parametrize(
    "bad", ["garbage", "1-", "-1", "1-2-3", "x" * 5000, "9" * 5000 + "-1", "1-" + "9" * 5000, "0-0", "77-1"]
)
async def test_a_malformed_or_foreign_last_event_id_gets_reload_never_a_crash(
    store: tinystore.Store, web: str, bad: str
) -> None:
    events = events_of(store).under(6)
    async with client() as http, open_sse(http, f"{web}/events/6", {"last-event-id": bad}) as sse:
        ev = await sse.next()
        assert ev.type == "reload"
        assert json.loads(ev.data)["kind"] == "reload"
        assert ev.last_event_id  # the position to resume from
        await wait_subscriptions(store, 1)
        mid = await events.publish(ChatEvent("message", 1))
        ev2 = await sse.next()
        assert (ev2.type, ev2.last_event_id) == ("message", mid)


# contract: SSE-03
@pytest.mark.parametrize("own", ["0", "1"], ids=["shared", "own-subscription"])
async def test_a_browser_that_falls_behind_gets_reload_and_never_stalls_the_publisher(
    store: tinystore.Store, web: str, own: str
) -> None:
    """Every message is accounted for: delivered, or counted in a reload, exactly; the publisher never waits."""
    events = events_of(store).under(8)
    big = "x" * 60_000
    total = 300
    async with client() as http, http.stream("GET", f"{web}/events/8?own={own}") as response:
        # the tab reads nothing: socket buffers fill, then the server's writes wait
        await wait_subscriptions(store, 1)
        start = time.monotonic()
        for i in range(total):  # 18 MB, far more than the socket buffers and the branch log (8 messages)
            await events.publish(ChatEvent("token", i, big))
            await asyncio.sleep(0)
        assert time.monotonic() - start < 10  # the publisher never waited for the tab
        # the tab reads again: what the buffers held, a reload with the exact count, then the newest messages
        parser = EventStreamParser()
        got: list[int] = []
        reloads: list[dict[str, object]] = []
        async with asyncio.timeout(20):
            async for chunk in response.aiter_raw():
                for e in parser.feed(chunk):
                    if e.type == "reload":
                        reloads.append(json.loads(e.data))
                    else:
                        got.append(json.loads(e.data)["id"])
                missed = sum(int(r["missed"]) for r in reloads)  # type: ignore[call-overload]
                if len(got) + missed >= total:
                    break
        assert reloads and all(r["reason"] == "behind" for r in reloads)
        assert got == sorted(got) and len(set(got)) == len(got)  # in order, never twice
        assert len(got) + missed == total  # delivered + missed = published, exactly
        if own == "1":
            assert got[-1] == total - 1  # the store's log kept the newest, and they follow the reload
        # (a shared stream drops what comes while its browser is behind, the newest too, and counts it: the
        # reload tells the page to read the database again)


# contract: SSE-03
# contract: CHAN-02
async def test_a_shared_stream_behind_when_its_subscription_misses_counts_both(
    store: tinystore.Store, web: str
) -> None:
    """From trial AV: a shared stream whose browser was behind (dropping, counting) lost its count when the
    shared subscription itself was told it missed messages (a burst past the branch's log): its reload said only
    the subscription's count, and the browser was told of fewer messages than it missed."""
    events = events_of(store).under(18)
    big = "x" * 60_000
    async with client() as http, http.stream("GET", f"{web}/events/18") as response:
        await wait_subscriptions(store, 1)
        for i in range(100):  # 6 MB the tab does not read: it falls behind, and its stream drops and counts
            await events.publish(ChatEvent("token", i, big))
            await asyncio.sleep(0)
        # a burst past the branch's log (8): the shared subscription misses some of it
        await asyncio.gather(*(events.publish(ChatEvent("token", 100 + i)) for i in range(60)))
        total = 160
        parser = EventStreamParser()
        got: list[int] = []
        missed = 0
        async with asyncio.timeout(20):
            async for chunk in response.aiter_raw():
                for e in parser.feed(chunk):
                    if e.type == "reload":
                        missed += int(json.loads(e.data)["missed"])
                    else:
                        got.append(json.loads(e.data)["id"])
                if len(got) + missed >= total:
                    break
            await asyncio.sleep(0.3)
        assert got == sorted(got) and len(set(got)) == len(got)
        assert len(got) + missed == total, (len(got), missed)


# contract: SSE-03
async def test_a_shared_stream_resumed_from_the_ring_counts_a_message_that_did_not_decode(
    store: tinystore.Store, web: str
) -> None:
    """From trial AV: resumed from this process's ring (another tab kept the shared subscription), a stream went
    past a message that did not decode as the channel's type without a reload: 1 delivered of 2 published."""
    untyped = store.channel("chat-events").under(19)
    events = events_of(store).under(19)
    async with client() as http, open_sse(http, f"{web}/events/19") as keeper:
        await wait_subscriptions(store, 1)
        async with open_sse(http, f"{web}/events/19") as tab:
            await events.publish(ChatEvent("message", 1))
            first = await tab.next()
            await keeper.next()
        bad = await untyped.publish({"not": "a ChatEvent"})
        third = await events.publish(ChatEvent("message", 3))
        assert (await keeper.next()).type == "reload" and (await keeper.next()).last_event_id == third
        async with open_sse(http, f"{web}/events/19", {"last-event-id": first.last_event_id}) as tab:
            got = [await tab.next(), await tab.next()]
            assert [(e.type, e.last_event_id) for e in got] == [("reload", bad), ("message", third)]
            assert json.loads(got[0].data) == {"kind": "reload", "reason": "error", "missed": 1}
            await tab.none_within(0.2)


# contract: SSE-04
async def test_the_subscription_stops_when_the_browser_goes_away(store: tinystore.Store, web: str) -> None:
    async with client() as http:
        for _ in range(3):
            async with open_sse(http, f"{web}/events/9"):
                await wait_subscriptions(store, 1)
            took = await wait_subscriptions(store, 0, within=5.0)
            assert took < 2.0
        # many at once, gone at once
        async with contextlib_all([open_sse(http, f"{web}/events/{i}") for i in range(50)]):
            await wait_subscriptions(store, 50)
        assert await wait_subscriptions(store, 0) < 2.0


# contract: SSE-04
async def test_the_seed_stream_as_written_behind_sse_response(store: tinystore.Store, web: str) -> None:
    """The seed's stream(chat_id, send, closed) served by sse_response: events, reload, and clean-up."""
    events = events_of(store)
    db = await store.database(
        "chat",
        migrations=[
            (
                "001.sql",
                "create table messages (id integer primary key, chat_id integer, role text, text text,"
                " created_at integer, reply_to integer);",
            )
        ],
    )
    chat_id, answer, message_id = 11, "hello\nthere", 1
    async with client() as http, open_sse(http, f"{web}/seed/{chat_id}") as sse:
        await wait_subscriptions(store, 1)

        # the seed's save, as written
        async def save(tx: tinystore.SqlTx) -> None:
            reply = await tx.exec(
                "insert into messages (chat_id, role, text, created_at, reply_to) values (?, 'assistant', ?, ?, ?)",
                chat_id,
                answer,
                time.time_ns() // 1_000_000,
                message_id,
            )
            await tx.with_(events).under(chat_id).publish(ChatEvent(kind="message", id=reply.last_insert_rowid))

        await db.tx(save)
        ev = await sse.next()
        assert ev.type == "message"
        row_id = json.loads(ev.data)["id"]
        assert json.loads(ev.data) == {"kind": "message", "id": row_id, "text": ""}
        assert await db.scalar("select text from messages where id = ?", row_id) == answer
    await wait_subscriptions(store, 0)


class contextlib_all:
    def __init__(self, cms: list) -> None:  # type: ignore[type-arg]
        self.cms = cms
        self.stack: object = None

    async def __aenter__(self) -> list:  # type: ignore[type-arg]
        import contextlib

        self.stack = contextlib.AsyncExitStack()
        await self.stack.__aenter__()  # type: ignore[attr-defined]
        return [await self.stack.enter_async_context(cm) for cm in self.cms]  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.__aexit__(*exc)  # type: ignore[attr-defined]


_ = httpx


# contract: SSE-03
async def test_the_seed_stream_tells_a_tab_that_fell_behind_to_reload(store: tinystore.Store, web: str) -> None:
    events = events_of(store).under(12)
    big = "y" * 60_000
    async with client() as http, http.stream("GET", f"{web}/seed/12") as response:
        await wait_subscriptions(store, 1)
        for i in range(400):  # the tab reads nothing meanwhile
            await events.publish(ChatEvent("token", i, big))
        parser = EventStreamParser()
        seen = []
        async with asyncio.timeout(20):
            async for chunk in response.aiter_raw():
                seen += parser.feed(chunk)
                if any(json.loads(e.data) == {"kind": "reload"} for e in seen):
                    break
        tokens = [json.loads(e.data)["id"] for e in seen if json.loads(e.data) != {"kind": "reload"}]
        assert tokens == list(range(len(tokens))) and len(tokens) < 400


# contract: SSE-04
async def test_the_streams_of_one_branch_share_one_subscription_until_the_last_leaves(
    store: tinystore.Store, web: str
) -> None:
    events = events_of(store).under(13)
    async with client() as http:
        async with contextlib_all([open_sse(http, f"{web}/events/13") for _ in range(20)]) as tabs:
            await wait_subscriptions(store, 1)
            mid = await events.publish(ChatEvent("message", 1))
            for tab in tabs:
                ev = await tab.next()
                assert (ev.type, ev.last_event_id, json.loads(ev.data)["id"]) == ("message", mid, 1)
        assert await wait_subscriptions(store, 0) < 2.0


# contract: SSE-03
async def test_a_tab_that_reconnects_to_a_shared_branch_gets_exactly_what_it_missed(
    store: tinystore.Store, web: str
) -> None:
    events = events_of(store).under(14)
    async with client() as http, open_sse(http, f"{web}/events/14") as other:
        async with open_sse(http, f"{web}/events/14") as tab:
            await wait_subscriptions(store, 1)
            await events.publish(ChatEvent("message", 1))
            first = await tab.next()
            await other.next()
        ids = [await events.publish(ChatEvent("message", i)) for i in (2, 3)]
        assert [(await other.next()).last_event_id for _ in ids] == ids
        async with open_sse(http, f"{web}/events/14", {"last-event-id": first.last_event_id}) as tab:
            got = [await tab.next(), await tab.next()]
            assert [(e.type, e.last_event_id) for e in got] == [("message", i) for i in ids]
            await tab.none_within(0.2)
            assert await subscriptions(store) == 1  # it joined the shared one again
            mid = await events.publish(ChatEvent("message", 4))
            assert (await tab.next()).last_event_id == mid


# contract: SSE-03
async def test_a_slow_tab_never_holds_back_the_others_on_its_branch(store: tinystore.Store, web: str) -> None:
    events = events_of(store).under(15)
    big = "z" * 60_000
    async with client() as http, http.stream("GET", f"{web}/events/15"), open_sse(http, f"{web}/events/15") as fast:
        await wait_subscriptions(store, 1)
        for i in range(150):  # the first tab reads nothing
            await events.publish(ChatEvent("token", i, big))
            await asyncio.sleep(0)
            ev = await fast.next(timeout=5)  # the other gets each one at once, in order
            assert (ev.type, json.loads(ev.data)["id"]) == ("token", i)


# contract: SSE-03
async def test_a_dropped_store_connection_loses_no_event_of_an_open_stream(tmp_path: Path) -> None:
    """The web process's connection to the sidecar drops while another process publishes: the stream still
    gets every message (the SDK resubscribes after the last one it handled), and no reload."""
    from ..helpers import drop_connection

    async with open_store("sidecar", tmp_path / "store") as store, serve(make_app(store)) as web:
        other = await tinystore.open(tmp_path / "store")
        try:
            events = events_of(other).under(16)
            async with client() as http, open_sse(http, f"{web}/events/16") as tab:
                await wait_subscriptions(store, 1)
                ids = [await events.publish(ChatEvent("message", 1))]
                assert (await tab.next()).last_event_id == ids[0]
                drop_connection(store)
                ids += [await events.publish(ChatEvent("message", i)) for i in (2, 3)]
                got = [await tab.next(timeout=10), await tab.next(timeout=10)]
                assert [(e.type, e.last_event_id) for e in got] == [("message", i) for i in ids[1:]]
                await tab.none_within(0.3)
        finally:
            await other.close()


# contract: SSE-04
async def test_a_stream_whose_browser_takes_nothing_ends(
    store: tinystore.Store, web: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that keeps its connection open and never reads: once a write waits STALL seconds, the stream ends
    and what it held goes (trial AA: such streams stayed for good, some 0.5 MiB each)."""
    import tinystore.sse as sse_module

    monkeypatch.setattr(sse_module, "STALL", 0.5, raising=False)
    sock = await stalled_reader(web, "/events/9")
    try:
        await wait_subscriptions(store, 1)
        events = events_of(store).under(9)
        text = "x" * 4000
        for i in range(3000):  # some 12 MB: past what the sockets' buffers hold
            await events.publish(ChatEvent("token", i, text))
            if i % 200 == 0 and await subscriptions(store) == 0:
                break
        await wait_subscriptions(store, 0, within=10.0)  # the stream ended, and its subscription with it
        # said once, as a WARNING of ours; not also as an ERROR of uvicorn's (trial FI: "ASGI callable returned
        # without completing response", for an end this module chose)
        await asyncio.sleep(0.1)
        assert "the browser took nothing for 0.5s" in caplog.text
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        # another tab of the branch is served as before
        async with client() as http, open_sse(http, f"{web}/events/9") as tab:
            await wait_subscriptions(store, 1)
            mid = await events.publish(ChatEvent("message", 1))
            assert (await tab.next()).last_event_id == mid
    finally:
        sock.close()


# contract: SSE-03
async def test_a_stop_does_not_wait_for_a_browser_that_takes_nothing(
    store: tinystore.Store, web: str, caplog: pytest.LogCaptureFixture
) -> None:
    """end_streams() (a Ctrl-C, a deploy) while a stream's write waits for a browser that reads nothing: the stream
    ends within END_GRACE, not at STALL (trial FI: the demo's Ctrl-C waited for uvicorn to cancel it, and logged an
    ERROR with a traceback), and another tab that reads gets its end as before."""
    import tinystore.sse as sse_module

    sock = await stalled_reader(web, "/events/9")
    try:
        await wait_subscriptions(store, 1)
        events = events_of(store).under(9)
        text = "x" * 4000
        for i in range(3000):  # some 12 MB: past what the sockets' buffers hold, so a write waits
            await events.publish(ChatEvent("token", i, text))
        await asyncio.sleep(0.5)
        async with client() as http, open_sse(http, f"{web}/events/9") as tab:
            mid = await events.publish(ChatEvent("message", 1))  # (one subscription serves a branch's streams)
            while (await tab.next()).last_event_id != mid:
                pass
            caplog.set_level(logging.INFO, logger="tinystore.sse")
            assert sse_module.end_streams() >= 2
            assert await tab.ended(timeout=2.0)  # (the tab that reads got its end, its events first)
            for _ in range(300):  # the stream that waits for the other: given up within END_GRACE (0.5 s)
                if "the server stops and the browser did not take the next event" in caplog.text:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"the stalled stream did not end within 3 s: {caplog.text}")
            await wait_subscriptions(store, 0, within=5.0)
        await asyncio.sleep(0.1)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        sock.close()


# contract: SSE-03
@pytest.mark.parametrize("own", ["0", "1"], ids=["shared", "own-subscription"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_browser_that_reads_nothing_gets_one_reload_when_it_reads_again(
    tmp_path: Path, mode: str, own: str
) -> None:
    """Trial IH: a tab that read nothing (a phone asleep) was told "reload" again each time the kernel took 64 KB
    more of its stream, 44 times in a row: the stream took its drained outbox for a caught-up browser. It is caught
    up once the connection holds little unsent too: one reload, when the tab reads again, with the exact count."""
    async with open_store(mode, tmp_path / "store") as store, serve(make_app(store)) as web:
        sock = await stalled_reader(web, f"/events/10?own={own}")
        loop = asyncio.get_running_loop()
        try:
            await wait_subscriptions(store, 1)
            events = events_of(store).under(10)
            text = "y" * 1000
            total = 8000
            for start in range(0, total, 200):  # (the store's log of 1,024 holds a batch the stream has not taken)
                await asyncio.gather(*(events.publish(ChatEvent("token", i, text)) for i in range(start, start + 200)))
                await asyncio.sleep(0.02)
            await asyncio.sleep(1.0)
            parser = EventStreamParser()
            got: list[int] = []
            reloads: list[dict[str, object]] = []
            async with asyncio.timeout(20):
                while len(got) + sum(int(r["missed"]) for r in reloads) < total:  # type: ignore[call-overload]
                    chunk = await loop.sock_recv(sock, 65536)
                    assert chunk, "the stream ended"
                    for e in parser.feed(chunk):
                        if e.type == "reload":
                            reloads.append(json.loads(e.data))
                        elif e.type == "token":
                            got.append(json.loads(e.data)["id"])
            assert len(reloads) == 1, reloads
            assert got == sorted(got) and len(got) + int(reloads[0]["missed"]) == total  # type: ignore[call-overload]
        finally:
            sock.close()
