"""From trial HQ: in an embedded store, a loop of plain ``await db.one("select …")`` with no other await never let
the event loop turn (the SDK's in-process shortcut read the engine straight, and only the server's way checked
the inline budget of a turn): other tasks, the store's own socket (the CLI: "does not answer") and timers waited
for as long as the loop read. Past the budget of one turn, every way of reading lets the loop turn."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import LoopTurns, open_store


@dataclass
class Row:
    id: int


READS: dict[str, Any] = {
    "one": lambda db: db.one("select id from t where id = ?", 1),
    "one_typed": lambda db: db.one(Row, "select id from t where id = ?", 1),
    "all": lambda db: db.all("select id from t where id = ?", 1),
    "scalar": lambda db: db.scalar("select id from t where id = ?", 1),
}
# (trial HR: a loop of reads that failed, polling for a table another program makes, held the loop for good)
FAILING: dict[str, Any] = {
    "one_no_such_table": lambda db: db.one("select * from settings where id = ?", 1),
    "one_a_write": lambda db: db.one("delete from t"),
    "one_bad_value": lambda db: db.one("select id from t where id = ?", float("nan")),
    "exec_bad_value": lambda db: db.exec("insert into t (id) values (?)", float("nan")),
    "exec_no_such_table": lambda db: db.exec("insert into settings (id) values (1)"),
}


@pytest.mark.parametrize("how", sorted(READS) + sorted(FAILING))
# contract: STORE-04
async def test_a_read_loop_with_no_other_await_lets_the_loop_turn(tmp_path: Path, how: str) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key)")
        await db.exec("insert into t (id) values (1)")
        read = READS.get(how) or FAILING[how]
        async with LoopTurns() as turns:
            for _ in range(1_600):  # (three times the inline budget of a turn)
                if how in FAILING:
                    with pytest.raises(tinystore.InvalidError):
                        await read(db)
                else:
                    await read(db)
            assert turns.count >= 3  # (the other task ran, each time a turn's budget was spent)


# contract: STORE-04
async def test_a_loop_of_calls_refused_for_their_size_lets_the_loop_turn(tmp_path: Path) -> None:
    """Trial HU: the size check came before the turn's count, so a loop of calls over the frame limit never turned."""
    limits = tinystore.Limits(frame_body_bytes=1 << 20)
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, v text)")
        big = "x" * (1 << 20)
        async with LoopTurns() as turns:
            for _ in range(1_100):
                with pytest.raises(tinystore.LimitError):
                    await db.exec("insert into t (v) values (?)", big)
            assert turns.count >= 2


# contract: STORE-04
@pytest.mark.parametrize("how", ["one", "all", "status"])
async def test_a_read_loop_lets_the_timers_due_run_before_it_goes_on(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial IE: a loop of reads let the loop turn after each 5 ms of calls with ``asyncio.sleep(0)``, which runs
    the task again before the timers that fell due meanwhile: a 10 ms ticker beside it waited 5 ms more each time
    (gaps of 25 ms). Each turn's budget spent, the timers due run first."""
    import asyncio

    from tinystore.client import transport

    monkeypatch.setattr(transport, "INLINE_TURN_CALLS", 4)
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key)")
        await db.exec("insert into t (id) values (1)")
        call = {
            "one": lambda: db.one("select id from t where id = ?", 1),
            "all": lambda: db.all("select id from t"),
            "status": store.status,
        }[how]
        await asyncio.sleep(0.01)
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        loop.call_later(0, seen.append, "timer")  # due at once: its turn comes once the loop turns
        for _ in range(12):
            await call()
            seen.append("call")
        first = seen.index("timer")
        assert first <= 5, seen  # (the turn's 4 calls, then the timer: not a second turn's calls first)
