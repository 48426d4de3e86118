"""The ASGI response itself: how a stream ends (producer done or raising, server shutting down, a producer far
ahead of its browser, a browser that left), and what a store that cannot serve gives."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tinystore
import tinystore.sse
from tinystore.sse import EventSourceResponse, end_streams, event_stream, sse_response

from ..helpers import open_store
from .harness import client, open_sse, serve, stalled_reader
from .parser import EventStreamParser


def app_of(producer: Any, **kw: Any) -> Starlette:
    async def endpoint(request: Request) -> Response:
        return sse_response(request, producer, **kw)

    return Starlette(routes=[Route("/s", endpoint)])


async def test_the_stream_ends_when_the_producer_returns() -> None:
    async def producer(send: Any, closed: asyncio.Event) -> None:
        await send({"n": 1}, event="a", id="x-1")
        send("two\nlines")  # not awaited: still sent, in order
        send([3], id="")

    async with serve(app_of(producer, retry="2s")) as url, client() as http, open_sse(http, f"{url}/s") as sse:
        assert await sse.ended()
        events = []
        while not sse.events.empty():
            ev = sse.events.get_nowait()
            if ev is not None:
                events.append(ev)
        assert [(e.type, json.loads(e.data), e.last_event_id) for e in events] == [
            ("a", {"n": 1}, "x-1"),
            ("message", "two\nlines", "x-1"),
            ("message", [3], ""),
        ]
        assert sse.parser.retry == 2000
        assert sse.raw.startswith(b": ok\n\nretry: 2000\n\n")


async def test_a_producer_that_raises_ends_its_stream_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def producer(send: Any, closed: asyncio.Event) -> None:
        await send("before")
        raise RuntimeError("boom")

    async with serve(app_of(producer)) as url, client() as http:
        for _ in range(2):  # and the server goes on serving
            async with open_sse(http, f"{url}/s") as sse:
                assert json.loads((await sse.next()).data) == "before"
                assert await sse.ended()
    assert any("boom" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


async def test_closed_is_set_when_the_browser_leaves_and_a_deaf_producer_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tinystore.sse, "STOP_WITHIN", 0.3)
    seen: dict[str, Any] = {}

    async def polite(send: Any, closed: asyncio.Event) -> None:
        await closed.wait()
        seen["polite"] = "returned"

    async def deaf(send: Any, closed: asyncio.Event) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["deaf"] = "cancelled"
            raise

    for name, producer in (("polite", polite), ("deaf", deaf)):
        async with serve(app_of(producer)) as url, client() as http:
            async with open_sse(http, f"{url}/s"):
                await asyncio.sleep(0.1)
            for _ in range(100):
                if name in seen:
                    break
                await asyncio.sleep(0.02)
    assert seen == {"polite": "returned", "deaf": "cancelled"}


async def test_a_producer_far_ahead_of_its_browser_has_its_stream_ended() -> None:
    big = "x" * 10_000
    sent = 0

    async def flood(send: Any, closed: asyncio.Event) -> None:
        nonlocal sent
        while not closed.is_set():  # never awaits send: nothing holds it back but the limit
            send(big)
            sent += 1
            if sent % 100 == 0:
                await asyncio.sleep(0)

    async def endpoint(request: Request) -> Response:
        return EventSourceResponse(flood, max_pending=200_000)

    app = Starlette(routes=[Route("/s", endpoint)])
    async with serve(app) as url, client() as http, http.stream("GET", f"{url}/s") as response:
        # this browser reads nothing; the stream is ended rather than holding an ever-growing backlog
        await asyncio.sleep(1.0)
        got = 0
        async with asyncio.timeout(10):
            async for chunk in response.aiter_raw():
                got += len(chunk)
        assert got < 50_000_000


async def test_a_producer_that_does_not_await_ends_at_its_limit_while_a_write_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Trial HI: a producer that never awaits its sends, to a browser that takes nothing: while the stream's write
    waited (up to STALL, 60 s) for that browser, the events queued behind it without bound (1.7 GB in 20 s). Past
    max_pending the stream ends now, and what waits goes."""
    big = "x" * 10_000
    ended = asyncio.Event()
    queued = 0

    async def flood(send: Any, closed: asyncio.Event) -> None:
        nonlocal queued
        try:
            while not closed.is_set():
                send(big)
                queued += 1
                await asyncio.sleep(0)
        finally:
            ended.set()

    async def endpoint(request: Request) -> Response:
        return EventSourceResponse(flood, max_pending=200_000)

    app = Starlette(routes=[Route("/s", endpoint)])
    async with serve(app) as url:
        sock = await stalled_reader(url, "/s")
        try:
            async with asyncio.timeout(10):  # (not STALL's 60 s)
                await ended.wait()
        finally:
            sock.close()
    assert "bytes of events waited for a browser that did not take them" in caplog.text


