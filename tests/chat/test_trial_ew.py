"""Trial EW, the live chat in browsers: a send whose answer was lost (saved, then the connection dropped) said "not
sent", and Send stored it a second time; a send that failed replaced what was typed while it was on its way; a
double-click on "New chat" made two chats; the Enter that ends an input method's composition sent the message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ..browser.conftest import ARGS, CHROMIUM
from ..sse.harness import client
from .test_trial_eb import browser_test, chat_app, new_chat


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[str]:
    async with chat_app(tmp_path) as url:
        yield url


async def test_a_message_sent_again_with_its_idempotency_key_is_saved_once(web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        url = f"{web}/api/chats/{chat_id}/messages"
        first = await http.post(url, json={"text": "only once"}, headers={"idempotency-key": "k-1"})
        assert first.status_code == 201, first.text
        again = await http.post(url, json={"text": "only once"}, headers={"idempotency-key": "k-1"})
        assert again.status_code == 200 and again.json() == first.json(), again.text
        other = await http.post(url, json={"text": "something else"}, headers={"idempotency-key": "k-1"})
        assert other.status_code == 409 and "another message's text" in other.json()["error"], other.text
        for bad in ("", "x" * 129, "sp ace", "k-1, k-2"):
            r = await http.post(url, json={"text": "hi"}, headers={"idempotency-key": bad})
            assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"], (bad, r.text)
        # two header lines are one header of two keys (RFC 9110 §5.3): refused too (trial EX: the first was taken)
        r = await http.post(url, json={"text": "hi"}, headers=[("idempotency-key", "k-1"), ("idempotency-key", "k-2")])
        assert r.status_code == 400 and r.json()["error"] == "Idempotency-Key: one key, not 2", r.text
        # the key is the chat's: another chat may use it; and a message without one is a new message each time
        other_chat = await new_chat(http, web)
        r = await http.post(
            f"{web}/api/chats/{other_chat}/messages", json={"text": "only once"}, headers={"idempotency-key": "k-1"}
        )
        assert r.status_code == 201
        assert (await http.post(url, json={"text": "only once"})).status_code == 201
        saved = (await http.get(url)).json()
        assert [m["text"] for m in saved if m["role"] == "user"] == ["only once", "only once"]


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    from playwright.async_api import async_playwright

    async with chat_app(tmp_path) as url, async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield await (await browser.new_context()).new_page(), url
        finally:
            await browser.close()


async def user_messages(url: str, chat_id: str) -> list[str]:
    async with client() as http:
        saved = (await http.get(f"{url}/api/chats/{chat_id}/messages")).json()
    return [m["text"] for m in saved if m["role"] == "user"]


async def live(tab: Any, url: str) -> str:
    await tab.goto(url)
    await tab.wait_for_selector('#status[data-state="live"]', timeout=10_000)
    return str(tab.url.rsplit("/", 1)[-1])


@pytest.mark.browser
@browser_test
async def test_a_send_whose_answer_was_lost_is_saved_once_when_sent_again(page: tuple[Any, str]) -> None:
    tab, url = page
    chat_id = await live(tab, url)
    lost = {"left": 1}

    async def drop_the_answer(route: Any) -> None:
        if route.request.method == "POST" and lost["left"]:
            lost["left"] -= 1
            await route.fetch()  # the server saves it ...
            await route.abort("connectionreset")  # ... and its answer is lost on the way back
        else:
            await route.continue_()

    await tab.route("**/api/chats/*/messages", drop_the_answer)
    await tab.fill("#text", "only once please")
    await tab.press("#text", "Enter")
    await tab.wait_for_function("document.querySelector('#text').value === 'only once please'", timeout=10_000)
    await tab.click("#composer button")  # "press Send to try again"
    await tab.wait_for_function("document.querySelector('#text').value === ''", timeout=10_000)
    await asyncio.sleep(0.5)
    assert await user_messages(url, chat_id) == ["only once please"]


@pytest.mark.browser
@browser_test
async def test_what_was_typed_while_a_send_failed_is_kept(page: tuple[Any, str]) -> None:
    tab, url = page
    await live(tab, url)
    answer = asyncio.Event()

    async def slow_failure(route: Any) -> None:
        if route.request.method == "POST":
            await answer.wait()
            await route.fulfill(status=503, content_type="application/json", body='{"error": "unreachable"}')
        else:
            await route.continue_()

    await tab.route("**/api/chats/*/messages", slow_failure)
    await tab.fill("#text", "first text")
    await tab.press("#text", "Enter")
    await tab.wait_for_function("document.querySelector('#text').value === ''", timeout=10_000)
    await tab.type("#text", "second thought")
    answer.set()
    await tab.wait_for_selector("#error:not([hidden])", timeout=10_000)
    assert await tab.input_value("#text") == "first text\nsecond thought"


@pytest.mark.browser
@browser_test
async def test_a_double_click_on_new_chat_makes_one_chat(page: tuple[Any, str]) -> None:
    tab, url = page
    await live(tab, url)
    async with client() as http:
        before = len((await http.get(f"{url}/api/chats")).json())
        await tab.dblclick("#new-chat")
        await asyncio.sleep(1.0)
        assert len((await http.get(f"{url}/api/chats")).json()) == before + 1


@pytest.mark.browser
@browser_test
async def test_the_enter_that_ends_a_composition_does_not_send(page: tuple[Any, str]) -> None:
    tab, url = page
    chat_id = await live(tab, url)
    await tab.fill("#text", "にほんご")
    await tab.eval_on_selector(
        "#text",
        "box => box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', isComposing: true, bubbles: true, "
        "cancelable: true}))",
    )
    await asyncio.sleep(0.5)
    assert await tab.input_value("#text") == "にほんご" and await user_messages(url, chat_id) == []
    await tab.press("#text", "Enter")  # the Enter after it sends
    await tab.wait_for_function("document.querySelector('#text').value === ''", timeout=10_000)
    await asyncio.sleep(0.3)
    assert await user_messages(url, chat_id) == ["にほんご"]
