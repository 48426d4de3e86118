"""A subscription handler that raises ``CancelledError`` itself, or cancels its own task, never leaves the
subscription silently dead: the first is an error like any other (``on_error``, and delivery goes on), the
second ends the subscription, said in the log, and the store forgets it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from ..store.test_cancel import wait_for


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "s") as s:
        yield s


async def test_a_handler_raising_cancelled_error_is_an_error_and_the_subscription_goes_on(
    store: tinystore.Store,
) -> None:
    ch = store.channel("ev")
    handled: list[int] = []
    errors: list[Exception] = []

    async def handler(m: tinystore.Message[Any]) -> None:
        handled.append(m.value)
        if m.value == 3:
            raise asyncio.CancelledError()  # e.g. let through from an inner task that was cancelled

    sub = await ch.subscribe(handler, on_error=errors.append)
    try:
        for i in range(10):
            await ch.publish(i)
        await wait_for(lambda: len(handled) == 10, "every message to be handled")
        assert handled == list(range(10))
        assert [str(e) for e in errors] == ["the handler raised CancelledError"]
        assert sub.active and sub.statistics()["errors"] == 1
    finally:
        await sub.stop()


async def test_a_handler_cancelling_its_own_task_ends_the_subscription_and_says_so(
    store: tinystore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    ch = store.channel("ev")
    handled: list[int] = []

    async def handler(m: tinystore.Message[Any]) -> None:
        handled.append(m.value)
        if m.value == 3:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

    caplog.set_level(logging.WARNING)
    sub = await ch.subscribe(handler)
    try:
        for i in range(10):
            await ch.publish(i)
        await wait_for(lambda: not sub.active, "the subscription to end")
        assert handled == [0, 1, 2, 3]
        assert any("the subscription ended" in r.getMessage() for r in caplog.records), caplog.text
        for _ in range(200):  # the store is told on the next loop turn
            status = await store.status()
            if status["channels"]["subscriptions"] == 0:
                break
            await asyncio.sleep(0.01)
        assert status["channels"]["subscriptions"] == 0, status["channels"]
    finally:
        await sub.stop()
