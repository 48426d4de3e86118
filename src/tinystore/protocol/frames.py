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

A sender checks its own bodies too: :meth:`Connection.send_request` refuses a body past the peer's limit
(``peer_max_body``, announced in ``WELCOME``) with :class:`~tinystore.errors.LimitError` before any byte is
written, so an oversized request fails alone and the connection goes on (:func:`body_too_large`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from ..errors import LimitError, ProtocolError

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IBBIB")
HEADER_SIZE = HEADER.size  # 11 bytes, the length included
_pack = HEADER.pack
MORE = 0x01
UNREAD = 0x80
"""Not on the wire (cleared from what a peer sends): set by :meth:`Connection.next_frames` on a frame whose body
this process had no memory to hold (its body is then ``b""``): the frame is passed over, and the caller answers it
(a server: an error for that request) or fails its call (a client), the connection going on."""
DEFAULT_MAX_BODY = 16 * 1024 * 1024
HELLO_MAX = 64 * 1024
"""The largest ``HELLO`` body a server reads: before the handshake, a peer (no token shown yet) cannot make it
buffer more."""

TOKEN_MAX = 4096
"""The longest token, in bytes of UTF-8 (a tokens file holding a longer one is refused, and so is ``connect`` given
one): it travels in the ``HELLO``, well under :data:`HELLO_MAX`."""

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


def _method_name(raw: bytes) -> str:
    try:
        method = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("method name is not ASCII") from None
    if len(_METHODS) < 1024:
        _METHODS[raw] = method
    return method


_ENCODED: dict[str, bytes] = {}


def _method_bytes(method: str) -> bytes:
    m = _ENCODED.get(method)
    if m is None:
        m = method.encode("ascii")
        if len(m) > 255:
            raise ProtocolError(f"method name too long: {method[:40]!r}")
        if len(_ENCODED) < 1024:
            _ENCODED[method] = m
    return m


def body_too_large(what: str, size: int, limit: int) -> LimitError:
    """The error of a request whose body (``size`` bytes of MessagePack) is over the frame limit ``limit``:
    ``what`` names the request (``"database app: sql.exec"``)."""
    return LimitError(
        f"{what}: the request is {size} bytes encoded, over the frame limit of {limit} bytes (frame_body_bytes)",
        limit=limit,
        wanted=size,
    )


def encode_frame(kind: Kind, stream: int, method: str, body: bytes | bytearray, flags: int = 0) -> bytes:
    """Bytes of one frame. ``method`` must be ASCII of at most 255 bytes."""
    m = _method_bytes(method) if method else b""
    return b"".join((_pack(7 + len(m) + len(body), kind, flags, stream, len(m)), m, body))


def request_frame(stream: int, method: str, body: bytes | bytearray) -> bytes:
    """Bytes of one ``REQUEST`` frame (what :meth:`Connection.send_request` returns)."""
    m = _ENCODED.get(method) or _method_bytes(method)
    return b"".join((_pack(7 + len(m) + len(body), 3, 0, stream, len(m)), m, body))


def response_frame(stream: int, body: bytes | bytearray) -> bytes:
    """Bytes of one ``RESPONSE`` frame, whole (no ``MORE``): for a body of at most the chunk size."""
    return _pack(7 + len(body), 4, 0, stream, 0) + body


class Connection:
    """The state of one connection, as seen by ``role`` (``"client"`` or ``"server"``).

    ``max_body``: the largest body accepted, in bytes. ``max_inflight``: on a server, the most requests a
    client may have in flight (its request credit); a client learns it from ``WELCOME``. ``peer_max_body``:
    the largest body the peer accepts (a client learns it from ``WELCOME``); :meth:`send_request` refuses a
    larger one.

    Two ways to take frames out: :meth:`next_event` (one :class:`Frame` at a time) and :meth:`next_frames`
    (every whole frame buffered, as tuples, in one call: what the server and the SDK use on their hot path).
    Both apply the same rules.
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
        self.peer_max_body = DEFAULT_MAX_BODY
        # what was received and not yet parsed: ``_buf[_pos:]``. ``_buf`` is the received ``bytes`` object
        # itself while it is being parsed (no copy), a ``bytearray`` only while a frame is incomplete.
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._eof = False
        self._error: ProtocolError | None = None  # found by next_frames after frames it still returned
        self.handshaken = False
        self._hello_seen = False
        self.closed_reason: str | None = None  # set once a ProtocolError broke the connection
        self._allowed = CLIENT_KINDS if role == "server" else SERVER_KINDS
        self.inflight: set[int] = set()

    # -- receiving -------------------------------------------------------------------------------

    def discard(self) -> None:
        """The connection ended: forget what was received and not parsed (a part of a frame, up to the frame limit),
        now rather than when the object holding this one is collected. Later data is ignored."""
        self._buf = b""
        self._pos = 0
        self._eof = True

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes received from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            # nothing left over (the usual case): parse ``data`` where it lies
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
            return
        if isinstance(buf, bytes):
            buf = bytearray(memoryview(buf)[pos:])
            pos = 0
        elif pos > 1 << 16 and pos * 2 > len(buf):
            del buf[:pos]
            pos = 0
        buf += data
        self._buf = buf
        self._pos = pos

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

    def next_frames(self) -> list[tuple[Kind, int, int, str, bytes]]:
        """Every whole frame buffered, as ``(kind, flags, stream, method, body)`` tuples, in order; ``[]``
        when none is (more data is needed, or the peer closed: see :attr:`eof`).

        It stops after a handshake frame, so that the caller acts on it before the frames after it are
        checked: call it again until it returns ``[]``. A broken frame raises ``ProtocolError`` once the
        frames before it were returned (at the next call); after that every call raises it.
        """
        if self.closed_reason is not None:
            raise ProtocolError(self.closed_reason)
        if self._error is not None:
            self.closed_reason = self._error.message
            raise self._error
        if not self.handshaken:
            ev = self.next_event()
            if isinstance(ev, Frame):
                return [(ev.kind, ev.flags, ev.stream, ev.method, ev.body)]
            return []
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if end - pos < HEADER_SIZE:
            if self._eof and end > pos:
                self.closed_reason = f"connection closed in the middle of a frame ({end - pos} bytes left over)"
                raise ProtocolError(self.closed_reason)
            _check_short(buf, pos, end - pos)
            return []
        out: list[tuple[Kind, int, int, str, bytes]] = []
        unpack = HEADER.unpack_from
        kinds = _KINDS
        allowed = self._allowed
        server = self.role == "server"
        inflight = self.inflight
        whole = type(buf) is bytes  # then a slice is a copy already
        last_raw = b""  # the last method name read, and its text: a burst repeats the same method
        last_method = ""
        try:
            while end - pos >= HEADER_SIZE:
                length, kind, flags, stream, mlen = unpack(buf, pos)
                body_len = length - 7 - mlen
                k = kinds.get(kind)
                if body_len < 0 or body_len > self.max_body or k is None or k not in allowed:
                    self._pos = pos
                    self._next_event()  # raises the error this frame deserves
                    raise AssertionError("unreachable")  # pragma: no cover
                stop = pos + 4 + length
                if stop > end:
                    break
                start = pos + HEADER_SIZE
                if mlen:
                    if mlen == len(last_raw) and buf.startswith(last_raw, start):
                        method = last_method
                    else:
                        raw = bytes(buf[start : start + mlen])
                        method = _METHODS.get(raw) or _method_name(raw)
                        last_raw = raw
                        last_method = method
                    start += mlen
                else:
                    method = ""
                flags &= ~UNREAD
                try:
                    body: bytes = buf[start:stop] if whole else bytes(buf[start:stop])  # type: ignore[assignment]
                except MemoryError:
                    # (trial EH: a server short of memory took a 15 MB request for a connection error, and its
                    # client sent it again, for ever)
                    body = b""
                    flags |= UNREAD
                pos = stop
                if server:
                    if k is Kind.REQUEST:
                        if stream == 0:
                            raise ProtocolError("a request needs a non-zero stream id")
                        if stream in inflight:
                            raise ProtocolError(f"stream {stream} is already in flight")
                        if len(inflight) >= self.max_inflight:
                            raise ProtocolError(f"more than {self.max_inflight} requests in flight")
                        inflight.add(stream)
                    elif k is Kind.CANCEL:
                        # the request is over for the client's credit now: requests after it in this buffer
                        # may take its place (what ran it is cancelled when the frame is handled)
                        inflight.discard(stream)
                    elif k is Kind.HELLO:
                        raise ProtocolError(f"{k.name} after the handshake")
                elif k is Kind.WELCOME:
                    raise ProtocolError(f"{k.name} after the handshake")
                out.append((k, flags, stream, method, body))
        except ProtocolError as exc:
            self._pos = pos
            if not out:
                self.closed_reason = exc.message
                raise
            self._error = exc
            return out
        self._pos = pos
        if pos == end:
            self._buf = b""
            self._pos = 0
        elif self._eof:
            broken = ProtocolError("connection closed in the middle of a frame")
            if not out:
                self.closed_reason = broken.message
                raise broken
            self._error = broken
        return out

    @property
    def eof(self) -> bool:
        """Whether the peer closed its side and every whole frame was taken out."""
        return self._eof and self._pos >= len(self._buf)

    def _next_event(self) -> Frame | NeedData | Closed:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < HEADER_SIZE:
            if self._eof:
                if avail:
                    raise ProtocolError(f"connection closed in the middle of a frame ({avail} bytes left over)")
                return CLOSED
            _check_short(buf, pos, avail)
            return NEED_DATA
        length, kind, flags, stream, mlen = HEADER.unpack_from(buf, pos)
        body_len = length - (HEADER_SIZE - 4) - mlen
        if body_len < 0:
            raise ProtocolError(f"frame length {length} is shorter than its header")
        if body_len > self.max_body:
            head = bytes(buf[pos : pos + 4])
            said = next((p for start, p in _OTHER_PROTOCOLS.items() if head.startswith(start)), None)
            if not self.handshaken and said is not None:
                # (trial HV: an HTTP request at the TCP port was logged "frame body of 1195725802 bytes is over the
                # limit")
                raise ProtocolError(f"the peer speaks {said}, not TinyStore's protocol")
            raise ProtocolError(f"frame body of {body_len} bytes is over the limit of {self.max_body} bytes")
        # the kind is known from the header: refuse a bad one before buffering its body
        k = _KINDS.get(kind)
        if k is None:
            raise ProtocolError(f"unknown frame kind {kind}")
        if k not in self._allowed:
            raise ProtocolError(f"a {self.role} does not accept {k.name} frames")
        if not self.handshaken and self.role == "server":
            # a peer that has not shown a token yet gets no large buffer: a HELLO is a version, a token, a name
            if k is not Kind.HELLO:
                raise ProtocolError(f"expected HELLO first, got {k.name}")
            if body_len > HELLO_MAX:
                raise ProtocolError(f"a HELLO of {body_len} bytes: a handshake is at most {HELLO_MAX} bytes")
        if avail < length + 4:
            if self._eof:
                raise ProtocolError("connection closed in the middle of a frame")
            return NEED_DATA
        start = pos + HEADER_SIZE
        raw = bytes(buf[start : start + mlen])
        method = _METHODS.get(raw)
        if method is None:
            method = _method_name(raw)
        body = bytes(buf[start + mlen : pos + 4 + length])
        self._pos = pos + 4 + length
        if self._pos >= len(buf):
            self._buf = b""
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
        elif kind is Kind.CANCEL and self.role == "server":
            self.inflight.discard(stream)  # as in the batch parser: its credit is back at once

    # -- sending ---------------------------------------------------------------------------------

    def send_hello(self, body: bytes) -> bytes:
        return encode_frame(Kind.HELLO, 0, "", body)

    def send_welcome(self, body: bytes) -> bytes:
        self.handshaken = True
        return encode_frame(Kind.WELCOME, 0, "", body)

    def send_request(self, stream: int, method: str, body: bytes) -> bytes:
        """The bytes of one ``REQUEST`` frame. Raises ``LimitError`` when ``body`` is over ``peer_max_body``
        (nothing is sent: the connection stays usable)."""
        if len(body) > self.peer_max_body:
            raise body_too_large(method, len(body), self.peer_max_body)
        return request_frame(stream, method, body)

    def send_response(self, stream: int, body: bytes | bytearray, chunk: int = 1 << 20) -> list[bytes]:
        """The frames of one response; a body past ``chunk`` bytes is split (flag ``MORE`` on all but the last)."""
        self.inflight.discard(stream)
        if len(body) <= chunk:
            return [response_frame(stream, body)]
        parts = []
        for i in range(0, len(body), chunk):
            last = i + chunk >= len(body)
            parts.append(encode_frame(Kind.RESPONSE, stream, "", body[i : i + chunk], 0 if last else MORE))
        return parts

    def send_response_frame(self, stream: int, body: bytes | bytearray) -> bytes:
        """The one frame of a response whose body fits a frame (see :meth:`send_response`)."""
        self.inflight.discard(stream)
        return _pack(7 + len(body), 4, 0, stream, 0) + body

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


_OTHER_PROTOCOLS: dict[bytes, str] = {
    **{
        m: "HTTP"
        for m in (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN", b"TRAC", b"PRI ", b"HTTP")
    },
    b"SSH-": "SSH",
    b"*1\r\n": "RESP (a Redis client)",
    b"\x16\x03": "TLS (a tls:// client at a listener without TLS: use tcp://, or serve with --tls-cert and --tls-key)",
}
"""What the first bytes of a connection say of a peer that speaks another protocol (its first frame's length
would be some hundreds of MB), for the error that closes it."""


def _check_short(buf: bytes | bytearray | memoryview, pos: int, avail: int) -> None:
    """Raise ``ProtocolError`` when the frame begun at ``pos`` says its length is shorter than its header, as soon
    as its length is there (a zero-length frame before the handshake waited for the handshake's timeout)."""
    if avail >= 4:
        length = int.from_bytes(buf[pos : pos + 4], "big")
        if length < HEADER_SIZE - 4:
            raise ProtocolError(f"frame length {length} is shorter than its header")
