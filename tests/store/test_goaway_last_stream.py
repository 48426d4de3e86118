"""A graceful stop closes each connection with a GOAWAY that says the last request the server read on it (as
HTTP/2's GOAWAY does, RFC 9113 section 6.8): the requests the client sent after it were never read, so never run,
and the SDK sends them again to the next server. From trial BK: requests still unread in the socket at the stop
(the server had stopped reading the connection) were writes that may have committed, for their client
(``OutcomeUnknownError``), though none had run; a transaction's call among them said only "the connection
dropped"."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.errors import TinystoreError

SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000000) select count(*) from c"


async def _owner_and_client(d: Path) -> tuple[tinystore.Store, tinystore.Store]:
    """An embedded owner of ``d`` with a table ``t (k)`` in database app, and a client of it over its socket."""
    owner = await tinystore.open(d, embedded=True)
    await (await owner.database("app")).exec("create table t (k int primary key)")
    return owner, await tinystore.open(d, reconnect_timeout=20)


def _server_side(owner: tinystore.Store) -> Any:
    core: Any = owner._core
    return next(c for lst in core.listeners for c in lst.connections)


# contract: STORE-05
# contract: STORE-06
async def test_writes_the_server_never_read_before_its_stop_are_sent_again_to_the_next_one(tmp_path: Path) -> None:
    d = tmp_path / "s"
    owner, client = await _owner_and_client(d)
    try:
        db = await client.database("app")
        await db.exec("insert into t values (0)")
        _server_side(owner).transport.pause_reading()  # what the client sends now stays in the socket, unread
        writes = [asyncio.ensure_future(db.exec("insert into t values (?)", i)) for i in range(1, 21)]

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (100)")

        tx_task = asyncio.ensure_future(db.tx(fn))
        await asyncio.sleep(0.3)
        assert not any(w.done() for w in writes)
        await owner.close()  # a graceful stop: none of them was read
        owner = await tinystore.open(d, embedded=True)
        got = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 30)
        assert [type(g).__name__ for g in got if isinstance(g, BaseException)] == []
        # the transaction's begin was never read either: sent again, it runs on the next server
        tx_outcome = await asyncio.wait_for(asyncio.gather(tx_task, return_exceptions=True), 30)
        assert not isinstance(tx_outcome[0], tinystore.OutcomeUnknownError), tx_outcome
        rows = await (await owner.database("app")).scalar("select count(*) from t where k between 1 and 20")
        assert rows == 20
    finally:
        await client.close()
        await owner.close()


# contract: STORE-06
async def test_a_transactions_call_lost_at_a_drop_names_its_transaction_and_says_it_was_rolled_back(
    tmp_path: Path,
) -> None:
    d = tmp_path / "s"
    owner, client = await _owner_and_client(d)
    try:
        db = await client.database("app")
        began = asyncio.Event()

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (1)")
            began.set()
            await tx.one(SLOW)  # its answer is lost with the connection

        task = asyncio.ensure_future(db.tx(fn))
        await began.wait()
        await asyncio.sleep(0.1)
        client.transport.abort()  # type: ignore[attr-defined]
        with pytest.raises(TinystoreError) as got:
            await asyncio.wait_for(task, 20)
        assert "database app: transaction" in got.value.message and "rolled back" in got.value.message, got.value
    finally:
        await client.close()
        await owner.close()
