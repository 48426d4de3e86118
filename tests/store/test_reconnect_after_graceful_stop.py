"""After a server said it was stopping, the SDK tries to reach the next one every quarter second at most, for a
minute (trial JH, session of 2026-12-07, eighth): with the backoff's longer waits it reached a server restarted
gracefully up to 2 s after that server was up, and a worker's 3 s lease, counted from the stop's last word, was
given up before the worker could renew it there."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import tinystore
from tinystore.client.transport import reconnect_delay

from ..helpers import ServerProcess, free_port, write_tokens


# contract: STORE-06
def test_the_reconnect_delay_is_short_for_a_minute_after_a_graceful_stop() -> None:
    for attempt in range(30):
        delay = reconnect_delay(attempt, 100.0, 159.0)
        assert delay <= 0.25 and (attempt < 3 or delay >= 0.125), (attempt, delay)
    # otherwise, and a minute after it: the backoff (50 ms doubling to 2 s, times uniform(0.5, 1))
    for stopped_at in (None, 100.0):
        assert 0.025 <= reconnect_delay(0, stopped_at, 161.0) <= 0.05
        assert 1.0 <= reconnect_delay(10, stopped_at, 161.0) <= 2.0


# contract: STORE-06
async def test_the_sdk_reaches_a_server_restarted_after_a_graceful_stop_soon_after_it_is_up(tmp_path: Path) -> None:
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    address = f"tcp://127.0.0.1:{free_port()}"
    servers = [await asyncio.to_thread(ServerProcess(d, "--listen", address, "--tokens", str(tokens)).start)]
    try:
        store = await tinystore.connect(address, token=admin)
        try:
            db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
            transport = store.transport
            tries: list[float] = []
            connect_once = transport._connect_once  # type: ignore[attr-defined]

            async def counted() -> object:
                tries.append(time.monotonic())
                return await connect_once()

            transport._connect_once = counted  # type: ignore[attr-defined]
            reconnects = transport.reconnects
            await asyncio.to_thread(servers[0].stop)  # SIGTERM: a graceful stop, said to the SDK
            await asyncio.sleep(3.0)  # no server: the backoff's tries would be 0.8 to 2 s apart by now
            gaps = [b - a for a, b in itertools.pairwise(tries)]
            assert len(tries) >= 10 and max(gaps) <= 0.5, gaps
            again = ServerProcess(d, "--listen", address, "--tokens", str(tokens))
            servers.append(again)
            await asyncio.to_thread(again.start)
            up = time.monotonic()
            while transport.reconnects == reconnects:
                assert time.monotonic() - up < 10, "the SDK did not reach the restarted server"
                await asyncio.sleep(0.01)
            await db.exec("insert into t values (1)")
            # a server killed outright after that reconnect: the backoff again (trial JK: still every 0.25 s)
            tries.clear()
            await asyncio.to_thread(again.kill)
            await asyncio.sleep(3.0)
            gaps = [b - a for a, b in itertools.pairwise(tries)]
            assert len(tries) <= 9 and max(gaps) >= 0.5, gaps
        finally:
            await store.close()
    finally:
        for server in servers:
            await asyncio.to_thread(server.stop)
