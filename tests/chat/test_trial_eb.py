"""Trial EB of the live chat: cross-site and DNS-rebinding requests refused, an oversized body refused before it is
read, a message of zero-width characters refused, a huge chat id named as given, a failed send kept flagged, and a
store's error not blamed on the model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import tinystore

from ..browser.conftest import ARGS, CHROMIUM
from ..helpers import open_store
from ..sse.harness import client, open_sse, serve
from .example import app as app_module
from .example import fast_model, service

HUGE = "99999999999999999999999"  # past 2^64, and past 2^53 (where a JavaScript number rounds: 1e+23)
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]


@contextlib.asynccontextmanager
async def chat_app(tmp_path: Path, *, server: tuple[str, int] | None = None, **kw: Any) -> AsyncIterator[str]:
    """The chat app on an embedded store, served on 127.0.0.1; yields its base URL. ``server``: the address its
    requests seem to come in on (the ASGI scope's ``server``), a LAN one standing for a connection from the network
    (one that came over loopback is Host-checked whatever the app listens on, trial ED)."""
    async with open_store("embedded", tmp_path / "store") as store:
        app = app_module.create_app(store=store, model=fast_model(), **kw)

        async def seen_from(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and server is not None:
                scope = {**scope, "server": server}
            await app(scope, receive, send)

        async with serve(seen_from, lifespan="on") as url:
            yield url


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[str]:
    async with chat_app(tmp_path) as url:
        yield url


async def new_chat(http: httpx.AsyncClient, web: str) -> int:
    r = await http.post(f"{web}/api/chats", json={"title": "eb"})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


# ------------------------------------------------------------------------------------ 1. CSRF and DNS rebinding


async def test_a_cross_site_post_is_refused_and_saves_nothing(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        url = f"{web}/api/chats/{chat_id}/messages"
        evil = {"origin": "http://evil.example"}
        # the tester's curl: a "simple request" (text/plain), which a browser sends cross-site without asking
        r = await http.post(url, content=b'{"text":"csrf"}', headers={**evil, "content-type": "text/plain"})
        assert r.status_code == 403 and "Content-Type: application/json" in r.json()["error"], r.text
        assert "'text/plain'" in r.json()["error"]
        for headers in [
            {"content-type": "text/plain"},  # no Origin: still not JSON
            {},  # no Content-Type at all
            {"content-type": "application/x-www-form-urlencoded"},
            {"content-type": "multipart/form-data; boundary=x"},
        ]:
            r = await http.post(url, content=b'{"text":"csrf"}', headers=headers)
            assert r.status_code == 403 and "application/json" in r.json()["error"], (headers, r.text)
        # JSON from another origin (a preflight it would need is never granted, but a client may skip it)
        port = web.rsplit(":", 1)[1]
        for origin in ["http://evil.example", f"http://evil.example:{port}", "http://127.0.0.1:1", "null"]:
            r = await http.post(url, json={"text": "csrf"}, headers={"origin": origin})
            assert r.status_code == 403 and f"another origin ({origin})" in r.json()["error"], (origin, r.text)
        for method in ["PUT", "PATCH", "DELETE"]:
            r = await http.request(method, url, content=b"{}", headers={**evil, "content-type": "text/plain"})
            assert r.status_code == 403, (method, r.text)
        r = await http.post(f"{web}/api/chats", content=b"{}", headers={**evil, "content-type": "text/plain"})
        assert r.status_code == 403
        assert (await http.get(url)).json() == []  # nothing was saved
        assert [c["id"] for c in (await http.get(f"{web}/api/chats")).json()] == [chat_id]
        # the page's own requests: JSON, from its own origin (any spelling of the same host and port)
        same: list[tuple[str | None, str]] = [
            (web, "application/json"),
            (f"http://127.0.0.1:{port}", "application/json; charset=utf-8"),
            (None, "Application/JSON"),
        ]
        for own, ctype in same:
            headers = {"content-type": ctype, **({"origin": own} if own else {})}
            r = await http.post(url, content=json.dumps({"text": "mine"}).encode(), headers=headers)
            assert r.status_code == 201, (own, ctype, r.text)
        r = await http.post(
            url,
            json={"text": "via localhost"},
            headers={"host": f"localhost:{port}", "origin": f"http://localhost:{port}"},
        )
        assert r.status_code == 201, r.text


async def test_a_host_that_names_no_loopback_is_refused_when_listening_on_loopback(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        port = web.rsplit(":", 1)[1]
        # a DNS-rebinding page: its own name, pointed at 127.0.0.1, in the Host it sends
        for host in ["attacker.example:8000", f"attacker.example:{port}", "attacker.example", "127.0.0.1.nip.io"]:
            r = await http.post(f"{web}/api/chats", json={"title": "x"}, headers={"host": host})
            assert r.status_code == 403 and f"the Host header {host!r}" in r.json()["error"], (host, r.text)
            for path in ["/api/chats", f"/api/chats/{chat_id}/messages", f"/api/chats/{chat_id}", "/"]:
                r = await http.get(f"{web}{path}", headers={"host": host})
                assert r.status_code == 403, (host, path, r.text)
        assert len((await http.get(f"{web}/api/chats")).json()) == 1  # no chat was made
        for host in [f"localhost:{port}", "localhost", f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}", "[::1]"]:
            r = await http.get(f"{web}/api/chats/{chat_id}/messages", headers={"host": host})
            assert r.status_code == 200, (host, r.text)
        # the demo's health probe sends a Host of its own: /healthz answers it (it says nothing of the chats)
        assert (await http.get(f"{web}/healthz", headers={"host": "tinystore-demo"})).status_code == 200
        # the page, its script and its live events still work
        assert (await http.get(f"{web}/chats/{chat_id}")).status_code == 200
        r = await http.get(f"{web}/static/app.js")
        assert r.status_code == 200 and "application/json" in r.text
        async with open_sse(http, f"{web}/api/chats/{chat_id}/events") as tab:
            assert (await http.post(f"{web}/api/chats/{chat_id}/messages", json={"text": "hi"})).status_code == 201
            assert (await tab.next()).type == "message"


async def test_a_demo_exposed_on_the_network_takes_any_host_but_still_refuses_cross_site_posts(tmp_path: Path) -> None:
    async with chat_app(tmp_path, listen_host="0.0.0.0", server=("192.168.1.5", 8000)) as web, client() as http:
        chat_id = await new_chat(http, web)
        name = {"host": "laptop.lan:8000"}  # as a phone on the network names it
        assert (await http.get(f"{web}/api/chats/{chat_id}/messages", headers=name)).status_code == 200
        r = await http.post(
            f"{web}/api/chats/{chat_id}/messages",
            json={"text": "from the phone"},
            headers={**name, "origin": "http://laptop.lan:8000"},
        )
        assert r.status_code == 201, r.text
        r = await http.post(
            f"{web}/api/chats/{chat_id}/messages",
            json={"text": "csrf"},
            headers={**name, "origin": "http://evil.example"},
        )
        assert r.status_code == 403
        r = await http.post(
            f"{web}/api/chats/{chat_id}/messages", content=b'{"text":"csrf"}', headers={"content-type": "text/plain"}
        )
        assert r.status_code == 403


def test_which_connections_have_their_host_checked() -> None:
    def checks(listen_host: str | None, server: tuple[str, int] | None) -> bool:
        guard = app_module.Guard(None, listen_host=listen_host)
        return bool(guard.checks_host({"type": "http", "server": server}))

    for loopback in ["127.0.0.1", "localhost", "::1", "127.0.0.2"]:
        assert checks(loopback, ("192.168.1.5", 8000))
    for exposed in ["0.0.0.0", "::", "192.168.1.5"]:
        assert not checks(exposed, ("192.168.1.5", 8000))
        assert checks(exposed, ("127.0.0.1", 8000))  # over loopback, always (trial ED)
    # without the address it listens on: the address the connection came in on decides
    assert checks(None, ("127.0.0.1", 8000)) and checks(None, ("::1", 8000))
    assert not checks(None, ("192.168.1.5", 8000)) and not checks(None, None)


# ------------------------------------------------------------------------------------ 2. an oversized body


async def _raw_request(web: str, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = web.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    return reader, writer


async def test_a_body_over_the_limit_is_refused_from_its_content_length_before_it_is_read(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
    head = (
        f"POST /api/chats/{chat_id}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {400 * 1024 * 1024}\r\n\r\n"
    ).encode()
    reader, writer = await _raw_request(web, head + b"x" * 1024)  # a 400 MiB body that has hardly begun
    try:
        status = await asyncio.wait_for(reader.readline(), 5)  # (it used to wait for all 400 MiB)
        assert status.split(b" ")[1] == b"413", status
        rest = await asyncio.wait_for(reader.read(4096), 5)
        assert b"over 64 KiB" in rest, rest
    finally:
        writer.close()


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
    head = (
        f"POST /api/chats/{chat_id}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    reader, writer = await _raw_request(web, head)
    try:
        chunk = b"x" * 16 * 1024
        for _ in range(6):  # 96 KiB, and the body does not end: no Content-Length tells its size
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        assert status.split(b" ")[1] == b"413", status
    finally:
        writer.close()

    async def pieces() -> AsyncIterator[bytes]:
        yield b'{"text": '
        yield b'"chunked"}'

    async with client() as http:  # a body under the limit, chunked, is read as before
        r = await http.post(
            f"{web}/api/chats/{chat_id}/messages",
            content=pieces(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 201 and r.json()["text"] == "chunked", r.text


# ------------------------------------------------------------------------------------ 3. zero-width characters


async def test_a_message_of_only_zero_width_characters_needs_some_text(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        url = f"{web}/api/chats/{chat_id}/messages"
        for text in [*INVISIBLE, "".join(INVISIBLE), " \u200b \n\ufeff\t", "\u200b" * 50]:
            r = await http.post(url, json={"text": text})
            assert r.status_code == 400 and r.json()["error"] == "a message needs some text", (text, r.text)
        assert (await http.get(url)).json() == []
        r = await http.post(url, json={"text": "a\u200bb"})  # text with a zero-width character in it is text
        assert r.status_code == 201 and r.json()["text"] == "a\u200bb"
    assert not service.has_text("\u2060 \u200d") and service.has_text(" x\u200c")


# ------------------------------------------------------------------------------------ 4. a huge chat id


async def test_an_id_past_64_bits_is_a_404_on_every_route(web: str) -> None:
    async with client() as http:
        await new_chat(http, web)
        for chat_id in [HUGE, str(2**64), str(2**63), "0" * 30 + "1" + "0" * 30]:
            assert (await http.get(f"{web}/chats/{chat_id}")).status_code == 200  # the page, which says so
            for method, path in [
                ("GET", ""),
                ("GET", "/messages"),
                ("GET", "/events"),
                ("POST", "/messages"),
            ]:
                r = await http.request(method, f"{web}/api/chats/{chat_id}{path}", json={"text": "hi"})
                assert r.status_code == 404 and "does not exist" in r.json()["error"], (chat_id, path, r.text)


# ------------------------------------------------------------------------------------ 6. the store's errors


class Failing:
    """A model whose answer raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
        yield "partial "
        raise self.error

    async def summarize(self, history: Sequence[Any]) -> str:
        return ""


async def test_a_store_error_while_answering_is_logged_as_the_stores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dropped = tinystore.OutcomeUnknownError("channels.publish: the connection dropped")
    async with open_store("embedded", tmp_path / "s") as store:
        for error, said, not_said in [
            (dropped, "could not reach the store while answering message", "the model failed"),
            (RuntimeError("429 rate limited"), "the model failed answering message", "could not reach the store"),
            (tinystore.PermanentError("401 wrong key"), "the model failed answering message", "could not reach"),
        ]:
            chat = await service.Chat(store, Failing(error)).open()
            created = await chat.create_chat("t")
            message = await chat.post(created["id"], "hello")
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="chat"), pytest.raises(type(error)):
                run = SimpleNamespace(attempt=1, set_progress=lambda progress: None)
                await chat.reply(service.Ask(created["id"], message["id"]), run)
            logged = "\n".join(r.getMessage() for r in caplog.records)
            assert said in logged and not_said not in logged, logged
            assert f"message {message['id']}" in logged


