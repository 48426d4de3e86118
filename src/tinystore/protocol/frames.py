"""Frames and the sans-I/O connection state machine shared by the server and the SDK.

No sockets and no asyncio here (in the manner of h11): feed received bytes to
:meth:`Connection.receive_data`, take events from :meth:`Connection.next_event`, and write the bytes the
``send_*`` methods return.

A frame is::

    u32  length of what follows (header + body), big-endian
    u8   kind
    u8   flags            (MORE: the response continues in the next frame of the same stream)
    u32  stream id        (a request's id; 0 for the connection itself)
    u8   method length, then the method name in ASCII (empty for kinds that carry none)
    ...  body: MessagePack (msgspec), possibly empty

Rules enforced (each breach is a :class:`~tinystore.errors.ProtocolError`, after which the connection is
closed with that reason): the first frame each way is the handshake (``HELLO`` from the client, then
``WELCOME`` or ``ERROR`` from the server); a frame's body is at most ``max_body`` bytes; a kind must be one
the peer's role may send; a request's stream id is non-zero and not already in flight; a client has at
most ``max_inflight`` requests in flight (its request credit, announced in ``WELCOME``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from ..errors import ProtocolError

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IBBIB")
HEADER_SIZE = HEADER.size  # 11 bytes, the length included
MORE = 0x01
DEFAULT_MAX_BODY = 16 * 1024 * 1024
DEFAULT_MAX_INFLIGHT = 1024


class Kind(IntEnum):
    HELLO = 1
    WELCOME = 2
    REQUEST = 3
    RESPONSE = 4
    ERROR = 5
    PUSH = 6
    CANCEL = 7
    GOAWAY = 8


_KINDS: dict[int, Kind] = {int(k): k for k in Kind}
_METHODS: dict[bytes, str] = {}

CLIENT_KINDS = frozenset({Kind.HELLO, Kind.REQUEST, Kind.CANCEL, Kind.GOAWAY})
SERVER_KINDS = frozenset({Kind.WELCOME, Kind.RESPONSE, Kind.ERROR, Kind.PUSH, Kind.GOAWAY})


@dataclass(slots=True)
class Frame:
    """One decoded frame. ``body`` is the raw MessagePack bytes."""

    kind: Kind
    flags: int
    stream: int
    method: str
    body: bytes


class NeedData:
    """Returned by :meth:`Connection.next_event` when no whole frame is buffered."""


NEED_DATA = NeedData()


class Closed:
    """Returned by :meth:`Connection.next_event` once the peer closed its side."""


CLOSED = Closed()


def encode_frame(kind: Kind, stream: int, method: str, body: bytes, flags: int = 0) -> bytes:
    """Bytes of one frame. ``method`` must be ASCII of at most 255 bytes."""
    m = method.encode("ascii")
    if len(m) > 255:
        raise ProtocolError(f"method name too long: {method[:40]!r}")
    return HEADER.pack(HEADER_SIZE - 4 + len(m) + len(body), kind, flags, stream, len(m)) + m + body


class Connection:
    """The state of one connection, as seen by ``role`` (``"client"`` or ``"server"``).

    ``max_body``: the largest body accepted, in bytes. ``max_inflight``: on a server, the most requests a
    client may have in flight (its request credit); a client learns it from ``WELCOME``.
    """

    def __init__(
        self,
        role: str,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ) -> None:
        if role not in ("client", "server"):
            raise ValueError("role is 'client' or 'server'")
        self.role = role
        self.max_body = max_body
        self.max_inflight = max_inflight
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self.handshaken = False
        self._hello_seen = False
        self.closed_reason: str | None = None  # set once a ProtocolError broke the connection
        self._allowed = CLIENT_KINDS if role == "server" else SERVER_KINDS
        self.inflight: set[int] = set()

    # -- receiving -------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes received from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_event(self) -> Frame | NeedData | Closed:
        """The next whole frame, ``NEED_DATA``, or ``CLOSED``. Raises ``ProtocolError`` on a broken frame;
        after that the connection is broken and every later call raises the same error."""
        if self.closed_reason is not None:
            raise ProtocolError(self.closed_reason)
        try:
            return self._next_event()
        except ProtocolError as exc:
            self.closed_reason = exc.message
            raise

    def _next_event(self) -> Frame | NeedData | Closed:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < HEADER_SIZE:
            if self._eof:
                if avail:
                    raise ProtocolError(f"connection closed in the middle of a frame ({avail} bytes left over)")
                return CLOSED
            return NEED_DATA
        length, kind, flags, stream, mlen = HEADER.unpack_from(buf, pos)
        body_len = length - (HEADER_SIZE - 4) - mlen
        if body_len < 0:
            raise ProtocolError(f"frame length {length} is shorter than its header")
        if body_len > self.max_body:
            raise ProtocolError(f"frame body of {body_len} bytes is over the limit of {self.max_body} bytes")
        # the kind is known from the header: refuse a bad one before buffering its body
        k = _KINDS.get(kind)
        if k is None:
            raise ProtocolError(f"unknown frame kind {kind}")
        if k not in self._allowed:
            raise ProtocolError(f"a {self.role} does not accept {k.name} frames")
        if avail < length + 4:
            if self._eof:
                raise ProtocolError("connection closed in the middle of a frame")
            return NEED_DATA
        start = pos + HEADER_SIZE
        raw = bytes(buf[start : start + mlen])
        method = _METHODS.get(raw)
        if method is None:
            try:
                method = raw.decode("ascii")
            except UnicodeDecodeError:
                raise ProtocolError("method name is not ASCII") from None
            if len(_METHODS) < 1024:
                _METHODS[raw] = method
        body = bytes(buf[start + mlen : pos + 4 + length])
        self._pos = pos + 4 + length
        if self._pos > 1 << 20 and self._pos * 2 > len(buf):
            del buf[: self._pos]
            self._pos = 0
        self._check_order(k, stream)
        return Frame(k, flags, stream, method, body)

    def _check_order(self, kind: Kind, stream: int) -> None:
        if not self.handshaken:
            if self.role == "server":
                if kind is not Kind.HELLO:
                    raise ProtocolError(f"expected HELLO first, got {kind.name}")
                if self._hello_seen:
                    raise ProtocolError("a second HELLO before the handshake ended")
                self._hello_seen = True
            elif kind not in (Kind.WELCOME, Kind.ERROR, Kind.GOAWAY):
                raise ProtocolError(f"expected WELCOME first, got {kind.name}")
            elif kind is Kind.WELCOME:
                self.handshaken = True
            return
        if kind is Kind.HELLO or kind is Kind.WELCOME:
            raise ProtocolError(f"{kind.name} after the handshake")
        if kind is Kind.REQUEST:
            if stream == 0:
                raise ProtocolError("a request needs a non-zero stream id")
            if stream in self.inflight:
                raise ProtocolError(f"stream {stream} is already in flight")
            if len(self.inflight) >= self.max_inflight:
                raise ProtocolError(f"more than {self.max_inflight} requests in flight")
            self.inflight.add(stream)

    # -- sending ---------------------------------------------------------------------------------

    def send_hello(self, body: bytes) -> bytes:
        return encode_frame(Kind.HELLO, 0, "", body)

    def send_welcome(self, body: bytes) -> bytes:
        self.handshaken = True
        return encode_frame(Kind.WELCOME, 0, "", body)

    def send_request(self, stream: int, method: str, body: bytes) -> bytes:
        return encode_frame(Kind.REQUEST, stream, method, body)

    def send_response(self, stream: int, body: bytes, chunk: int = 1 << 20) -> list[bytes]:
        """The frames of one response; a body past ``chunk`` bytes is split (flag ``MORE`` on all but the last)."""
        self.inflight.discard(stream)
        if len(body) <= chunk:
            return [encode_frame(Kind.RESPONSE, stream, "", body)]
        parts = []
        for i in range(0, len(body), chunk):
            last = i + chunk >= len(body)
            parts.append(encode_frame(Kind.RESPONSE, stream, "", body[i : i + chunk], 0 if last else MORE))
        return parts

    def send_error(self, stream: int, body: bytes) -> bytes:
        self.inflight.discard(stream)
        return encode_frame(Kind.ERROR, stream, "", body)

    def send_push(self, method: str, body: bytes) -> bytes:
        return encode_frame(Kind.PUSH, 0, method, body)

    def send_cancel(self, stream: int) -> bytes:
        return encode_frame(Kind.CANCEL, stream, "", b"")

    def send_goaway(self, body: bytes) -> bytes:
        return encode_frame(Kind.GOAWAY, 0, "", body)

    def finished(self, stream: int) -> None:
        """Forget a stream that ended without a frame of ours (a cancelled request)."""
        self.inflight.discard(stream)
