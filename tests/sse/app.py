"""The app the SSE tests serve: a channel branch per chat through event_stream, and the seed's own stream()."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tinystore
from tinystore.sse import event_stream, sse_response


@dataclass
class ChatEvent:
    kind: str
    id: int
    text: str = ""


events: Any = None  # the seed's module-level channel; set by make_app


# The seed's stream(), as written (000_aecfe04c5058305e.txt, "Tell every open tab").
async def stream(chat_id: int, send, closed: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    sub = await events.under(chat_id).subscribe(
        lambda m: send(m.value),
        on_missed=lambda missed: send({"kind": "reload"}),
    )
    await closed.wait()  # the browser went away
    await sub.stop()


def make_app(store: tinystore.Store) -> Starlette:
    global events
    events = store.channel("chat-events", ChatEvent)
    channel = events

    async def chat_events(request: Request) -> Response:
        chat_id = int(request.path_params["chat"])
        keepalive = request.query_params.get("keepalive", "15s")
        shared = request.query_params.get("own") != "1"
        return event_stream(
            channel.under(chat_id), request, keepalive=keepalive, event=lambda m: m.value.kind, shared=shared
        )

    async def seed_events(request: Request) -> Response:
        chat_id = int(request.path_params["chat"])
        return sse_response(request, lambda send, closed: stream(chat_id, send, closed))

    return Starlette(
        routes=[Route("/events/{chat}", chat_events), Route("/seed/{chat}", seed_events)],
        middleware=[Middleware(GZipMiddleware, minimum_size=1)],
    )
