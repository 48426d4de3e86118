"""Bodies of the handshake and of errors, and the codec helpers every side uses."""

from __future__ import annotations

import datetime
from typing import Any

import msgspec


class Hello(msgspec.Struct, kw_only=True):
    """Client → server, first frame: the protocol version it speaks and its token (TCP; empty on Unix).
    ``instance``: random, the same for every connection of one SDK transport (its reconnects); it has one
    connection at a time, so a new one ends the one before it at the server, which may not know yet that the
    network cut it off (empty: not said)."""

    version: int
    token: str = ""
    client: str = ""
    pid: int = 0
    instance: str = ""
    #: which connection of that transport this is (1, 2, …): the server says what it read of each by its number
    connection: int = 0


COMMAND_LINE = "tinystore command line"
"""How the command line names itself in its ``Hello.client`` (followed by its pid): a server whose descriptors are
all in use keeps its last few for it (see ``Listener``: ``status`` and ``stop`` get in past clients waiting)."""


class Welcome(msgspec.Struct, kw_only=True):
    """Server → client: accepted. ``epoch`` changes at each server start (ms)."""

    version: int
    server_version: str
    epoch: int
    capability: str
    max_inflight: int
    max_body: int
    pid: int
    test_clock: bool = False
    limits: str = ""  # the server's Limits (Limits.to_json), which its engines hold to; "" from an older server
    durability: str = ""  # the server's durability ("full" or "os"); "" from an older server
    #: what the servers of the store read of this client's connections before this one, as far as they know:
    #: ``[epoch, connection, last stream read]`` each (a connection that ended without telling its client which
    #: requests were read: a GOAWAY it did not read, a network cut); a request after the last one read was never
    #: run. Facts of a server that stopped gracefully (written down for the next ones) or ended the connection as
    #: this one came
    last_reads: list[tuple[int, int, int]] = []
    #: the store's id (``DIR/ID``): the same across its restarts and backups, another for another store made at
    #: the same path; "" from an older server
    store: str = ""


class ErrorBody(msgspec.Struct, kw_only=True):
    """An error on the wire: a stable ``code``, a message naming the thing, extra fields."""

    code: str
    message: str
    extra: dict[str, Any] = {}


class GoAway(msgspec.Struct, kw_only=True):
    """Either side: the connection is closing, and why. ``last_stream`` (the server's): the highest stream of a
    request it read on this connection; a request on a higher stream was never read, so never run, and may be sent
    again elsewhere (as HTTP/2's GOAWAY says, RFC 9113 section 6.8). ``None``: not said. ``stopping`` (the
    server's): the store itself is stopping (a graceful stop), so nothing it holds for the client outlives it: the
    SDK ends the leases held through the connection at once, before it reconnects (LOCK-07). An older server does
    not say it (``False``): its stop's GOAWAY is the one with code ``unavailable`` and a ``last_stream``."""

    reason: str
    code: str = "closed"
    last_stream: int | None = None
    stopping: bool = False


encoder = msgspec.msgpack.Encoder()
encode = encoder.encode
_encode_into = encoder.encode_into


def encode_answer(value: Any) -> bytearray:
    """:func:`encode`, into a new bytearray: for what may be large (a query's rows, a request's parameters).
    msgspec's ``encode`` to bytes crashes the process (SIGSEGV, msgspec 0.23) when memory runs out as its buffer
    grows (trial EG: a server under a memory limit answering 60 MB of rows; a client sending 12 MB);
    ``encode_into`` raises ``MemoryError``, which the server answers, and a client's caller gets."""
    out = bytearray()
    _encode_into(value, out)
    return out


_AS_THEY_ARE = (bytes, bytearray, memoryview, datetime.datetime, datetime.date, datetime.time)


def escaped(value: Any) -> Any:
    """``value`` as builtins (what :func:`encode` sends for it), where each str that UTF-8 cannot hold (a lone
    surrogate: a path of bytes that are not UTF-8, as ``os.fsdecode`` gives it) has those escaped (``\\udcff``):
    what the server sends when ``encode(value)`` raised ``UnicodeEncodeError`` (its answers and errors name
    paths, and a directory's path need not be UTF-8: trial CR). Raises what ``msgspec.to_builtins`` raises."""
    return _escape(msgspec.to_builtins(value, builtin_types=_AS_THEY_ARE))


def encode_escaping(value: Any) -> bytes:
    """:func:`encode`, or, when a str of ``value`` is not UTF-8, that of :func:`escaped` (``value``)."""
    try:
        return encode(value)
    except UnicodeEncodeError:
        return encode(escaped(value))


def _escape(v: Any) -> Any:
    if type(v) is str:
        return v.encode("utf-8", "backslashreplace").decode("utf-8")
    if type(v) is list:
        return [_escape(x) for x in v]
    if type(v) is dict:
        return {_escape(k): _escape(x) for k, x in v.items()}
    return v


_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def decoder_for(type: Any) -> msgspec.msgpack.Decoder[Any]:
    """The (cached) MessagePack decoder of ``type``."""
    dec = _decoders.get(type)
    if dec is None:
        dec = _decoders[type] = msgspec.msgpack.Decoder(type)
    return dec


def decode(data: bytes, type: Any = Any) -> Any:
    """Decode MessagePack ``data`` as ``type`` (a cached decoder per type)."""
    dec = _decoders.get(type)
    if dec is None:
        dec = decoder_for(type)
    return dec.decode(data)
