"""SSE-01 in a real browser: what Chromium's EventSource reads of our events is what we wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from tinystore.sse import encode_event, sse_response

from ..sse.harness import serve
from ..sse.parser import parse

pytestmark = pytest.mark.browser

TEXTS = [
    "plain",
    "two\nlines",
    "crlf\r\nand\rcr",
    "data: injected\nid: 99\nevent: evil\nretry: 1\n: not a comment\n\nafter a blank line",
    ":starts with a colon",
    " leading space",
    "trailing newline\n",
    "",
    "ünïcödé — 中文 — עברית — 🎉🚀 — \u2028\u2029 — \ufeffbom",
    "tab\tand \x01 control",
]

PAGE = """<!doctype html><meta charset="utf-8"><script>
window.__events = {};
for (const path of ["raw", "json"]) {
  const got = window.__events[path] = [];
  const es = new EventSource("/" + path);
  es.addEventListener("t", (e) => got.push({data: e.data, id: e.lastEventId}));
  es.addEventListener("end", () => { es.close(); got.done = true; });
}
</script>"""


def app() -> Starlette:
    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def raw(request: Request) -> Response:
        async def gen() -> AsyncIterator[bytes]:
            for i, text in enumerate(TEXTS):
                yield encode_event(text, event="t", id=f"raw-{i}")
            yield encode_event("x", event="end")
            await asyncio.sleep(3600)  # stay open: the page closes it

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def json_events(request: Request) -> Response:
        async def producer(send: Any, closed: asyncio.Event) -> None:
            for i, text in enumerate(TEXTS):
                await send(text, event="t", id=f"json-{i}")
            await send(None, event="end")
            await closed.wait()

        return sse_response(request, producer)

    return Starlette(routes=[Route("/", page), Route("/raw", raw), Route("/json", json_events)])


# contract: SSE-01
async def test_chromium_reads_our_events_as_written(browser: Any) -> None:
    async with serve(app()) as url:
        page = await browser.new_page()
        try:
            await page.goto(url)
            await page.wait_for_function("window.__events.raw.done && window.__events.json.done", timeout=10_000)
            got = await page.evaluate("window.__events")
        finally:
            await page.close()
    # raw text: exactly what the spec's parser reads from the same bytes (line breaks become LF)
    expected = parse(b"".join(encode_event(t, event="t", id=f"raw-{i}") for i, t in enumerate(TEXTS)))
    assert [(e["data"], e["id"]) for e in got["raw"]] == [(e.data, e.last_event_id) for e in expected]
    assert got["raw"][3]["data"] == TEXTS[3]  # a payload of data:/id:/: lines is one event's data
    # JSON (what send() writes): the very text, CRs included
    assert [json.loads(e["data"]) for e in got["json"]] == TEXTS
    assert [e["id"] for e in got["json"]] == [f"json-{i}" for i in range(len(TEXTS))]
