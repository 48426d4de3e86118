"""``Limits``: the bounds and defaults of a store (API.md, "Limits and defaults"), for tuning and tests."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from .errors import InvalidError


class Limits(msgspec.Struct, kw_only=True, frozen=True):
    """Bounds and defaults. Sizes in bytes, times in seconds, counts as ints.

    Pass ``tinystore.Limits(channel_log=100)`` to ``open(..., limits=...)`` to change some; the rest keep
    their defaults. Every value is checked when a ``Limits`` is made (or read from JSON): counts and sizes are
    ints of 1 or more (``frame_body_bytes`` at most what a frame can carry, ``readers`` at most 1024,
    ``job_attempts`` at most 1000), durations finite numbers of seconds above 0 and at most ten years
    (``inline_read`` and ``job_keep`` may be 0), and ``lock_ttl_min`` is at most ``lock_ttl_max``; else
    ``InvalidError`` naming the field, the value and the allowed range.
    """

    channel_message_bytes: int = 64 * 1024
    channel_log: int = 1024
    channel_log_bytes: int = 4 * 1024 * 1024
    channel_linger: float = 60.0
    channel_total_bytes: int = 64 * 1024 * 1024
    channel_prefetch: int = 64
    subscriptions: int = 100_000
    lock_ttl: float = 10.0
    lock_ttl_min: float = 1.0
    lock_ttl_max: float = 3600.0
    hold_wait: float = 10.0
    tx_idle: float = 5.0
    tx_max: float = 30.0
    statement_timeout: float = 30.0
    sql_result_bytes: int = 64 * 1024 * 1024
    job_value_bytes: int = 1024 * 1024
    job_attempts: int = 5
    job_backoff_first: float = 10.0
    job_backoff_cap: float = 270.0
    job_lease: float = 30.0
    job_timeout: float = 60.0
    job_expected: float = 30.0
    job_progress_bytes: int = 4096
    job_keep: float = 7 * 86400.0
    frame_body_bytes: int = 16 * 1024 * 1024
    sidecar_idle: float = 30.0
    readers: int = 4
    #: read-only transactions open at once in the store, all databases together (each holds a thread and a
    #: connection)
    read_transactions: int = 128
    #: databases open at once in a store (each holds a writer thread, ``readers`` reader threads, files)
    databases: int = 1000
    #: the heap SQLite may use in this process, all connections together (SQLite's hard heap limit): a statement
    #: that would need more fails with ``LimitError`` rather than the process running out of memory
    sql_memory_bytes: int = 4 * 1024 * 1024 * 1024
    #: a read first runs on the event loop for at most this long (seconds); past it SQLite interrupts it and it
    #: runs again on a reader thread. 0 sends every read to a reader thread.
    inline_read: float = 0.0005

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            _check(name, getattr(self, name))
        if self.lock_ttl_min > self.lock_ttl_max:
            raise InvalidError(
                f"Limits: lock_ttl_min ({self.lock_ttl_min!r}) is above lock_ttl_max ({self.lock_ttl_max!r})"
            )

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Limits:
        """Limits from :meth:`to_json`'s text. Raises ``InvalidError`` (a value out of its range, not JSON, or
        of the wrong type)."""
        try:
            return msgspec.json.decode(text, type=cls)
        except msgspec.DecodeError as exc:
            raise InvalidError(f"Limits: {exc}") from None


TEN_YEARS = 10 * 365 * 86400.0
"""The longest duration a limit may be (a thread's wait longer than some hundred years fails)."""

FRAME_BODY_MAX = (1 << 32) - 8
"""The largest frame body the wire can carry (a frame's length is a u32 that counts 7 header bytes too)."""

_INTS = frozenset(f.name for f in msgspec.structs.fields(Limits) if f.type is int)
_INT_MAX: dict[str, int] = {"frame_body_bytes": FRAME_BODY_MAX, "readers": 1024, "job_attempts": 1000}
_ZERO_OK = frozenset({"inline_read", "job_keep"})


def _check(name: str, value: Any) -> None:
    """Raise ``InvalidError`` naming ``name``, ``value`` and the allowed range when ``value`` is out of it."""
    if name in _INTS:
        high = _INT_MAX.get(name)
        if type(value) is not int or value < 1 or (high is not None and value > high):
            allowed = f"an int from 1 to {high}" if high is not None else "an int, 1 or more"
            raise InvalidError(f"Limits: {name} = {value!r}: it must be {allowed}")
        return
    zero_ok = name in _ZERO_OK
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
        or value > TEN_YEARS
    ):
        low = "0 or more" if zero_ok else "above 0"
        raise InvalidError(
            f"Limits: {name} = {value!r}: it must be a number of seconds, {low} and at most {TEN_YEARS:.0f} (ten years)"
        )
