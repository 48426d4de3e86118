"""``Limits``: the bounds and defaults of a store (API.md, "Limits and defaults"), for tuning and tests."""

from __future__ import annotations

import difflib
import math
from datetime import timedelta
from typing import Any

import msgspec
import msgspec.structs

from .durations import seconds
from .errors import InvalidError
from .protocol.values import plain_int, shown


class Limits(msgspec.Struct, kw_only=True, frozen=True):
    """Bounds and defaults. Sizes in bytes, times in seconds, counts as ints.

    Pass ``tinystore.Limits(channel_log=100)`` to ``open(..., limits=...)`` to change some; the rest keep
    their defaults. Every value is checked when a ``Limits`` is made (or read from JSON): counts and sizes are
    ints of 1 or more (``frame_body_bytes`` at most what a frame can carry, ``readers`` at most 1024,
    ``job_attempts`` at most 1000, ``sql_memory_bytes`` and ``client_output_bytes`` at least 1 MiB), durations
    (seconds, a ``timedelta`` or text such as ``"30s"``, kept as seconds) finite, above 0 and at most ten years
    (``inline_read`` and ``job_keep`` may be 0), ``lock_ttl_min`` is at most ``lock_ttl_max``, ``lock_ttl``
    (the ttl of a lock made without one) lies within ``lock_ttl_min`` .. ``lock_ttl_max``, and
    ``job_backoff_first`` is at most ``job_backoff_cap``; else ``InvalidError`` naming the field, the value and
    the allowed range (or both bounds). ``lock_ttl`` and ``job_backoff_first`` left at their defaults (10 s)
    (or given equal to them) follow bounds given that exclude them: ``Limits(lock_ttl_max=5)`` has a
    ``lock_ttl`` of 5 s, and ``Limits(job_backoff_cap=5)`` a ``job_backoff_first`` of 5 s.
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
    #: databases open (or being opened) at once in a store (each holds a writer thread, ``readers`` reader threads,
    #: files); at the limit, the one a call used the longest ago of those not in use is closed to open another; when
    #: each is in use, an open waits up to 2 s for one to be done with, then raises ``LimitError``
    databases: int = 1000
    #: a database no call used for this long (seconds), with nothing running or waiting in it and no queue's jobs,
    #: is closed (its threads end, its files close); its next call opens it again
    database_idle: float = 60.0
    #: the heap SQLite may use in this process, all connections together (SQLite's hard heap limit): a statement
    #: that would need more fails with ``LimitError`` rather than the process running out of memory
    sql_memory_bytes: int = 4 * 1024 * 1024 * 1024
    #: a read first runs on the event loop for at most this long (seconds); past it SQLite interrupts it and it
    #: runs again on a reader thread. 0 sends every read to a reader thread.
    inline_read: float = 0.0005
    #: bytes the server holds written for its clients and not yet taken by them (answers, channel messages), all
    #: connections together: past it, the connection holding the most of those whose client took nothing for
    #: ``client_output_stall`` is closed at once, what it held dropped (as Redis's ``maxmemory-clients``), and past
    #: twice it, of those whose client took nothing for a second; its SDK connects again and sends its reads again.
    #: A client that reads is not closed for it
    client_output_bytes: int = 1024 * 1024 * 1024
    #: seconds a client must have taken nothing of what the server holds for it before its connection may be closed
    #: for ``client_output_bytes`` (its progress is seen in steps of a TCP window's opening, up to some 64 KiB
    #: through a proxy on the server's machine: a shorter stall closes clients that read slowly)
    client_output_stall: float = 30.0

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if plain_int(value) is not value:  # an int subclass (an IntEnum): a plain int, as everywhere else
                value = plain_int(value)
                msgspec.structs.force_setattr(self, name, value)
            if name not in _INTS and isinstance(value, str | timedelta):
                # a duration as text or a timedelta, as everywhere else (API.md; trial CR: "5s" was refused)
                value = seconds(value, f"Limits: {name}")
                msgspec.structs.force_setattr(self, name, value)
            _check(name, value)
        if self.lock_ttl_min > self.lock_ttl_max:
            raise InvalidError(
                f"Limits: lock_ttl_min ({self.lock_ttl_min!r}) is above lock_ttl_max ({self.lock_ttl_max!r})"
            )
        # a default and the bounds it must lie within: a value given out of them is refused; the default itself,
        # when the bounds given exclude it, takes the nearest bound (Limits(lock_ttl_max=5) has a lock_ttl of 5)
        for name, low, high in _WITHIN:
            value = getattr(self, name)
            lo = getattr(self, low) if low is not None else -math.inf
            hi = getattr(self, high)
            if lo <= value <= hi:
                continue
            if value != _DEFAULTS[name]:
                bounds = f"within {low} ({lo!r}) .. {high} ({hi!r})" if low is not None else f"at most {high} ({hi!r})"
                raise InvalidError(f"Limits: {name} = {value!r}: it must be {bounds}")
            msgspec.structs.force_setattr(self, name, float(min(max(value, lo), hi)))

    def to_json(self) -> str:
        """These limits as JSON text, for :meth:`from_json`: one object holding every field under its name
        (``{"channel_message_bytes": 65536, ..., "lock_ttl": 10.0, ...}``), sizes in bytes and counts as
        integers, durations as numbers of seconds. Raises nothing."""
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Limits:
        """Limits from JSON text (str or UTF-8 bytes) such as :meth:`to_json` writes: one object whose keys are
        field names, sizes in bytes, counts as ints, durations as numbers of seconds; the fields it leaves out
        keep their defaults; a duration may also be text, such as ``"30s"``.

        Raises ``InvalidError`` for text that is not JSON or not an object, a ``text`` that is neither str nor
        bytes, a key that names no field (naming the key and the nearest field name, or all of them), a value
        of the wrong type, and a value out of its range (as ``Limits(...)`` does)."""
        if not isinstance(text, str | bytes | bytearray | memoryview):
            raise InvalidError(f"Limits.from_json: expected JSON text (str or bytes), got {type(text).__name__}")
        try:
            raw = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise InvalidError(f"Limits: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidError(f"Limits: expected a JSON object of limits, got {type(raw).__name__} {raw!r:.40}")
        for key in raw:
            if key not in _FIELDS:
                near = difflib.get_close_matches(key, cls.__struct_fields__, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else f"; the limits are {', '.join(sorted(_FIELDS))}"
                raise InvalidError(f"Limits: unknown limit {key!r}{hint}")
        for key, value in raw.items():
            if key in _INTS and isinstance(value, str):
                raise InvalidError(f"Limits: {key} = {shown(value)}: it must be an int (bytes, or a count), not text")
            if key not in _INTS and isinstance(value, str):
                # a duration as text ("30s"), as Limits(...) takes it (trial HV: `--limits '{"tx_idle": "2s"}'` was
                # refused "Expected `float`, got `str`")
                raw[key] = seconds(value, f"Limits: {key}")
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as exc:
            raise InvalidError(f"Limits: {exc}") from None


TEN_YEARS = 10 * 365 * 86400.0
"""The longest duration a limit may be (a thread's wait longer than some hundred years fails)."""

FRAME_BODY_MAX = (1 << 32) - 8
"""The largest frame body the wire can carry (a frame's length is a u32 that counts 7 header bytes too)."""

INT_MAX = (1 << 63) - 1
"""The largest count or size a limit may be (trial FS: one past 64 bits was taken, and the store's status, which
tells it, could not be encoded)."""

_INTS = frozenset(f.name for f in msgspec.structs.fields(Limits) if f.type is int)
_INT_MAX: dict[str, int] = {"frame_body_bytes": FRAME_BODY_MAX, "readers": 1024, "job_attempts": 1000}
# (sql_memory_bytes: less, opening a database failed: trial CR)
_INT_MIN: dict[str, int] = {"sql_memory_bytes": 1 << 20, "client_output_bytes": 1 << 20}
_ZERO_OK = frozenset({"inline_read", "job_keep"})
_FIELDS = frozenset(Limits.__struct_fields__)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in msgspec.structs.fields(Limits)}
_WITHIN: tuple[tuple[str, str | None, str], ...] = (
    ("lock_ttl", "lock_ttl_min", "lock_ttl_max"),  # the ttl of a lock made without one
    ("job_backoff_first", None, "job_backoff_cap"),  # a queue refuses a first delay above its cap
)
"""``(name, low, high)``: a default that must lie within other fields (``low`` None: only below ``high``)."""


def _check(name: str, value: Any) -> None:
    """Raise ``InvalidError`` naming ``name``, ``value`` and the allowed range when ``value`` is out of it."""
    if name in _INTS:
        high = _INT_MAX.get(name, INT_MAX)
        least = _INT_MIN.get(name, 1)
        if type(value) is not int or value < least or value > high:
            if high != INT_MAX:
                allowed = f"an int from {least:,} to {high}"
            elif type(value) is int and value > high:
                allowed = f"an int, at most {high:,}"
            else:
                allowed = f"an int, {least:,} or more"
            raise InvalidError(f"Limits: {name} = {shown(value)}: it must be {allowed}")
        return
    zero_ok = name in _ZERO_OK
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or (isinstance(value, int) and not -TEN_YEARS <= value <= TEN_YEARS)  # (past a float's range: OverflowError)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
        or value > TEN_YEARS
    ):
        low = "0 or more" if zero_ok else "above 0"
        raise InvalidError(
            f"Limits: {name} = {shown(value)}: it must be a number of seconds, {low} and at most {TEN_YEARS:.0f} "
            "(ten years)"
        )
