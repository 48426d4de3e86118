"""A client that speaks the protocol by hand may send any bytes as a payload: the store refuses one that is not one
whole MessagePack value, so that subscribers never get a decode error instead of a message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tinystore.protocol.channels import PUBLISH, PUBLISH_MANY, Publish, PublishMany

from ..helpers import open_store


# contract: STORE-04
@pytest.mark.parametrize("payload", [b"\xc1", b"\x92\x01", b"\x01\x02", b""])
async def test_a_payload_that_is_not_messagepack_is_refused(payload: bytes, tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "d") as store:
        got: list[object] = []
        errors: list[BaseException] = []
        sub = await store.channel("ev").subscribe(got.append, on_error=errors.append)
        with pytest.raises(tinystore.InvalidError) as info:
            await store.transport.call(PUBLISH, Publish("ev", [], payload), retry=False)  # type: ignore[attr-defined]
        assert "not one MessagePack value" in info.value.message and "ev" in info.value.message
        with pytest.raises(tinystore.InvalidError):
            items = [Publish("ev", [], b"\x01"), Publish("ev", [], payload)]
            await store.transport.call(PUBLISH_MANY, PublishMany(items), retry=False)  # type: ignore[attr-defined]
        await store.channel("ev").publish({"ok": 1})
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        assert [m.value for m in got] == [{"ok": 1}] and errors == []  # type: ignore[attr-defined]
        await sub.stop()
