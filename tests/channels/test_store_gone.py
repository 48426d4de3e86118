"""Trial CX: a subscription whose store will not come back (its directory removed, or the client's token refused at
the reconnect) waited, deaf, for ever: no ``on_error``, ``active`` still True, an ``each()`` loop that never ended,
and SSE streams that sent keep-alives for ever. Each now ends, told why."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess, open_store, write_tokens
from ..sse.app import make_app
from ..sse.harness import client, open_sse, serve


async def _listen(store: tinystore.Store) -> tuple[list[Exception], Any, Any, asyncio.Task[BaseException | None]]:
    errors: list[Exception] = []
    told = await store.channel("c").subscribe(lambda m: None, on_error=errors.append)
    quiet = await store.channel("c").subscribe(lambda m: None)
    it = store.channel("c").each()
    await it.__aenter__()

    async def loop() -> BaseException | None:
        try:
            async for _ in it:
                pass
        except tinystore.TinystoreError as exc:
            return exc
        return None

    return errors, told, quiet, asyncio.ensure_future(loop())


# contract: CHAN-04
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_subscriptions_end_told_why_when_the_stores_directory_is_gone(tmp_path: Path, mode: str) -> None:
    directory = tmp_path / "s"
    async with open_store(mode, directory) as store:
        errors, told, quiet, looping = await _listen(store)
        shutil.rmtree(directory)
        raised = await asyncio.wait_for(looping, 20)
        assert isinstance(raised, tinystore.UnavailableError) and "is gone" in raised.message, raised
        await asyncio.sleep(0.1)
        assert [type(e) for e in errors] == [tinystore.UnavailableError], errors
        assert not told.active and not quiet.active
        with pytest.raises(tinystore.UnavailableError):
            await store.channel("c").subscribe(lambda m: None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# contract: CHAN-04
async def test_subscriptions_end_told_why_when_the_token_is_refused_at_the_reconnect(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    tokens, admin, data = write_tokens(tmp_path)
    listen = f"tcp://127.0.0.1:{_free_port()}"
    server = ServerProcess(directory, "--listen", listen, "--tokens", str(tokens)).start()
    store = await tinystore.connect(listen, token=data, reconnect_timeout=30)
    try:
        errors, told, quiet, looping = await _listen(store)
        tokens.write_text(f"admin {admin}\n")  # the data token revoked, then the server restarted
        server.stop()
        server = ServerProcess(directory, "--listen", listen, "--tokens", str(tokens)).start()
        raised = await asyncio.wait_for(looping, 20)
        assert isinstance(raised, tinystore.UnauthenticatedError), raised
        await asyncio.sleep(0.1)
        assert [type(e) for e in errors] == [tinystore.UnauthenticatedError], errors
        assert not told.active and not quiet.active
    finally:
        await store.close()
        server.stop()


async def test_event_streams_end_when_the_stores_directory_is_gone(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with open_store("sidecar", directory) as store, serve(make_app(store)) as base, client() as http:
        async with open_sse(http, f"{base}/events/1?keepalive=0.2s") as sse:
            await asyncio.sleep(0.3)
            shutil.rmtree(directory)
            assert await sse.ended(20), "the stream went on (keep-alives) after the store was gone"
