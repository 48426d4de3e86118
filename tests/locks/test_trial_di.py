"""From trial DI: what breaking this session's lock fixes found."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import tinystore
from tinystore.client.locks import NEVER

from ..helpers import open_store


async def test_a_max_hold_ending_past_year_9999_reads_as_never(tmp_path: Path) -> None:
    """With a test clock near the end of 9999 and a long max_hold, lease.max_hold_at raised a bare ValueError
    ("year 10089 is out of range"); it is NEVER, the last moment a datetime holds."""
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False, clock=datetime(9990, 1, 1, tzinfo=UTC))
    try:
        async with store.lock("l", max_hold="36500d").try_hold("k") as lease:
            assert lease.max_hold_at == NEVER
            assert lease.expires_at == NEVER  # (held by the store's own process: no ttl ends it)
        async with store.lock("l", max_hold="1d").try_hold("k") as lease:
            at = lease.max_hold_at  # (a test clock runs on by itself from its start)
            assert at is not None and timedelta(0) <= at - datetime(9990, 1, 2, tzinfo=UTC) < timedelta(minutes=1)
    finally:
        await store.close()


async def test_status_of_a_lease_ending_past_year_9999_reads_never(tmp_path: Path) -> None:
    """From trial DK: store.status()["locks"] was {"error": "year 10000 is out of range"} (and so the CLI's status)
    while a lease's end was past 9999; its expires reads "never", as the lease's own times do."""
    async with open_store("private", tmp_path / "s", clock=datetime(9999, 12, 31, 23, 30, tzinfo=UTC)) as store:
        async with store.lock("c", ttl="1h").hold(1) as lease:
            assert lease.expires_at == NEVER
            locks = (await store.status())["locks"]
            assert "error" not in locks, locks
            assert [(k["key"], k["held"], k["expires"]) for k in locks["keys"]] == [("1", 1, "never")]
