"""The chat's web app: Starlette, a page of plain HTML and a little JavaScript (``EventSource``), no build step.

    GET  /                                the page (opens the newest chat, or makes a first one)
    GET  /chats/{id}                      the page, on chat id
    GET  /api/chats                       the chats, newest first
    POST /api/chats                       {"title": ...} → the new chat
    GET  /api/chats/{id}                  the chat, with its summary and message count
    GET  /api/chats/{id}/messages?after=N the messages after id N, oldest first (500 at most)
    POST /api/chats/{id}/messages         {"text": ...} → the saved message (201); the reply streams
    GET  /api/chats/{id}/events           the chat's live events (server-sent events)
    GET  /healthz                         {"ok": true, "pid": ...}

Run it with ``tinystore demo`` (see ``src/tinystore/cli/demo.py``), or build it yourself with
:func:`create_app` and serve it with uvicorn.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

import tinystore
from tinystore.sse import event_stream

from .model import Model
from .service import BadInput, Chat, NotFound

STATIC = Path(__file__).parent / "static"
MAX_STREAMS = 10_000
"""Event streams one web process holds at most; past it a new one gets a 503 (the browser retries)."""


class _Counted:
    """An ASGI response that counts itself in ``counter`` while it runs."""

    def __init__(self, inner: Response, counter: dict[str, int]) -> None:
        self.inner = inner
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.counter["streams"] += 1
        try:
            await self.inner(scope, receive, send)
        finally:
            self.counter["streams"] -= 1


def create_app(
    *,
    store: tinystore.Store | None = None,
    directory: str | os.PathLike[str] | None = None,
    embedded: bool = True,
    workers: bool = True,
    model: Model | None = None,
    max_streams: int = MAX_STREAMS,
    keepalive: str = "15s",
) -> Starlette:
    """The chat app. With ``store``, it runs on that open store (and leaves it open); else it opens
    ``directory`` at startup (``embedded=True``: the engines inside this process, serving the directory's
    socket so that other processes and ``tinystore status`` reach them; ``False``: the directory's server, a
    sidecar started when none runs) and closes it at shutdown. ``workers``: also run the reply and summary
    jobs in this process. ``model``: the model the replies come from (default: the offline one)."""
    if store is None and directory is None:
        raise ValueError("create_app: give a store or a directory")
    counter = {"streams": 0}
    state: dict[str, Any] = {}

    def chat_of(request: Request) -> Chat:
        chat: Chat = request.app.state.chat
        return chat

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own = store is None
        s = store
        if s is None:
            assert directory is not None
            s = await tinystore.open(directory, embedded=embedded)
        try:
            chat = await Chat(s, model).open()
            app.state.chat = chat
            state["chat"] = chat
            if workers:
                chat.start_workers()
            try:
                yield
            finally:
                await chat.stop_workers()
        finally:
            if own:
                await s.close()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    async def list_chats(request: Request) -> Response:
        return JSONResponse(await chat_of(request).list_chats())

    async def create_chat(request: Request) -> Response:
        body = await _json(request)
        title = body.get("title", "") if isinstance(body, dict) else ""
        if not isinstance(title, str):
            return _error("title must be text", 400)
        return JSONResponse(await chat_of(request).create_chat(title), status_code=201)

    async def get_chat(request: Request) -> Response:
        return JSONResponse(await chat_of(request).get_chat(request.path_params["id"]))

    async def list_messages(request: Request) -> Response:
        chat = chat_of(request)
        chat_id = request.path_params["id"]
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return _error("after must be a message id", 400)
        await chat.get_chat(chat_id)
        return JSONResponse(await chat.messages(chat_id, after=max(0, min(after, 2**62))))

    async def post_message(request: Request) -> Response:
        body = await _json(request)
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return _error('send {"text": "..."}', 400)
        message = await chat_of(request).post(request.path_params["id"], text)
        return JSONResponse(message, status_code=201)

    async def chat_events(request: Request) -> Response:
        chat = chat_of(request)
        chat_id = request.path_params["id"]
        await chat.get_chat(chat_id)
        if counter["streams"] >= max_streams:
            return _error(f"this process holds {max_streams} event streams, its limit", 503)
        stream = event_stream(
            chat.events.under(chat_id), request, keepalive=keepalive, event=lambda m: m.value.kind, retry="1s"
        )
        return _Counted(stream, counter)  # type: ignore[return-value]

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True, "pid": os.getpid(), "streams": counter["streams"]})

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(str(exc), 404)

    async def bad_input(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadInput)
        return _error(str(exc), exc.status)

    async def unavailable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, tinystore.TinystoreError)
        # invalid: the request's own input, which the checks above let through (a 4xx, not a fault of ours)
        if exc.code == "invalid":
            status = 400
        elif exc.code in ("closed", "unavailable", "outcome_unknown", "limit"):
            status = 503
        else:
            status = 500
        return _error(exc.message, status)

    routes = [
        Route("/", page),
        Route("/chats/{id:int}", page),
        Route("/api/chats", list_chats, methods=["GET"]),
        Route("/api/chats", create_chat, methods=["POST"]),
        Route("/api/chats/{id:int}", get_chat),
        Route("/api/chats/{id:int}/messages", list_messages, methods=["GET"]),
        Route("/api/chats/{id:int}/messages", post_message, methods=["POST"]),
        Route("/api/chats/{id:int}/events", chat_events),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            NotFound: not_found,
            BadInput: bad_input,
            tinystore.TinystoreError: unavailable,
        },
    )


async def _json(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > 64 * 1024:
        raise BadInput("the request body is over 64 KiB", 413)
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        raise BadInput("the request body is not JSON") from None


def _error(message: str, status: int) -> Response:
    return JSONResponse({"error": message}, status_code=status)
