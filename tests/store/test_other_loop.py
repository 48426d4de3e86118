"""A store belongs to the event loop it was opened on: a call from another loop (a thread's own loop, a test
framework's next loop) gets one clear ``InvalidError`` in every mode, instead of a ``RuntimeError`` about
futures attached to a different loop, or (embedded) some calls working and others not; the store goes on
working on its own loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError

from ..helpers import open_store, stop_sidecar


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_call_from_another_event_loop_is_refused_clearly(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a);")])
        await db.exec("insert into t values (1)")
        q = store.queue("q")
        ch = store.channel("c")
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "db.one": lambda: db.one("select count(*) as n from t"),
            "db.scalar": lambda: db.scalar("select count(*) from t"),
            "db.exec": lambda: db.exec("insert into t values (2)"),
            "db.tx": lambda: db.tx(lambda tx: tx.scalar("select 1")),
            "queue.add": lambda: q.add({"a": 1}),
            "channel.publish": lambda: ch.publish(1),
            "store.status": lambda: store.status(),
        }

        def in_another_loop() -> dict[str, str]:
            async def each() -> dict[str, str]:
                out = {}
                for name, call in calls.items():
                    try:
                        await asyncio.wait_for(call(), 5)
                        out[name] = "ran"
                    except InvalidError as exc:
                        out[name] = exc.message
                    except Exception as exc:
                        out[name] = f"{type(exc).__name__}: {exc}"
                return out

            return asyncio.run(each())

        got = await asyncio.to_thread(in_another_loop)
        for name, said in got.items():
            assert "used from another event loop than the one it was opened on" in said, (name, said)
        assert await db.scalar("select count(*) from t") == 1  # nothing ran; the store's own loop goes on
        assert isinstance(await store.status(), dict)


# contract: STORE-05
def test_close_from_a_later_event_loop_is_refused_clearly(tmp_path: Path) -> None:
    # trial BU: a store opened in one asyncio.run() and closed in a later one raised a bare RuntimeError ("Event loop
    # is closed"), where every other call says it was used from another event loop
    d = tmp_path / "s"
    store = asyncio.run(tinystore.open(d, private=True))
    try:
        with pytest.raises(InvalidError) as info:
            asyncio.run(store.close())
        assert info.value.message.startswith(
            f"store private:{d}: used from another event loop than the one it was opened on"
        ), info.value.message
    finally:
        asyncio.run(stop_sidecar(d))  # its own loop is gone: the private server is stopped by its pid


# contract: STORE-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_close_from_another_running_loop_is_refused_and_the_store_goes_on(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:

        def in_another_loop() -> str:
            async def close() -> str:
                try:
                    await asyncio.wait_for(store.close(), 5)
                except Exception as exc:
                    return f"{type(exc).__name__}: {exc}"
                return "closed"

            return asyncio.run(close())

        said = await asyncio.to_thread(in_another_loop)
        assert said.startswith("InvalidError: ") and "used from another event loop" in said, said
        assert isinstance(await store.status(), dict)  # nothing was closed; the store's own loop goes on
    assert repr(store).endswith(" closed>")
