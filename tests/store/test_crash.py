"""SQL-02: what a server acknowledged survives a kill -9 of the server process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import tinystore
from tinystore.errors import TinystoreError

from ..helpers import ServerProcess, write_tokens

N = 300
WORKERS = 12
MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, k text unique, via text);")]


# contract: SQL-02
async def test_acknowledged_commits_survive_kill_9(tmp_path: Path) -> None:
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    pid = server.proc.pid
    acked: list[str] = []
    killed = asyncio.Event()
    try:
        store = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=1.0)
        try:
            db = await store.database("app", migrations=MIGRATIONS)

            def ack(key: str) -> None:
                acked.append(key)
                if len(acked) == N and not killed.is_set():
                    # the N-th acknowledgement: kill -9 at once, other writes still in flight
                    os.kill(pid, signal.SIGKILL)
                    killed.set()

            async def worker(w: int) -> None:
                i = 0
                while not killed.is_set():
                    key = f"{w}-{i}"
                    i += 1
                    try:
                        if i % 3 == 0:

                            async def fn(tx: tinystore.SqlTx, key: str = key) -> None:
                                await tx.exec("insert into t (k, via) values (?, 'tx')", key)
                                await tx.exec("update t set via = 'tx+' where k = ?", key)

                            await db.tx(fn)
                        else:
                            await db.exec("insert into t (k, via) values (?, 'exec')", key)
                    except TinystoreError:
                        return  # the server is gone: not acknowledged
                    ack(key)

            await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(WORKERS))), 60)
        finally:
            await store.close()
        assert await asyncio.to_thread(server.proc.wait, 10) == -signal.SIGKILL
    finally:
        server.stop()
    assert len(acked) >= N

    owner = await tinystore.open(d, embedded=True, serve=False)
    try:
        db2 = await owner.database("app")
        rows = {r["k"]: r["via"] for r in await db2.all("select k, via from t")}
        missing = [k for k in acked if k not in rows]
        assert not missing, f"{len(missing)} acknowledged commits lost: {missing[:10]}"
        # a transaction is all or nothing: never its insert without its update
        assert all(via != "tx" for via in rows.values())
        assert sum(1 for k in acked if rows[k] == "tx+") >= N // 4
        assert await db2.scalar("pragma integrity_check") == "ok"
    finally:
        await owner.close()
