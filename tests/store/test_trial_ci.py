"""From trial CI: a new user following the docs word by word (limits' errors, messages that name what was
wrong)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

import tinystore
from tinystore import InvalidError, LimitError

from ..helpers import open_store


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_count_limit_says_what_was_wanted(tmp_path: Path, mode: str) -> None:
    """``LimitError.wanted`` was None for the count limits (docs/sql.md: ``.wanted``, the size asked)."""
    limits = tinystore.Limits(read_transactions=1, databases=1)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app")

        async def in_use(tx: tinystore.SqlTx) -> None:  # (an unused database makes room: trial EM)
            with pytest.raises(LimitError) as raised:
                await store.database("other")
            assert (raised.value.limit, raised.value.wanted) == (1, 2)

        await db.tx(in_use)

        async def nested(tx: tinystore.SqlTx) -> None:
            await db.tx(lambda tx2: tx2.scalar("select 1"), read_only=True)

        with pytest.raises(LimitError) as raised:
            await db.tx(nested, read_only=True)
        assert (raised.value.limit, raised.value.wanted) == (1, 2)


# contract: STORE-04
async def test_a_branch_part_and_a_long_duration_are_named_as_such(tmp_path: Path) -> None:
    """A branch part too long said "key ...: a key is 1 to 256 characters" (a channel has no keys); a delay of
    100 years and a day said "got 3.15369e+09s"."""
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(InvalidError) as raised:
            store.channel("c").under("a" * 257)
        assert "branch part" in raised.value.message and "1 to 256 characters (this one has 257)" in str(raised.value)
        assert "key" not in raised.value.message
        with pytest.raises(InvalidError, match=r"delay: a duration is at most 100 years \(36500d\), got 36501d"):
            await store.queue("q").add(1, delay=timedelta(days=36501))


# contract: STORE-04
async def test_a_duration_just_past_100_years_is_not_shown_as_the_limit(tmp_path: Path) -> None:
    """For 36500d1s: "at most 100 years (36500d), got 36500d" (trial CK); a lock key too long says its length."""
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(InvalidError, match=r"at most 100 years \(36500d\), got 36500d1s$"):
            await store.queue("q").add(1, delay="36500d1s")
        with pytest.raises(InvalidError, match=r"\(this one has 300\)"):
            async with store.lock("l").hold("k" * 300):
                pass
