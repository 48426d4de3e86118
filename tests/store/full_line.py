"""A client's transaction whose connection's execs' line is full of execs waiting for that very transaction: the
set-up of the tests of the way past the line (``server.listener``: ``may_bypass``, ``bypass_behind_head``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import tinystore
from tinystore.server.listener import EXECS_MAX

T = TypeVar("T")


async def behind_full_line(
    owner_app: tinystore.Database,
    client_app: tinystore.Database,
    fn: Callable[[tinystore.SqlTx], Awaitable[T]],
) -> tuple[asyncio.Future[T], list[asyncio.Future[Any]]]:
    """``client_app.tx(fn)`` started while the owner's own transaction holds app's writer, and ``EXECS_MAX + 8``
    execs with rows on app sent by the same client meanwhile (they fill its connection's execs' line, each
    waiting for app's writer, which the transaction takes first). Returns once the owner's transaction ended:
    the transaction's future and the execs' futures. Both databases need a table ``t (id, a)``."""
    app_held, app_release = asyncio.Event(), asyncio.Event()

    async def hold_app(tx: tinystore.SqlTx) -> None:  # app's writer, so that our transaction's begin waits
        await tx.exec("insert into t (a) values (0)")
        app_held.set()
        await app_release.wait()

    app_holder = asyncio.ensure_future(owner_app.tx(hold_app))
    try:
        await app_held.wait()
        ours = asyncio.ensure_future(client_app.tx(fn))
        await asyncio.sleep(0.2)  # our begin waits for app's writer; these are sent meanwhile and fill the line
        returning: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(client_app.exec("insert into t (a) values (?) returning id", 100 + i))
            for i in range(EXECS_MAX + 8)
        ]
        await asyncio.sleep(0.2)
    finally:
        app_release.set()
    await app_holder
    return ours, returning


async def hold_busy(db: tinystore.Database, held: asyncio.Event, release: asyncio.Event, pause: float = 0.1) -> None:
    """A transaction on ``db`` (a table ``t (id, a)``) that holds its writer, calling all along (never idle),
    until ``release``; ``held`` is set once it began."""

    async def body(tx: tinystore.SqlTx) -> None:
        held.set()
        while not release.is_set():
            await tx.exec("insert into t (a) values (0)")
            await asyncio.sleep(pause)

    await db.tx(body)
