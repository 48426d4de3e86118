"""The chat's web app: Starlette, a page of plain HTML and a little JavaScript (``EventSource``), no build step.

    GET  /                                the page (opens the newest chat, or makes a first one)
    GET  /chats/{id}                      the page, on chat id
    GET  /api/chats                       the chats, newest first
    POST /api/chats                       {"title": ...} → the new chat
    GET  /api/chats/{id}                  the chat, with its summary and message count
    GET  /api/chats/{id}/messages?after=N the messages after id N, oldest first (500 at most)
    POST /api/chats/{id}/messages         {"text": ...} → the saved message (201); the reply streams. With an
                                          Idempotency-Key header, a key the chat has: that message (200)
    GET  /api/chats/{id}/events           the chat's live events (server-sent events)
    GET  /healthz                         {"ok": true, "pid": ...}

Every request that changes something (POST, PUT, PATCH, DELETE) must say ``Content-Type: application/json`` and,
when it has an ``Origin``, come from the page's own origin; a request that comes over loopback (and every one,
served on a loopback address) must name loopback in its ``Host`` (see :class:`Guard`, trials EB and ED).

Run it with ``tinystore demo`` (see ``src/tinystore/cli/demo.py``), or build it yourself with
:func:`create_app` and serve it with uvicorn.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

import tinystore
from tinystore.sse import event_stream

from .model import Model
from .service import BadInput, Chat, NotFound

log = logging.getLogger("chat")
STATIC = Path(__file__).parent / "static"
MAX_STREAMS = 10_000
"""Event streams one web process holds at most; past it a new one gets a 503 (the browser retries)."""
MAX_BODY = 64 * 1024
"""Bytes a request's body may have; past it the request gets a 413, before the rest of the body is read."""
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_KEY = re.compile(r"[\x21-\x7e]{1,128}")
"""An ``Idempotency-Key`` the chat takes: 1 to 128 visible ASCII characters (a UUID, as the page sends)."""


def _is_loopback(address: str) -> bool:
    """Whether ``address`` (an address to listen on, or a socket's address) is this machine's loopback; an IPv4 one
    as a dual-stack socket (``--host ::``) names it, ``::ffff:127.0.0.1``, too (trial ED)."""
    if address.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _names_loopback(host: str) -> bool:
    """Whether ``host``, the host of a ``Host`` header (lowercase, no port), names this machine's loopback:
    ``localhost``, an IPv4 literal of 127.0.0.0/8 or ``[::1]`` (trial ED: ``--host 127.0.0.2`` printed an address
    whose every request was refused, its ``Host`` being no ``127.0.0.1``). A name that resolves to loopback is not
    enough: a DNS-rebinding page's name does."""
    if host in ("localhost", "localhost."):  # (the fully qualified form too: trial EE)
        return True
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ([::ffff:127.0.0.1]: an IPv4 loopback address, written as IPv6)
        return address.is_loopback and bracketed
    return address.is_loopback and (address.version == 6) == bracketed


