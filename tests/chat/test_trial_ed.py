"""Trial ED of the live chat: a connection over loopback Host-checked whatever the demo listens on, every loopback
address a name it answers, a client gone mid-body ending its request quietly, blank-looking messages and titles
refused (on the page as on the server), and the page's drafts, retry hints and ids."""

from __future__ import annotations

import asyncio
import json
import logging
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ..browser.conftest import ARGS, CHROMIUM
from ..sse.harness import client
from .example import app as app_module
from .example import service
from .test_trial_eb import _raw_request, browser_test, chat_app, new_chat

BLANK_LOOKING = ["\u3164", "\u2800", "\u00ad\u200e\u3164", "\x85", " \x85 ", "\u115f\u1160\uffa0", "\u2028\u00a0\u180e"]


# ------------------------------------------------------------------------------------ 1. loopback is always checked


def test_a_connection_over_loopback_is_host_checked_whatever_the_demo_listens_on() -> None:
    def checks(listen_host: str | None, server: tuple[str, int] | None) -> bool:
        guard = app_module.Guard(None, listen_host=listen_host)
        return bool(guard.checks_host({"type": "http", "server": server}))

    for listen_host in [None, "0.0.0.0", "::", "192.168.1.5", "127.0.0.1", "localhost"]:
        for loopback in ["127.0.0.1", "::1", "127.0.0.2", "::ffff:127.0.0.1"]:  # (the last: a dual-stack socket's)
            assert checks(listen_host, (loopback, 8000)), (listen_host, loopback)  # (0.0.0.0 checked none)
    for exposed in ["0.0.0.0", "::", "192.168.1.5", None]:  # from the network: any name
        for network in ["192.168.1.5", "::ffff:192.168.1.5", "fe80::1"]:
            assert not checks(exposed, (network, 8000)), (exposed, network)
        assert not checks(exposed, None)
    assert checks("127.0.0.1", ("192.168.1.5", 8000))  # listening on loopback: every request


async def test_a_rebinding_page_over_loopback_is_refused_with_host_0_0_0_0(tmp_path: Path) -> None:
    async with chat_app(tmp_path, listen_host="0.0.0.0") as web, client() as http:  # (served on 127.0.0.1)
        chat_id = await new_chat(http, web)
        port = web.rsplit(":", 1)[1]
        rebind = {"host": f"rebind.test:{port}"}
        for path in ["/api/chats", f"/api/chats/{chat_id}/messages", f"/api/chats/{chat_id}", "/"]:
            r = await http.get(f"{web}{path}", headers=rebind)
            assert r.status_code == 403 and "names no loopback address" in r.json()["error"], (path, r.text)
        r = await http.post(
            f"{web}/api/chats/{chat_id}/messages",
            json={"text": "rebound"},
            headers={**rebind, "origin": f"http://rebind.test:{port}"},
        )
        assert r.status_code == 403, r.text
        assert (await http.get(f"{web}/api/chats/{chat_id}/messages")).json() == []
        r = await http.post(f"{web}/api/chats/{chat_id}/messages", json={"text": "mine"})  # Host 127.0.0.1: mine
        assert r.status_code == 201, r.text


# ------------------------------------------------------------------------------------ 3. every loopback address


def test_a_host_naming_any_loopback_address_is_loopback() -> None:
    names = app_module._names_loopback
    for host in ["localhost", "127.0.0.1", "127.0.0.2", "127.255.255.254", "[::1]", "[0:0:0:0:0:0:0:1]"]:
        assert names(host), host
    for host in ["localhost.", "[::ffff:127.0.0.1]"]:  # (trial EE: refused)
        assert names(host), host
    for host in ["rebind.test", "127.0.0.1.nip.io", "128.0.0.1", "[127.0.0.1]", "::1", "[::2]", "0.0.0.0", ""]:
        assert not names(host), host
    for host in ["::ffff:127.0.0.1", "[::ffff:128.0.0.1]", "localhost.evil.example", "localhost.."]:
        assert not names(host), host


async def test_the_address_of_host_127_0_0_2_is_served(tmp_path: Path) -> None:
    async with chat_app(tmp_path, listen_host="127.0.0.2") as web, client() as http:
        port = web.rsplit(":", 1)[1]
        for host in [f"127.0.0.2:{port}", "127.9.8.7", f"[::1]:{port}", f"LOCALHOST:{port}"]:
            r = await http.post(
                f"{web}/api/chats", json={"title": "t"}, headers={"host": host, "origin": f"http://{host}"}
            )
            assert r.status_code == 201, (host, r.text)  # (it said "names no loopback address")
            assert (await http.get(f"{web}/api/chats", headers={"host": host})).status_code == 200
        r = await http.get(f"{web}/api/chats", headers={"host": f"rebind.test:{port}"})
        assert r.status_code == 403 and "127.x.x.x" in r.json()["error"], r.text


# ------------------------------------------------------------------------------------ 4. a client gone mid-body


