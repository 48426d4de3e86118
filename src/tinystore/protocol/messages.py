"""Bodies of the handshake and of errors, and the codec helpers every side uses."""

from __future__ import annotations

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
    #: for a client whose connection before this one ended without its telling which requests it read (the
    #: client did not read its GOAWAY, or the network cut it): the epoch of the server it was connected to, and the
    #: last request that server read of it; a request after it was never run. ``-1``: not known
    last_read_epoch: int = 0
    last_read: int = -1


class ErrorBody(msgspec.Struct, kw_only=True):
    """An error on the wire: a stable ``code``, a message naming the thing, extra fields."""

    code: str
    message: str
    extra: dict[str, Any] = {}


class GoAway(msgspec.Struct, kw_only=True):
    """Either side: the connection is closing, and why. ``last_stream`` (the server's): the highest stream of a
    request it read on this connection; a request on a higher stream was never read, so never run, and may be sent
    again elsewhere (as HTTP/2's GOAWAY says, RFC 9113 section 6.8). ``None``: not said."""

    reason: str
    code: str = "closed"
    last_stream: int | None = None


encoder = msgspec.msgpack.Encoder()
encode = encoder.encode
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
