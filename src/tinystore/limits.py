"""``Limits``: the bounds and defaults of a store (API.md, "Limits and defaults"), for tuning and tests."""

from __future__ import annotations

import msgspec


class Limits(msgspec.Struct, kw_only=True, frozen=True):
    """Bounds and defaults. Sizes in bytes, times in seconds, counts as ints.

    Pass ``tinystore.Limits(channel_log=100)`` to ``open(..., limits=...)`` to change some; the rest keep
    their defaults.
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
    #: a read first runs on the event loop for at most this long (seconds); past it SQLite interrupts it and it
    #: runs again on a reader thread. 0 sends every read to a reader thread.
    inline_read: float = 0.0005

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Limits:
        return msgspec.json.decode(text, type=cls)