async def test_a_client_that_goes_away_mid_body_ends_its_request_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with chat_app(tmp_path) as web, client() as http:
        chat_id = await new_chat(http, web)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="chat"):
            for path in [f"/api/chats/{chat_id}/messages", "/api/chats"]:
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: 1000\r\n\r\n"
                ).encode()
                _, writer = await _raw_request(web, head + b'{"text": "half')  # and then it goes
                writer.close()
                await writer.wait_closed()
            for _ in range(100):
                if sum("went away" in r.getMessage() for r in caplog.records) >= 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert not errors, [(r.name, r.getMessage(), r.exc_text) for r in errors]  # (a 44-line traceback each)
        gone = [r for r in caplog.records if "went away" in r.getMessage()]
        assert len(gone) == 2 and all(r.levelno == logging.DEBUG and not r.exc_info for r in gone), gone
        assert (await http.get(f"{web}/api/chats/{chat_id}/messages")).json() == []  # nothing saved; still serving


# ------------------------------------------------------------------------------------ 7. blank-looking text


async def test_blank_looking_messages_are_refused_and_titles_get_the_default(tmp_path: Path) -> None:
    for text in BLANK_LOOKING:
        assert not service.has_text(text), ascii(text)
    for text in ["a\u3164", "\u2800x", "\u00e9", "\u0301", "\U0001f600", "\u00ad-"]:
        assert service.has_text(text), ascii(text)
    async with chat_app(tmp_path) as web, client() as http:
        chat_id = await new_chat(http, web)
        url = f"{web}/api/chats/{chat_id}/messages"
        for text in BLANK_LOOKING:
            r = await http.post(url, json={"text": text})
            assert r.status_code == 400 and r.json()["error"] == "a message needs some text", (ascii(text), r.text)
        assert (await http.get(url)).json() == []
        for title in ["\u200b", " \u3164 ", "\u2800", "\u00ad\u200e", ""]:
            r = await http.post(f"{web}/api/chats", json={"title": title})
            assert r.status_code == 201 and r.json()["title"] == "New chat", (ascii(title), r.text)
        r = await http.post(f"{web}/api/chats", json={"title": " a\u200b "})
        assert r.status_code == 201 and r.json()["title"] == "a\u200b"


# ------------------------------------------------------------------------------------ the page


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


def _fail_posts(status: int, error: str, gate: asyncio.Event | None = None) -> Any:
    """A Playwright route that answers every POST with ``status`` and ``error`` (after ``gate``, if given), and lets
    the rest through; ``status`` 0: the network fails."""

    async def handle(route: Any) -> None:
        if route.request.method != "POST":
            await route.continue_()
            return
        if gate is not None:
            await gate.wait()
        if status == 0:
            await route.abort("connectionreset")
        else:
            await route.fulfill(status=status, content_type="application/json", body=json.dumps({"error": error}))

    return handle


async def _open(tab: Any, url: str) -> None:
    await tab.goto(url)
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)


async def _click_chat(tab: Any, chat_id: int) -> None:
    await tab.click(f'#chats a[data-id="{chat_id}"]')
    await tab.wait_for_function(f'state.chatId === "{chat_id}"')
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)


@pytest.mark.browser
@browser_test
async def test_a_failed_send_stays_in_its_own_chat(page: tuple[Any, str]) -> None:
    tab, url = page
    async with client() as http:
        a, b = await new_chat(http, url), await new_chat(http, url)
    posts: list[tuple[str, Any]] = []
    tab.on("request", lambda r: posts.extend([(r.url, r.post_data)] if r.method == "POST" else []))
    await _open(tab, f"{url}/chats/{b}")
    await tab.route("**/api/chats/*/messages", _fail_posts(503, "the store cannot be reached"))
    await tab.fill("#text", "for B")
    await tab.press("#text", "Enter")
    await tab.wait_for_selector("#error:not([hidden])", timeout=5_000)
    flagged = "not sent: the store cannot be reached (press Send to try again)"
    assert flagged in await tab.inner_text("#error")
    # chat A: its own (empty) box, no flag; and Send there posts nothing of B's (it posted "for B" into A)
    await _click_chat(tab, a)
    assert await tab.input_value("#text") == ""
    assert not await tab.is_visible("#error")
    await tab.unroute("**/api/chats/*/messages")
    await tab.press("#text", "Enter")
    await tab.fill("#text", "for A, half typed")
    # back to B: its text and its flag; A's draft waits in A
    await _click_chat(tab, b)
    assert await tab.input_value("#text") == "for B"
    assert flagged in await tab.inner_text("#error")
    await _click_chat(tab, a)
    assert await tab.input_value("#text") == "for A, half typed" and not await tab.is_visible("#error")
    await _click_chat(tab, b)
    await tab.press("#text", "Enter")  # sent again, in B
    await tab.wait_for_selector("#messages li.msg.user[data-id]", timeout=5_000)
    await tab.wait_for_selector("#error", state="hidden", timeout=5_000)
    # a send that fails after the user left its chat: the failure waits in that chat's draft, not in the box
    gate = asyncio.Event()
    await tab.route("**/api/chats/*/messages", _fail_posts(503, "the store cannot be reached", gate))
    await tab.fill("#text", "late B")
    await tab.press("#text", "Enter")
    await _click_chat(tab, a)
    gate.set()
    await tab.wait_for_function("state.drafts.get(" + json.dumps(str(b)) + ")?.unsent != null", timeout=5_000)
    await asyncio.sleep(0.2)
    assert await tab.input_value("#text") == "for A, half typed" and not await tab.is_visible("#error")
    await _click_chat(tab, b)
    assert await tab.input_value("#text") == "late B" and flagged in await tab.inner_text("#error")
    sent = [(u.rsplit("/chats/", 1)[1], json.loads(d)["text"]) for u, d in posts if "/messages" in u]
    assert sent == [(f"{b}/messages", "for B"), (f"{b}/messages", "for B"), (f"{b}/messages", "late B")], sent
    async with client() as http:
        assert (await http.get(f"{url}/api/chats/{a}/messages")).json() == []


