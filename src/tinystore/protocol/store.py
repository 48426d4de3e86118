"""Wire bodies of the store's own methods (status, clock, stop)."""

from __future__ import annotations

import msgspec


class Empty(msgspec.Struct):
    pass


class Advance(msgspec.Struct):
    """``clock.advance``: move a test clock forward by ``seconds``."""

    seconds: float


class Backup(msgspec.Struct):
    """``store.backup``: copy the store into ``dest``, an absolute path on the server's machine."""

    dest: str


class Stop(msgspec.Struct):
    """``store.stop``: stop the server gracefully, waiting at most ``grace`` seconds for calls under way."""

    grace: float = 10.0