async def test_the_end_after_an_overflow_waits_end_grace_not_stall() -> None:
    """Trial HK: an overflow while no write was under way, the connection's buffers full: the stream's last write
    (its end) waited STALL (60 s), the producer not told."""
    outbox = tinystore.sse._Outbox(100)
    outbox.push(b"x" * 80)
    outbox.push(b"y" * 80)
    assert not outbox.overflowed  # (an event that comes when no more than the limit waits goes, however big)
    outbox.push(b"z" * 10)
    assert outbox.overflowed and outbox.size == 0 and outbox.parts == []
    never = asyncio.Event()

    async def send(message: Any) -> None:
        await never.wait()  # a browser that takes nothing

    loop = asyncio.get_running_loop()
    start = loop.time()
    assert not await tinystore.sse._write(send, b"", outbox, more_body=False)
    assert loop.time() - start < 5 * tinystore.sse.END_GRACE


async def test_one_event_bigger_than_max_pending_goes_to_a_browser_that_reads() -> None:
    """Trial HK: an event over max_pending ended the stream of a browser that read at once (and again at each of
    its reconnects), its producer's awaited send resolved as if it went."""
    big = "x" * 150_000

    async def producer(send: Any, closed: asyncio.Event) -> None:
        for i in range(3):
            await send(big, id=str(i))

    async def endpoint(request: Request) -> Response:
        return sse_response(request, producer, max_pending=100_000)

    app = Starlette(routes=[Route("/s", endpoint)])
    async with serve(app) as url, client() as http, open_sse(http, f"{url}/s") as sse:
        got = [(await sse.next()).last_event_id for _ in range(3)]
        assert got == ["0", "1", "2"]
        assert await sse.ended()


async def test_a_big_event_after_a_small_one_not_awaited_goes_to_a_browser_that_reads() -> None:
    """Trial HM: a small event not awaited (still waiting in the loop turn), then one over max_pending: the stream
    ended, the browser got neither, and again at each of its reconnects."""

    async def producer(send: Any, closed: asyncio.Event) -> None:
        send({"status": "start"}, event="status")
        await send("z" * 150_000, event="data", id="1")
        await send({"done": True}, event="done", id="2")

    async def endpoint(request: Request) -> Response:
        return sse_response(request, producer, max_pending=100_000)

    app = Starlette(routes=[Route("/s", endpoint)])
    async with serve(app) as url, client() as http, open_sse(http, f"{url}/s") as sse:
        assert [(await sse.next()).type for _ in range(3)] == ["status", "data", "done"]
        assert await sse.ended()


async def test_a_browser_that_reads_slowly_is_not_cut_while_a_write_waits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial HM: STALL was one write's time, not time without progress: a browser reading 30 KB/s was cut "took
    nothing for 60s" from an 8 MB event, and again at each reconnect."""
    monkeypatch.setattr(tinystore.sse, "STALL", 1.0)
    monkeypatch.setattr(tinystore.sse, "PROGRESS_EVERY", 0.2)
    big = "y" * 1_500_000

    async def producer(send: Any, closed: asyncio.Event) -> None:
        await send(big, id="1")
        await send("end", id="2")

    async def endpoint(request: Request) -> Response:
        return sse_response(request, producer, max_pending=100_000)

    app = Starlette(routes=[Route("/s", endpoint)])
    got = bytearray()
    async with serve(app) as url:
        sock = await stalled_reader(url, "/s")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(30):
                while b"id: 2" not in got[-200:]:  # some 600 KB/s: the event takes some 2.5 s, past STALL
                    chunk = await loop.sock_recv(sock, 16384)
                    if not chunk:
                        break
                    got += chunk
                    await asyncio.sleep(0.025)
        finally:
            sock.close()
    assert b"id: 2" in got and got.count(b"y") >= 1_500_000
    assert "took nothing" not in caplog.text


