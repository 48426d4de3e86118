"""Trial EG: a client with too little memory for an answer dropped its connection with a traceback, reconnected, and
sent the read again, for ever (the server ran the query each time)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ..helpers import ServerProcess

CLIENT = textwrap.dedent(
    """
    import asyncio, resource, sys
    import tinystore

    async def main():
        store = await tinystore.open(sys.argv[1], reconnect_timeout="5s")
        db = await store.database("app")
        print("small", await db.scalar("select 1"), flush=True)
        # what it has mapped now, and 40 MB more: less than the answer's 60 MB
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 40_000_000, resource.RLIM_INFINITY))
        try:
            rows = await db.all(
                "with recursive c(x) as (select 1 union all select x + 1 from c where x < 60) "
                "select x, randomblob(1000000) as b from c"
            )
            print("rows", len(rows))
        except tinystore.TinystoreError as exc:
            print(type(exc).__name__, exc)
        print("after", await db.scalar("select 2"), flush=True)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        await store.close()

    asyncio.run(main())
    """
)


async def run_client(script: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by a Python of its own, with the store's directory as its argument (a minute at most)."""
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script, str(directory)], capture_output=True, text=True, timeout=60
    )


# contract: STORE-06
async def test_a_read_too_big_for_the_clients_memory_fails_once_sent_again(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        done = await run_client(CLIENT, directory)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "small 1" in done.stdout
        assert (
            "UnavailableError sql.query: database app: the answer could not be read: this process ran out of memory"
            in done.stdout
        )
        assert "ask for less at a time" in done.stdout
        assert "after 2" in done.stdout  # the connection goes on serving the next call
        assert "Fatal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    finally:
        server.stop()


# contract: STORE-06
async def test_the_reconnect_goes_on_when_this_process_cannot_start_a_thread(tmp_path: Path) -> None:
    """Trial EG: "can't start new thread" (short of memory) ended the SDK's reconnect loop: never reconnected."""
    import tinystore

    from ..helpers import drop_connection

    directory = tmp_path / "store"
    owner = await tinystore.open(directory, embedded=True)
    client = await tinystore.open(directory, reconnect_timeout="10s")
    try:
        db = await client.database("app")
        assert await db.scalar("select 1") == 1
        transport: Any = client.transport
        real = transport._connect_once
        failures = [RuntimeError("can't start new thread"), MemoryError()]

        async def short_of_memory() -> Any:
            if failures:
                raise failures.pop(0)
            return await real()

        transport._connect_once = short_of_memory
        drop_connection(client)
        assert await db.scalar("select 2") == 2
        assert failures == []
    finally:
        await client.close()
        await owner.close()


WRITER = textwrap.dedent(
    """
    import asyncio, resource, sys
    import tinystore

    async def main():
        store = await tinystore.open(sys.argv[1], reconnect_timeout="5s")
        db = await store.database("app")
        await db.exec("create table if not exists t (b)")
        blob = b"x" * 12_000_000
        for room in (1_000_000, 10_000_000, 20_000_000, 25_000_000):
            with open("/proc/self/status") as f:
                mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
            resource.setrlimit(resource.RLIMIT_AS, (mapped + room, resource.RLIM_INFINITY))
            try:
                await db.exec("insert into t values (?)", blob)
                print("sent", flush=True)
            except MemoryError:
                print("MemoryError", flush=True)
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("after", await db.scalar("select 2"), flush=True)
        await store.close()

    asyncio.run(main())
    """
)


async def test_a_write_too_big_for_the_clients_memory_raises_memory_error(tmp_path: Path) -> None:
    """Trial EG: msgspec's encode to bytes crashed the client (SIGSEGV) sending 12 MB with too little memory; and a
    MemoryError making the frame left its call pending ("Future exception was never retrieved" at the close)."""
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        done = await run_client(WRITER, directory)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "MemoryError" in done.stdout and "after 2" in done.stdout, done.stdout
        assert "never retrieved" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    finally:
        server.stop()


BESIDE = textwrap.dedent(
    """
    import asyncio, resource, sys
    import tinystore

    BIG = (
        "with recursive c(x) as (select 1 union all select x + 1 from c where x < 60) "
        "select x, randomblob(1000000) as b from c"
    )
    SMALL = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 2000000) select count(*) from c"

    async def main():
        store = await tinystore.open(sys.argv[1], reconnect_timeout="5s")
        db = await store.database("app")
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 40_000_000, resource.RLIM_INFINITY))

        async def run(name, coro):
            try:
                return name, await coro
            except tinystore.TinystoreError as exc:
                return name, f"{type(exc).__name__}: {exc}"

        async def later(coro):
            await asyncio.sleep(0.05)
            return await coro

        for name, got in await asyncio.gather(run("big", db.all(BIG)), run("small", later(db.scalar(SMALL)))):
            print(name, got, flush=True)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        await store.close()

    asyncio.run(main())
    """
)


async def test_a_read_beside_one_too_big_for_memory_is_answered(tmp_path: Path) -> None:
    """Trial EH: every read pending on the connection when one answer was too big for this process's memory failed
    with that one ("ask for less at a time"), a small read beside it too."""
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        done = await run_client(BESIDE, directory)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "big UnavailableError: sql.query: database app: the answer could not be read" in done.stdout, done.stdout
        assert "small 2000000" in done.stdout, done.stdout
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
    finally:
        server.stop()


# contract: STORE-04
@pytest.mark.parametrize("room_mb", [8, 30])
async def test_a_request_too_big_for_the_servers_memory_is_refused_not_sent_again(tmp_path: Path, room_mb: int) -> None:
    """Trial EH: a server short of memory taking a 15 MB request off the wire dropped the connection with a
    traceback, and its client sent the read again, for ever (a thousand tracebacks a minute)."""
    import os
    import resource

    import tinystore

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    client = await tinystore.open(directory, reconnect_timeout="3s")
    try:
        db = await client.database("app", migrations=[("001.sql", "create table b (x);")])
        assert server.proc is not None
        with open(f"/proc/{server.proc.pid}/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        # (8 MB: no room for its bytes as they come, trial EJ; 30 MB: no room to take the whole frame out of them)
        limit = mapped + room_mb * 1_000_000
        resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (limit, limit))
        for call in (
            db.scalar("select length(?)", os.urandom(15_000_000)),
            db.exec("insert into b values (?)", os.urandom(15_000_000)),
        ):
            with pytest.raises(tinystore.UnavailableError, match="the request could not be read, and was not run"):
                await asyncio.wait_for(call, 20)
        assert await db.scalar("select count(*) from b") == 0
        assert server.proc.poll() is None
    finally:
        await client.close()
        server.stop()
    log = (directory / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]


IN_TX = textwrap.dedent(
    """
    import asyncio, resource, sys
    import tinystore

    async def main():
        store = await tinystore.open(sys.argv[1], reconnect_timeout="5s")
        db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key, b blob);")])
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 60 * 2**20, resource.RLIM_INFINITY))

        async def fn(tx):
            try:
                done = await tx.exec(
                    "insert into t (b) values (randomblob(case when (select count(*) from t) = 0 then 40000000 "
                    "else 10 end)) returning id, b"
                )
                print("answered", [(r[0], len(r[1])) for r in done.rows], flush=True)
            except tinystore.TinystoreError as exc:
                print(type(exc).__name__, exc, flush=True)

        await db.tx(fn)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("rows", await db.scalar("select count(*) from t"), flush=True)
        await store.close()

    asyncio.run(main())
    """
)


async def test_a_statement_in_a_transaction_whose_answer_does_not_fit_is_not_sent_again(tmp_path: Path) -> None:
    """Trial EJ: a transaction's statement whose answer this process had no memory for was sent again in the same
    transaction (taken for a read): it ran twice, and both committed, once with no error at all."""
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        done = await run_client(IN_TX, directory)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "rows 1" in done.stdout, done.stdout
        assert (
            "OutcomeUnknownError sql.exec: database app: transaction 1: its answer came, but this process ran out of "
            "memory" in done.stdout
        )
    finally:
        server.stop()


# contract: STORE-06
async def test_calls_written_behind_a_request_too_big_for_the_server_are_sent_again(tmp_path: Path) -> None:
    """Trial EK: the calls written behind a request the server had no memory to take in were blamed for it: small
    reads failed after two such drops, a lease's release failed at once (a false LostError, the key held by nobody
    for its ttl), a waiting hold failed with most of its wait left."""
    import collections
    import os
    import resource

    import tinystore

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    a = await tinystore.open(directory, reconnect_timeout="5s")
    b = await tinystore.open(directory, reconnect_timeout="5s")
    try:
        db = await a.database("app")
        assert await db.scalar("select 1") == 1
        assert server.proc is not None
        with open(f"/proc/{server.proc.pid}/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (mapped + 8_000_000, resource.RLIM_INFINITY))
        big = os.urandom(15_000_000)

        async def big_one() -> str:
            try:
                await db.scalar("select length(?)", big)
                return "big ok"
            except tinystore.UnavailableError as exc:
                assert "the server is out of memory" in str(exc)
                return "big refused"

        async def small() -> str:
            return "ok" if await db.scalar("select 1") == 1 else "wrong"

        tasks: list[asyncio.Future[str]] = []
        for _ in range(3):
            tasks.append(asyncio.ensure_future(big_one()))
            await asyncio.sleep(0)
            tasks += [asyncio.ensure_future(small()) for _ in range(50)]
        outcomes = collections.Counter(await asyncio.gather(*tasks))
        assert outcomes["ok"] == 150, outcomes
        # a lease let go with a big request written just before its release
        lock = a.lock("l", ttl="20s")
        async with lock.hold("k"):
            pending = asyncio.ensure_future(big_one())
            await asyncio.sleep(0)
        await pending
        async with asyncio.timeout(5):  # (not the lease's 20 s)
            async with b.lock("l", ttl="20s").hold("k", wait="10s"):
                pass
    finally:
        await a.close()
        await b.close()
        server.stop()
