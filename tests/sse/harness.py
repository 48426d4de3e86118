"""A real uvicorn server on 127.0.0.1 (a free port) in the test's loop, and an SSE client over httpx that
parses what it reads with the spec's parser."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import uvicorn

from .parser import Event, EventStreamParser


@contextlib.asynccontextmanager
async def serve(app: Any, *, lifespan: str = "off") -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on a free 127.0.0.1 port; yields its base URL; stops it at the end (open
    streams are cancelled after one second)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=1, access_log=False)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 15)
        finally:
            sock.close()


class SSE:
    """One open event stream: ``next()`` gives the next event, ``comments`` the comment lines seen."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.parser = EventStreamParser()
        self.events: asyncio.Queue[Event | None] = asyncio.Queue()
        self.raw = bytearray()
        self.chunks = 0
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self.response.aiter_raw():
                self.raw += chunk
                self.chunks += 1
                for ev in self.parser.feed(chunk):
                    self.events.put_nowait(ev)
        finally:
            self.events.put_nowait(None)

    @property
    def comments(self) -> list[str]:
        return self.parser.comments

    async def next(self, timeout: float = 5.0) -> Event:
        ev = await asyncio.wait_for(self.events.get(), timeout)
        assert ev is not None, "the stream ended"
        return ev

    async def none_within(self, seconds: float) -> None:
        """Assert that no event comes within ``seconds``."""
        try:
            ev = await asyncio.wait_for(self.events.get(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected event {ev}")

    async def ended(self, timeout: float = 5.0) -> bool:
        """Wait for the stream's end (the server finished the response); False if it did not end in time."""
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            return False
        return True


@contextlib.asynccontextmanager
async def open_sse(client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> AsyncIterator[SSE]:
    """GET ``url`` as an EventSource would (Accept: text/event-stream, Cache-Control: no-cache)."""
    h = {"accept": "text/event-stream", "cache-control": "no-cache", **(headers or {})}
    async with client.stream("GET", url, headers=h) as response:
        stream = SSE(response)
        try:
            yield stream
        finally:
            stream.task.cancel()
            with contextlib.suppress(BaseException):
                await stream.task


def client() -> httpx.AsyncClient:
    """An httpx client with no pool reuse surprises: each stream its own connection, no timeout on reads."""
    return httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), limits=httpx.Limits(max_connections=2000))


async def stalled_reader(web: str, path: str) -> socket.socket:
    """A client of ``web`` that asks for the event stream at ``path`` over a raw socket (a 4 KiB receive buffer,
    non-blocking), reading nothing unless the test does (``loop.sock_recv``); the test closes it."""
    parts = urlsplit(web)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (parts.hostname, parts.port))
        request = f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nAccept: text/event-stream\r\n\r\n"
        await loop.sock_sendall(sock, request.encode())
    except BaseException:
        sock.close()
        raise
    return sock