async def test_a_steady_slow_reader_behind_a_full_socket_is_not_cut(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial HO: the progress looked at was the transport's buffer alone, which stays still while the kernel's
    (megabytes, on loopback) drains to a slow reader: steady readers of 10 to 20 KB/s were cut all the same."""
    monkeypatch.setattr(tinystore.sse, "STALL", 1.0)
    monkeypatch.setattr(tinystore.sse, "PROGRESS_EVERY", 0.2)
    chunk = "x" * 100_000

    async def producer(send: Any, closed: asyncio.Event) -> None:
        while not closed.is_set():
            await send(chunk)  # at the browser's pace

    app = Starlette(routes=[Route("/s", lambda request: sse_response(request, producer))])
    got = 0
    async with serve(app) as url:
        sock = await stalled_reader(url, "/s")
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0.3)  # (the server's buffers fill, within STALL)
            ends = loop.time() + 4.0  # four STALLs of steady reading, some 100 KB/s
            while loop.time() < ends:
                data = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
                assert data, "the stream was ended"
                got += len(data)
                await asyncio.sleep(0.04)
        finally:
            sock.close()
    assert got > 100_000
    assert "took nothing" not in caplog.text


async def test_an_overflow_as_a_writes_deadline_fires_is_no_error_of_send() -> None:
    """Trial HM: an overflow (or end()) in the loop turn where a write's deadline had fired but its cancel had not
    landed: send raised RuntimeError "Cannot change state of expiring Timeout"."""
    outbox = tinystore.sse._Outbox(10)
    raised: list[BaseException] = []

    async def write() -> None:
        async with asyncio.timeout(0.05) as deadline:
            outbox.writing = deadline
            loop.call_at(deadline.when() or 0.0, overflow)  # (after the deadline's own callback, in its turn)
            await asyncio.sleep(5)

    def overflow() -> None:
        try:
            assert outbox.writing is not None and outbox.writing.expired()
            outbox.push(b"x" * 20)
            outbox.push(b"y" * 20)
            outbox.end()
        except BaseException as exc:
            raised.append(exc)

    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await write()
    assert raised == [] and outbox.overflowed


async def test_a_producer_that_sends_on_after_its_stream_ended_lets_the_loop_run() -> None:
    """Trial HK: after the stream ended, an awaited send was a future already done, which never lets the loop run:
    a producer that sent on, never looking at ``closed``, held the process at 100 % CPU (its cancel at STOP_WITHIN,
    every other request, a SIGTERM: none ran)."""
    ticks = 0
    during: int | None = None
    done = asyncio.Event()

    async def producer(send: Any, closed: asyncio.Event) -> None:
        nonlocal during
        await send("first")
        await closed.wait()
        before = ticks
        for i in range(1000):
            await send(i)  # never looks at closed
        during = ticks - before
        done.set()

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    beat = asyncio.ensure_future(ticker())
    try:
        async with serve(app_of(producer)) as url:
            async with client() as http, open_sse(http, f"{url}/s") as sse:
                await sse.next()
            async with asyncio.timeout(10):
                await done.wait()
    finally:
        beat.cancel()
    assert during is not None and during >= 500


async def test_end_streams_finishes_every_open_stream(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        events = store.channel("e")

        async def endpoint(request: Request) -> Response:
            return event_stream(events.under(1), request)

        app = Starlette(routes=[Route("/s", endpoint)])
        async with serve(app) as url, client() as http:
            async with open_sse(http, f"{url}/s") as a, open_sse(http, f"{url}/s") as b:
                await events.under(1).publish({"last": True})
                for s in (a, b):
                    assert json.loads((await s.next()).data) == {"last": True}
                assert end_streams() >= 2
                assert await a.ended() and await b.ended()
            assert (await store.status())["channels"]["subscriptions"] == 0


# contract: SSE-03
async def test_a_store_at_its_subscription_limit_or_closed_gives_503(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(subscriptions=2)) as store:
        events = store.channel("e")

        async def endpoint(request: Request) -> Response:
            return event_stream(events.under(request.path_params["n"]), request)

        app = Starlette(routes=[Route("/s/{n}", endpoint)])
        async with serve(app) as url, client() as http:
            async with open_sse(http, f"{url}/s/1"), open_sse(http, f"{url}/s/2"), open_sse(http, f"{url}/s/2"):
                # two branches, two subscriptions (the streams of one branch share one): the store's limit
                r = await asyncio.wait_for(http.get(f"{url}/s/3"), 5)
                assert r.status_code == 503
                assert "subscriptions" in r.text and r.headers["retry-after"]
            await store.close()
            r = await asyncio.wait_for(http.get(f"{url}/s/1"), 5)
            assert r.status_code == 503 and "closed" in r.text
            # from trial AV: an EventSource takes any status but 200 as the end for good (it never tried again):
            # to one, a stream that ends at once, with a retry delay, so that it tries again then
            r = await asyncio.wait_for(http.get(f"{url}/s/1", headers={"accept": "text/event-stream"}), 5)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            parser = EventStreamParser()
            assert parser.feed(r.content) == []  # no event: the page is told nothing happened
            assert parser.retry == 5000 and any("closed" in c for c in parser.comments), (r.text, parser.comments)


def test_bad_options_are_refused() -> None:
    with pytest.raises(tinystore.InvalidError):
        EventSourceResponse(lambda s, c: None, keepalive="0s")
    with pytest.raises(tinystore.InvalidError):
        EventSourceResponse(lambda s, c: None, keepalive="soon")
    with pytest.raises(tinystore.InvalidError):
        EventSourceResponse(lambda s, c: None, retry=-1)


async def test_arguments_given_the_other_way_round_are_refused_at_the_call(tmp_path: Path) -> None:
    """sse_response takes (request, producer) and event_stream (branch, request): a swap is an error naming
    both, not a 200 with an empty stream and a log line."""
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    request = Request(scope)

    async def producer(send: Any, closed: asyncio.Event) -> None:
        return None

    swapped = r"sse_response\(request, producer\): got a function and a Request"
    with pytest.raises(tinystore.InvalidError, match=swapped):
        sse_response(producer, request)  # type: ignore[arg-type]
    async with open_store("embedded", tmp_path / "s") as store:
        events = store.channel("events", dict)
        swapped = r"event_stream\(branch, request\): got a Request and a Channel"
        with pytest.raises(tinystore.InvalidError, match=swapped):
            event_stream(request, events.under(1))  # type: ignore[arg-type]
    sse_response(request, producer)  # the right way round: a response


def test_uvicorns_error_for_a_stream_given_up_is_left_out_once_and_briefly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The filter of uvicorn's "returned without completing response" drops one such line for each stream this
    module gave up, logged as it returns; never one of another route later (trial FI)."""
    import logging
    import time

    import tinystore.sse as sse_module

    monkeypatch.setattr(sse_module, "UNFINISHED_WITHIN", 0.05)
    uvicorn_log = logging.getLogger("uvicorn.error")
    caplog.set_level(logging.ERROR, logger="uvicorn.error")
    sse_module._left_unfinished()
    uvicorn_log.error(sse_module._UNFINISHED)  # the stream's own: left out
    uvicorn_log.error(sse_module._UNFINISHED)  # another's, at once after: kept
    sse_module._left_unfinished()  # one whose line never came (its browser went away meanwhile) ...
    time.sleep(0.1)
    uvicorn_log.error(sse_module._UNFINISHED)  # ... hides no later one
    uvicorn_log.error("Exception in ASGI application")
    assert [r.getMessage() for r in caplog.records] == [sse_module._UNFINISHED] * 2 + ["Exception in ASGI application"]


async def test_a_producer_awaiting_a_write_given_up_goes_on_and_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """From trial FJ: a write given up (a browser that took nothing for STALL) left the producer that awaited it
    waiting, until it was cancelled STOP_WITHIN later, with a WARNING; it is let go, sees ``closed``, returns."""
    monkeypatch.setattr(tinystore.sse, "STALL", 0.5)
    ended: list[str] = []

    async def producer(send: Any, closed: asyncio.Event) -> None:
        try:
            for i in range(400):
                await send({"i": i, "pad": "p" * 60_000})
                if closed.is_set():
                    break
            ended.append("returned")
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async with serve(app_of(producer)) as url:
        sock = await stalled_reader(url, "/s")
        try:
            for _ in range(400):
                if ended:
                    break
                await asyncio.sleep(0.01)
            assert ended == ["returned"]
        finally:
            sock.close()


# contract: SSE-03
async def test_a_stream_asked_for_while_the_store_is_down_gives_503_in_seconds_and_streams_once_it_is_back(
    tmp_path: Path,
) -> None:
    # trial IQ: with the store stopped, the 503 came after the SDK's reconnect_timeout (30 s), the browser's
    # EventSource "connecting" all that time
    import time

    from ..helpers import ServerProcess

    server = ServerProcess(tmp_path / "s").start()
    store = await tinystore.open(tmp_path / "s")
    try:
        events = store.channel("e")

        async def endpoint(request: Request) -> Response:
            return event_stream(events.under("1"), request)

        app = Starlette(routes=[Route("/s", endpoint)])
        async with serve(app) as url, client() as http:
            server.stop()
            began = time.monotonic()
            r = await asyncio.wait_for(http.get(f"{url}/s"), 20)
            took = time.monotonic() - began
            assert r.status_code == 503 and "not reached within 5s" in r.text and r.headers["retry-after"] == "5"
            assert took < 10, took
            server.start()
            async with open_sse(http, f"{url}/s") as s:
                await events.under("1").publish({"back": True})
                assert json.loads((await s.next()).data) == {"back": True}
    finally:
        await store.close()
        server.stop()
