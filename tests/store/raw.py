"""A raw protocol client for tests that must send what the SDK never would."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from tinystore.errors import ProtocolError
from tinystore.protocol import frames
from tinystore.protocol.frames import CLOSED, NEED_DATA, Closed, Connection, Frame, Kind
from tinystore.protocol.messages import ErrorBody, GoAway, Hello, decode, encode

Where = tuple[str, Any]  # ("unix", path) | ("tcp", (host, port))


def tokens_of(path: Path) -> dict[str, str]:
    """capability → token, from a tokens file."""
    out = {}
    for line in path.read_text().splitlines():
        cap, token = line.split()
        out[cap] = token
    return out


class RawClient:
    """One connection speaking frames by hand. ``conn`` parses what the server sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = Connection("client")
        self.eof = False

    @classmethod
    async def open(cls, where: Where) -> RawClient:
        kind, addr = where
        if kind == "unix":
            reader, writer = await asyncio.open_unix_connection(str(addr))
        else:
            reader, writer = await asyncio.open_connection(addr[0], addr[1])
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self, timeout: float = 5.0) -> Frame | Closed:
        """The next frame from the server, or ``CLOSED`` once it closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.conn.next_event()
            if isinstance(ev, Frame) or ev is CLOSED:
                return ev
            assert ev is NEED_DATA
            left = deadline - time.monotonic()
            assert left > 0, "the server said nothing"
            try:
                async with asyncio.timeout(left):
                    data = await self.reader.read(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.eof = True
            self.conn.receive_data(data)

    async def frames_until_closed(self, timeout: float = 5.0) -> list[Frame]:
        """Every frame until the server closes the connection (asserts that it does)."""
        out: list[Frame] = []
        while True:
            try:
                f = await self.frame(timeout)
            except ProtocolError:
                # the server's close cut a frame short: nothing more to read
                return out
            if f is CLOSED:
                return out
            assert isinstance(f, Frame)
            out.append(f)

    async def hello(self, token: str = "") -> Frame:
        self.send(
            self.conn.send_hello(
                encode(Hello(version=frames.PROTOCOL_VERSION, token=token, client="raw", pid=os.getpid()))
            )
        )
        f = await self.frame()
        assert isinstance(f, Frame), "closed during the handshake"
        return f

    async def call(self, stream: int, method: str, body: bytes) -> Frame:
        self.send(self.conn.send_request(stream, method, body))
        while True:
            f = await self.frame()
            assert isinstance(f, Frame), f"closed while waiting for stream {stream}"
            if f.kind is not Kind.PUSH and f.stream == stream:
                return f

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def goaway_of(fs: list[Frame]) -> GoAway:
    """The GOAWAY among ``fs`` (asserts there is one)."""
    for f in fs:
        if f.kind is Kind.GOAWAY:
            return decode(f.body, GoAway)  # type: ignore[no-any-return]
    raise AssertionError(f"no GOAWAY among {[f.kind.name for f in fs]}")


def error_of(f: Frame) -> ErrorBody:
    assert f.kind is Kind.ERROR, f"expected an ERROR frame, got {f.kind.name}"
    return decode(f.body, ErrorBody)  # type: ignore[no-any-return]
