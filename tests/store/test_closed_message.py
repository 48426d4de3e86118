"""After ``store.close()``, a call says which store was closed: its directory, or its address (every mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import ServerProcess, open_store, write_tokens


@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_a_call_after_close_names_the_directory(tmp_path: Path, mode: str) -> None:
    directory = tmp_path / "s"
    async with open_store(mode, directory) as store:
        db = await store.database("app")
        await store.close()
        where = str(directory.resolve())
        with pytest.raises(tinystore.ClosedError, match=f"^store {where} is closed$"):
            await db.exec("create table t (a)")
        with pytest.raises(tinystore.ClosedError, match=f"^store {where} is closed$"):
            await db.all("select 1")
        with pytest.raises(tinystore.ClosedError, match=f"^store {where} is closed$"):
            await store.status()


async def test_a_call_after_close_names_the_address(tmp_path: Path) -> None:
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "s", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        address = server.tcp
        store = await tinystore.connect(address, token=admin)
        db = await store.database("app")
        await store.close()
        with pytest.raises(tinystore.ClosedError, match=f"^store {address} is closed$"):
            await db.one("select 1")
        with pytest.raises(tinystore.ClosedError, match=f"^store {address} is closed$"):
            await store.status()
    finally:
        server.stop()