@pytest.mark.browser
@browser_test
async def test_try_again_is_offered_only_when_trying_again_may_help(page: tuple[Any, str]) -> None:
    tab, url = page
    await _open(tab, url)
    for status, error, retry in [
        (400, "a message needs some text", False),
        (413, "a message has at most 4000 characters, this one has 5000", False),
        (403, "a POST from another origin (x) is refused: this demo takes them from its own page", False),
        (503, "the store cannot be reached", True),
        (500, "boom", True),
        (0, "", True),  # the network
    ]:
        await tab.route("**/api/chats/*/messages", _fail_posts(status, error))
        await tab.fill("#text", f"try {status}")
        await tab.press("#text", "Enter")
        await tab.wait_for_selector("#error:not([hidden])", timeout=5_000)
        shown = await tab.inner_text("#error")
        assert "not sent: " + (error or "the server cannot be reached") in shown, (status, shown)
        assert ("press Send to try again" in shown) == retry, (status, shown)
        assert await tab.input_value("#text") == f"try {status}"  # kept in the box either way
        await tab.unroute("**/api/chats/*/messages")
        await tab.fill("#text", "")
        await tab.wait_for_selector("#error", state="hidden", timeout=5_000)


@pytest.mark.browser
@browser_test
async def test_the_page_and_the_server_agree_on_what_is_blank(page: tuple[Any, str]) -> None:
    tab, url = page
    posts: list[str] = []
    tab.on("request", lambda r: posts.extend([r.url] if r.method == "POST" and "/messages" in r.url else []))
    await _open(tab, url)
    for text in BLANK_LOOKING:
        await tab.fill("#text", text)
        await tab.press("#text", "Enter")
    await asyncio.sleep(0.5)
    assert posts == [] and await tab.locator("#messages li").count() == 0  # ("\x85" was sent, and refused)
    # every code point: blank on the page where it is on the server (where Python's Unicode assigns it)
    page_blank = await tab.evaluate(
        """() => {
            const found = [];
            for (let cp = 0; cp < 0x110000; cp++) {
                if (cp >= 0xd800 && cp < 0xe000) continue;
                if (isBlank(String.fromCodePoint(cp))) found.push(cp);
            }
            return found;
        }"""
    )
    assigned = [cp for cp in range(0x110000) if unicodedata.category(chr(cp)) not in ("Cn", "Cs")]
    server_blank = {cp for cp in assigned if not service.has_text(chr(cp))}
    assert {cp for cp in page_blank if cp in set(assigned)} == server_blank
    assert await tab.evaluate("isBlank(' \\u3164 \\u2800 ') && !isBlank('a\\u3164')")


@pytest.mark.browser
@browser_test
async def test_a_chat_id_with_leading_zeros_is_marked_current(page: tuple[Any, str]) -> None:
    tab, url = page
    async with client() as http:
        first, second = await new_chat(http, url), await new_chat(http, url)
    await _open(tab, f"{url}/chats/{second:04d}")
    assert [await a.get_attribute("data-id") for a in await tab.locator("#chats a.current").all()] == [str(second)]
    assert await tab.evaluate("state.chatId") == str(second)
    await _click_chat(tab, first)
    await tab.evaluate(f"history.pushState(null, '', '/chats/{second:03d}'); history.pushState(null, '', '/'); ")
    await tab.go_back()  # popstate, to /chats/00N
    await tab.wait_for_function(f'state.chatId === "{second}"')
    assert await tab.locator(f'#chats a.current[data-id="{second}"]').count() == 1
    assert await tab.evaluate("[chatKey('0049'), chatKey('0'), chatKey('000'), chatKey('10')]") == [
        "49",
        "0",
        "0",
        "10",
    ]