def _host_and_port(netloc: str, default_port: int | None) -> tuple[str, int | None]:
    """``netloc`` ("Example.org:8000", "[::1]", "127.0.0.1") as (lowercase host, port or ``default_port``); a port
    that is no number is -1, which matches no other."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):  # an IPv6 address: [::1]:8000
        host, _, rest = netloc.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = netloc.partition(":")
    if not port:
        return host, default_port
    return host, int(port) if port.isdigit() else -1


class Guard:
    """An ASGI middleware that refuses, with a 403 and a JSON error saying why, the requests another site's page
    could make (trial EB: a cross-site ``text/plain`` POST, which a browser sends without asking first, posted a
    message, and the model answered it on the user's API key; a DNS-rebinding page could read every chat).

    - Every request that changes something (POST, PUT, PATCH, DELETE) must say ``Content-Type:
      application/json``: a cross-site page can send that only after a CORS preflight, which this app never
      grants. When it has an ``Origin`` (a browser's), its host and port must be the request's ``Host``.
    - Requests from the network are answered under any name; those over loopback must name loopback in their
      ``Host`` (``localhost``, an address of 127.0.0.0/8 or ``[::1]``, with or without a port): a page of
      ``attacker.example`` whose name was made to point at 127.0.0.1 (DNS rebinding) sends ``Host:
      attacker.example``. A connection that came in on a loopback address (the ASGI scope's ``server``) is always
      checked, whatever ``listen_host`` (trial ED: with ``--host 0.0.0.0`` none was, and a rebinding page read and
      wrote every chat through 127.0.0.1). ``listen_host``: the address the server listens on; a loopback one
      checks every request, whatever the connection's address says; any other (``0.0.0.0``, a LAN address: the
      user chose to expose the demo) leaves the requests from the network unchecked. ``GET /healthz`` is not
      checked (the demo's health probe sends a Host of its own, and it tells nothing of the chats).
    """

    def __init__(self, app: Any, listen_host: str | None = None) -> None:
        self.app = app
        self.check_all = None if listen_host is None else _is_loopback(listen_host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self.refusal(scope)
            if refused is not None:
                await _error(refused, 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> str | None:
        """Why the request of ``scope`` is refused, or None."""
        headers = Headers(scope=scope)
        host = headers.get("host")
        method = scope["method"]
        default_port = 443 if scope.get("scheme") in ("https", "wss") else 80
        if self.checks_host(scope) and not (method == "GET" and scope["path"] == "/healthz"):
            if host is None:
                return "the request has no Host header"
            if not _names_loopback(_host_and_port(host, None)[0]):
                return (
                    f"the Host header {host!r} names no loopback address: over loopback this demo serves the names "
                    "localhost, 127.x.x.x and [::1] only (from the network, with --host 0.0.0.0, it serves any name)"
                )
        if method not in UNSAFE_METHODS:
            return None
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            has = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
            return f"a {method} must have Content-Type: application/json (this one has {has})"
        origin = headers.get("origin")
        if origin is not None:
            scheme, _, netloc = origin.partition("://")
            origin_port = {"http": 80, "https": 443}.get(scheme.lower())
            if host is None or not netloc or _host_and_port(netloc, origin_port) != _host_and_port(host, default_port):
                return f"a {method} from another origin ({origin}) is refused: this demo takes them from its own page"
        return None

    def checks_host(self, scope: Scope) -> bool:
        """Whether the request of ``scope`` must name loopback in its ``Host``: one that came in on a loopback
        address always, and every one when the server listens on loopback."""
        server = scope.get("server")  # (the address this connection came in on, as the socket says)
        if server is not None and _is_loopback(str(server[0])):
            return True
        return bool(self.check_all)


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
    listen_host: str | None = None,
) -> Starlette:
    """The chat app. With ``store``, it runs on that open store (and leaves it open); else it opens
    ``directory`` at startup (``embedded=True``: the engines inside this process, serving the directory's
    socket so that other processes and ``tinystore status`` reach them; ``False``: the directory's server, a
    sidecar started when none runs) and closes it at shutdown. ``workers``: also run the reply and summary
    jobs in this process. ``model``: the model the replies come from (default: the offline one). ``listen_host``:
    the address the server listens on, which decides the ``Host`` check (see :class:`Guard`; without it, the address
    each connection came in on decides)."""
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
        keys = request.headers.getlist("idempotency-key")
        if len(keys) > 1:
            # (trial EX: the first of two was taken; two lines are one header of two keys, RFC 9110 §5.3)
            return _error(f"Idempotency-Key: one key, not {len(keys)}", 400)
        key = keys[0] if keys else None
        if key is not None and not _KEY.fullmatch(key):
            return _error("Idempotency-Key: 1 to 128 visible ASCII characters", 400)
        message, added = await chat_of(request).post_once(request.path_params["id"], text, key)
        return JSONResponse(message, status_code=201 if added else 200)

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

    async def client_gone(request: Request, exc: Exception) -> Response:
        # the client went away in the middle of its body (trial ED: each logged "Exception in ASGI application" and
        # a 44-line traceback; 900 of them, 2.7 MB of log): nothing is wrong here, and nobody reads the answer
        log.debug("%s %s: the client went away before its body ended", request.method, request.url.path)
        return Response(status_code=400)

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
        middleware=[Middleware(Guard, listen_host=listen_host)],
        exception_handlers={
            NotFound: not_found,
            BadInput: bad_input,
            ClientDisconnect: client_gone,
            tinystore.TinystoreError: unavailable,
        },
    )


async def _json(request: Request) -> Any:
    """The request's body, as JSON. One over :data:`MAX_BODY` is refused from its ``Content-Length`` before any of
    it is read, or, sent without one (chunked), as soon as more than that has come (trial EB: a 400 MiB body was
    read whole first, and the process grew from 50 MB to 610 MB before its 413)."""
    too_big = BadInput(f"the request body is over {MAX_BODY // 1024} KiB", 413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise too_big
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        raise BadInput("the request body is not JSON") from None
    except RecursionError:  # (trial HI: a 500 and a traceback in the log for each, from 60 KB of [[[...]]])
        raise BadInput("the request body's JSON is nested too deeply") from None


def _error(message: str, status: int) -> Response:
    return JSONResponse({"error": message}, status_code=status)
