"""STORE-05: SIGTERM or `tinystore stop DIR` stops a server gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.errors import TinystoreError, UnavailableError
from tinystore.server import paths

from ..helpers import ServerProcess, write_tokens

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]
STOP_BOUND = 5.0  # seconds from the request to stop to the process being gone
SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 400000) select count(*) from c"


# contract: STORE-05
@pytest.mark.parametrize("how", ["sigterm", "cli"])
async def test_graceful_stop(tmp_path: Path, how: str) -> None:
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    sock = paths.socket_path(d)
    store = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=1.0)
    in_tx = asyncio.Event()
    release = asyncio.Event()
    try:
        db = await store.database("app", migrations=MIGRATIONS)
        for i in range(50):
            await db.exec("insert into t (a) values (?)", f"committed {i}")

        async def stalled(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values ('never committed')")
            in_tx.set()
            await release.wait()

        tx_task = asyncio.ensure_future(db.tx(stalled))
        await asyncio.wait_for(in_tx.wait(), 5)
        # a read under way when the stop comes: it finishes (or fails cleanly), it is not left hanging
        slow = asyncio.ensure_future(db.scalar(SLOW))
        await asyncio.sleep(0.05)

        t = time.monotonic()
        cli_run = None
        if how == "sigterm":
            server.proc.send_signal(signal.SIGTERM)
        else:
            # the CLI waits for the server to be gone; reap it meanwhile (as its real parent would), or it
            # would linger as a zombie that `kill -0` still finds
            cli_run = asyncio.ensure_future(
                asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "tinystore", "stop", str(d), "--grace", "2"],
                    capture_output=True,
                    timeout=30,
                )
            )
        code = await asyncio.to_thread(server.proc.wait, 20)
        took = time.monotonic() - t
        assert code == 0, (d / "serve.log").read_text()[-2000:]
        assert took < STOP_BOUND, took
        if cli_run is not None:
            cli = await cli_run
            assert cli.returncode == 0, cli.stderr.decode()
            assert time.monotonic() - t < STOP_BOUND + 1

        # the read under way was let finish: its answer came back
        assert await asyncio.wait_for(slow, 5) == 400000
        # the stalled transaction was rolled back: its commit cannot succeed
        release.set()
        with pytest.raises(TinystoreError):
            await asyncio.wait_for(tx_task, 10)

        # the socket and the address file are gone
        assert not sock.exists()
        assert paths.read_address(d) is None
        # the WAL was checkpointed into the database (empty or gone)
        wal = d / "sql" / "app.db-wal"
        assert not wal.exists() or wal.stat().st_size == 0
        # the lock was let go: a new owner opens at once; committed rows are there, the stalled one is not
        t = time.monotonic()
        owner = await tinystore.open(d, embedded=True, serve=False)
        assert time.monotonic() - t < 2
        try:
            db2 = await owner.database("app")
            assert await db2.scalar("select count(*) from t where a like 'committed %'") == 50
            assert await db2.scalar("select count(*) from t where a = 'never committed'") == 0
            assert await db2.scalar("pragma integrity_check") == "ok"
        finally:
            await owner.close()
    finally:
        release.set()
        await store.close()
        server.stop()


# contract: STORE-05
async def test_calls_arriving_while_stopping_are_not_run(tmp_path: Path) -> None:
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    busy = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=1.0)
    late = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=1.0)
    try:
        db_busy = await busy.database("app", migrations=MIGRATIONS)
        db_late = await late.database("app")
        # a long read keeps the server draining for a while after SIGTERM
        slow = asyncio.ensure_future(db_busy.scalar(SLOW.replace("400000", "2000000")))
        await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        # a new call now is not run: the SDK is told so and, the server being gone for good, gives up
        with pytest.raises(UnavailableError):
            await db_late.exec("insert into t (a) values ('too late')")
        assert await asyncio.wait_for(slow, 10) == 2000000
        assert await asyncio.to_thread(server.proc.wait, 20) == 0
    finally:
        await busy.close()
        await late.close()
        server.stop()
    owner = await tinystore.open(d, embedded=True, serve=False)
    try:
        db = await owner.database("app")
        assert await db.scalar("select count(*) from t") == 0
    finally:
        await owner.close()


# contract: STORE-05
async def test_no_new_calls_once_stopping(tmp_path: Path) -> None:
    """A client connected over the socket sees the stop; new connections are refused once it is gone."""
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    assert server.proc is not None
    try:
        store = await tinystore.open(d, private=False, idle="1s")
        # the directory's server is the ServerProcess: open() found it instead of starting one
        assert (await store.status())["pid"] == server.proc.pid
        db = await store.database("app", migrations=MIGRATIONS)
        await db.exec("insert into t (a) values ('x')")
        await store.close()
        server.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.proc.wait, 20) == 0
        # nobody listens any more: a raw connect to the old socket fails
        with pytest.raises(OSError):
            await asyncio.open_unix_connection(str(paths.socket_path(d)))
    finally:
        server.stop()
    # `tinystore stop` on a directory nobody serves says so and fails
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "tinystore", "stop", str(d)], capture_output=True, timeout=30
    )
    assert cli.returncode == 1
    assert b"unavailable" in cli.stderr


# contract: STORE-05
async def test_sigint_is_a_graceful_stop_too(tmp_path: Path) -> None:
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    assert server.proc is not None
    try:
        server.proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(server.proc.wait, 20) == 0
        assert paths.read_address(d) is None
        with contextlib.suppress(FileNotFoundError):
            assert os.path.getsize(d / "LOCK") >= 0
        owner = await tinystore.open(d, embedded=True, serve=False)
        await owner.close()
    finally:
        server.stop()


# contract: STORE-05
@pytest.mark.parametrize("how", ["stop_server", "cli", "sigterm"])
async def test_a_private_server_stopped_on_purpose_stays_stopped(tmp_path: Path, how: str) -> None:
    # from trial AN: the store's next call started it again (its locks and subscriptions gone without a word)
    directory = tmp_path / "s"
    store = await tinystore.open(directory, private=True)
    try:
        db = await store.database("app")
        await db.exec("create table t (x)")
        pid = (await store.status())["pid"]
        if how == "stop_server":
            await store.stop_server()
        elif how == "cli":
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "tinystore", "stop", str(directory)], capture_output=True
            )
            assert done.returncode == 0, done.stderr
        else:
            os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            if paths.read_address(directory) is None:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # (a restart, were there one, would be under way)
        with pytest.raises(UnavailableError, match="its private server was stopped"):
            await db.exec("insert into t values (1)")
        with pytest.raises(UnavailableError, match="its private server was stopped"):
            await store.status()
        assert paths.read_address(directory) is None  # nobody serves the directory
    finally:
        await store.close()
    async with await tinystore.open(directory, private=True) as again:  # opened again: a new server
        assert await (await again.database("app")).scalar("select count(*) from t") == 0


# contract: STORE-05
async def test_calls_that_had_not_begun_at_a_stop_are_refused_not_dropped(tmp_path: Path) -> None:
    # from trial BA: an exec with rows kept aside while a transaction of its connection held its database's writer
    # was dropped unanswered at a graceful stop (its transaction rolled back by the stop, the exec never run): the
    # client had to take it as a write that may have committed (OutcomeUnknownError). One in three stops.
    for attempt in range(5):
        await stop_with_an_exec_kept_aside(tmp_path, tmp_path / f"store{attempt}")


async def stop_with_an_exec_kept_aside(tmp_path: Path, d: Path) -> None:
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    store = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=0.5)
    try:
        db = await store.database("app", migrations=MIGRATIONS)
        begun = asyncio.Event()

        async def body(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values ('tx')")
            begun.set()
            await asyncio.sleep(1)  # the stop comes meanwhile

        tx = asyncio.ensure_future(db.tx(body))
        await begun.wait()
        kept = asyncio.ensure_future(db.exec("insert into t (a) values ('kept aside') returning id"))
        await asyncio.sleep(0.1)
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(TinystoreError):
            await asyncio.wait_for(tx, 10)
        try:  # run (the rollback let it begin before the stop closed the connection), or refused as not run
            await asyncio.wait_for(kept, 10)
            expected = 1
        except UnavailableError as exc:
            assert not isinstance(exc, tinystore.OutcomeUnknownError), exc  # (sent again, and nobody serves)
            expected = 0
        assert await asyncio.to_thread(server.proc.wait, 20) == 0
    finally:
        await store.close()
        server.stop()
    owner = await tinystore.open(d, embedded=True, serve=False)
    try:
        assert await (await owner.database("app")).scalar("select count(*) from t") == expected
    finally:
        await owner.close()


# contract: STORE-05
async def test_a_commit_waiting_behind_its_transactions_reads_at_a_stop_is_answered_as_rolled_back(
    tmp_path: Path,
) -> None:
    # from trial BD: a transaction's commit waited in its connection's line behind the transaction's slow reads;
    # the stop rolled the transaction back, the line did not drain within the grace, and the commit was dropped at
    # the close: OutcomeUnknownError ("may or may not have taken effect") for a transaction that was rolled back
    d = tmp_path / "store"
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    store = await tinystore.connect(server.tcp, token=admin, reconnect_timeout=0.5)
    try:
        db = await store.database("app", migrations=MIGRATIONS)
        reads: list[asyncio.Future[Any]] = []

        async def body(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (a) values ('tx')")
            for _ in range(10):  # sent, not awaited: the commit waits behind them
                reads.append(asyncio.ensure_future(tx.all(SLOW.replace("400000", "3000000"))))
            await asyncio.sleep(0.1)

        tx = asyncio.ensure_future(db.tx(body))
        await asyncio.sleep(0.3)
        admin_store = await tinystore.connect(server.tcp, token=admin)
        await admin_store.stop_server(grace=1)
        await admin_store.close()
        with pytest.raises(TinystoreError) as caught:
            await asyncio.wait_for(tx, 20)
        assert not isinstance(caught.value, tinystore.OutcomeUnknownError), caught.value
        assert "rolled back" in str(caught.value), caught.value
        await asyncio.gather(*reads, return_exceptions=True)
        assert await asyncio.to_thread(server.proc.wait, 20) == 0
    finally:
        await store.close()
        server.stop()
    owner = await tinystore.open(d, embedded=True, serve=False)
    try:
        assert await (await owner.database("app")).scalar("select count(*) from t") == 0
    finally:
        await owner.close()


# contract: STORE-05
async def test_a_sidecar_logs_how_it_stopped(tmp_path: Path) -> None:
    # from trial BG: docs/serving.md says sidecar.log tells how each sidecar stopped; a stop asked for left no line
    d = tmp_path / "store"
    store = await tinystore.open(d, idle="5s")
    try:
        await (await store.database("app")).exec("create table t (a)")
    finally:
        await store.close()
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "tinystore", "stop", str(d)], capture_output=True, timeout=30
    )
    assert cli.returncode == 0, cli.stderr
    log = (d / "server" / "sidecar.log").read_text()
    assert "asked to stop" in log and log.rstrip().endswith("stopped"), log
