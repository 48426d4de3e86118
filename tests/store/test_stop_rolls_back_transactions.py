"""STORE-05: a stop rolls back open transactions at once (not after tx_idle), and a transaction's calls are never
sent to another server (the trial's finding 7)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import UnavailableError

from ..helpers import ServerProcess, free_port, write_tokens

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]


# contract: STORE-05
async def test_stop_under_transactions_rolls_them_back_at_once(tmp_path: Path) -> None:
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    listen = f"tcp://127.0.0.1:{free_port()}"
    args = ("--listen", listen, "--tokens", str(tokens))
    server = ServerProcess(d, *args).start()
    assert server.proc is not None
    again: ServerProcess | None = None
    store = await tinystore.connect(listen, token=admin, reconnect_timeout=15.0)
    in_tx = asyncio.Event()
    release = asyncio.Event()
    try:
        db = await store.database("app", migrations=MIGRATIONS)

        async def holding(tx: tinystore.SqlTx) -> None:
            # holds the writer when the stop comes; its commit comes after it
            await tx.exec("insert into t (a) values ('held')")
            in_tx.set()
            await release.wait()

        async def queued(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values ('queued')")

        held = asyncio.ensure_future(db.tx(holding))
        await asyncio.wait_for(in_tx.wait(), 5)
        # begins waiting for the writer when the stop comes: not begun, they are begun again at the next server
        waiting = [asyncio.ensure_future(db.tx(queued)) for _ in range(3)]
        await asyncio.sleep(0.2)

        t = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.proc.wait, 20)
        took = time.monotonic() - t
        assert code == 0
        # the open transaction was rolled back at the stop, not left idle until tx_idle (5 s) while its begins
        # waited, one after the other (the stop took its whole 10 s grace)
        assert took < 2.0, took

        again = ServerProcess(d, *args).start()
        release.set()
        # the held transaction's commit is not sent to the new server (where its id means nothing): it fails,
        # saying the transaction was rolled back
        with pytest.raises(UnavailableError, match="rolled back") as failed:
            await asyncio.wait_for(held, 10)
        assert "is not open" not in failed.value.message
        # the begins that had not begun ran at the new server
        await asyncio.wait_for(asyncio.gather(*waiting), 15)
        assert await db.scalar("select count(*) from t where a = 'queued'") == 3
        assert await db.scalar("select count(*) from t where a = 'held'") == 0
    finally:
        release.set()
        await store.close()
        server.stop()
        if again is not None:
            again.stop()
