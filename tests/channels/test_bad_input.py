"""Bad input to channels that Python itself would trip on: a value that holds itself or nests too deeply, an
``on_missed`` of ``each`` that is not callable. Each is an ``InvalidError`` naming the channel, at once, in
every mode; nothing is published."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tinystore import InvalidError
from tinystore.protocol.channels import non_finite

from ..helpers import open_store


@dataclass
class Box:
    items: list[Any]


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    cur = top
    for _ in range(depth):
        inner: list[Any] = []
        cur.append(inner)
        cur = inner
    return top


async def test_a_value_that_holds_itself_or_nests_too_deeply_is_invalid_naming_the_channel(
    store: tinystore.Store,
) -> None:
    itself: list[Any] = []
    itself.append(itself)
    heard: list[Any] = []
    sub = await store.channel("c").subscribe(lambda m: heard.append(m.value))
    for value in (itself, _nested(1200), {"a": _nested(5000)}):
        with pytest.raises(InvalidError, match=r"^channel c: the value does not encode: it holds itself, or nests"):
            await store.channel("c").publish(value)
    typed = store.channel("boxes", Box)
    with pytest.raises(InvalidError, match=r"^channel boxes: the value does not encode"):
        await typed.under(1).publish(Box(items=_nested(1200)))
    await store.channel("c").publish("after")  # the channel goes on; nothing of the refused ones was published
    for _ in range(500):
        if heard:
            break
        await asyncio.sleep(0.01)
    await sub.stop()
    assert heard == ["after"]


async def test_each_refuses_an_on_missed_that_is_not_callable_at_once(store: tinystore.Store) -> None:
    ch = store.channel("c").under(1)
    for bad in (7, "x"):
        with pytest.raises(InvalidError, match=rf"^channel c: each: on_missed {bad!r} is not callable"):
            ch.each(on_missed=bad)  # type: ignore[arg-type]
    assert (await store.status())["channels"]["subscriptions"] == 0


def test_a_payload_nested_too_deeply_to_check_is_told_not_raised() -> None:
    nan = msgspec.msgpack.encode(float("nan"))
    assert non_finite(b"\x91" * 200_000 + nan) == "it nests too deeply to be read"
    assert non_finite(b"\x91" * 10 + nan) == "nan is not a JSON number (at $[0][0][0][0][0][0][0][0][0][0])"
