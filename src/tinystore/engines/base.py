"""What an engine sees of a client: a :class:`Peer`."""

from __future__ import annotations

from typing import Any, Protocol


class Peer(Protocol):
    """One client of the store as an engine sees it: a connection, or the embedded process itself.

    ``id`` is unique among the peers of one server run. ``local`` is true for the embedded store's own
    process (its lock leases end only when their block ends). ``closed`` becomes true when the client is gone.
    ``push(method, body)`` sends a server-initiated message to the client; it never blocks and never raises
    (a push to a closed peer is dropped). ``body`` is a msgspec Struct (or plain msgpack-able data).
    """

    id: int
    local: bool
    closed: bool

    def push(self, method: str, body: Any) -> None: ...