# ------------------------------------------------------------------------------------ 4, 5 and 3: the page

browser_test = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing")


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    """A chromium page (Playwright) and the URL of the chat app, served in this test's loop."""
    from playwright.async_api import async_playwright

    async with chat_app(tmp_path) as url, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            ctx = await browser.new_context()
            yield await ctx.new_page(), url
        finally:
            await browser.close()


@pytest.mark.browser
@browser_test
async def test_the_page_names_a_huge_chat_id_as_given(page: tuple[Any, str]) -> None:
    tab, url = page
    await tab.goto(url)
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)
    await tab.goto(f"{url}/chats/{HUGE}")
    await tab.wait_for_selector('#status[data-state="not found"]', timeout=10_000)
    error = await tab.locator("#error").inner_text()
    assert f"There is no chat {HUGE}:" in error, error  # (it said "There is no chat 1e+23")
    await tab.click("#chats a")  # a chat of the list opens, live, and is marked the current one
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)
    assert await tab.locator("#chats a.current").count() == 1


@pytest.mark.browser
@browser_test
async def test_a_failed_send_stays_flagged_until_sent_again_or_cleared(page: tuple[Any, str]) -> None:
    tab, url = page
    requests: list[tuple[str, str | None]] = []
    tab.on("request", lambda r: requests.append((r.method, r.headers.get("content-type"))))
    await tab.goto(url)  # makes the first chat (a POST) and goes to it
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)

    async def unreachable(route: Any) -> None:
        if route.request.method == "POST":
            body = json.dumps({"error": "the store cannot be reached"})
            await route.fulfill(status=503, content_type="application/json", body=body)
        else:
            await route.continue_()

    await tab.route("**/api/chats/*/messages", unreachable)
    await tab.fill("#text", "a question")
    await tab.press("#text", "Enter")
    await tab.wait_for_selector("#error:not([hidden])", timeout=5_000)
    flagged = "not sent: the store cannot be reached (press Send to try again)"
    assert flagged in await tab.inner_text("#error")
    # the store is back: the page reads the chat again, and says "live" (it used to clear the error line here)
    await tab.unroute("**/api/chats/*/messages")
    await tab.evaluate("refresh(); loadChat()")
    await tab.wait_for_function("!fetching")
    await asyncio.sleep(0.3)
    assert await tab.is_visible("#error") and flagged in await tab.inner_text("#error")
    assert await tab.input_value("#text") == "a question"
    # sent again: the flag goes, and the message is saved
    await tab.press("#text", "Enter")
    await tab.wait_for_selector("#messages li.msg.user[data-id]", timeout=5_000)
    await tab.wait_for_selector("#error", state="hidden", timeout=5_000)
    # a failure, then the box cleared: the flag goes with the text
    await tab.route("**/api/chats/*/messages", unreachable)
    await tab.fill("#text", "another")
    await tab.press("#text", "Enter")
    await tab.wait_for_selector("#error:not([hidden])", timeout=5_000)
    await tab.fill("#text", "")
    await tab.wait_for_selector("#error", state="hidden", timeout=5_000)
    # every POST of the page says it sends JSON (the server refuses one that does not)
    posts = [ctype for method, ctype in requests if method == "POST"]
    assert len(posts) == 4 and all(c == "application/json" for c in posts), posts


@pytest.mark.browser
@browser_test
async def test_the_page_does_not_send_a_message_of_only_zero_width_characters(page: tuple[Any, str]) -> None:
    tab, url = page
    posts: list[str] = []
    tab.on("request", lambda r: posts.extend([r.url] if r.method == "POST" and "/messages" in r.url else []))
    await tab.goto(url)
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)
    for text in ["\u200b", " \u200c\u200d \u2060\ufeff "]:
        await tab.fill("#text", text)
        await tab.press("#text", "Enter")
    await asyncio.sleep(0.5)
    assert posts == [] and await tab.locator("#messages li").count() == 0
