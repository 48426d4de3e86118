"""Trial EG: a client with too little memory for an answer dropped its connection with a traceback, reconnected, and
sent the read again, for ever (the server ran the query each time)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


# contract: STORE-06
async def test_a_read_too_big_for_the_clients_memory_fails_once_sent_again(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", CLIENT, str(directory)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "small 1" in done.stdout
        assert "UnavailableError sql.query: the answer could not be read: this process ran out of memory" in done.stdout
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
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", WRITER, str(directory)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "MemoryError" in done.stdout and "after 2" in done.stdout, done.stdout
        assert "never retrieved" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    finally:
        server.stop()
