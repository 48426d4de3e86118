"""A graceful stop closes each connection with a GOAWAY that says the last request the server read on it (as
HTTP/2's GOAWAY does, RFC 9113 section 6.8): the requests the client sent after it were never read, so never run,
and the SDK sends them again to the next server. From trial BK: requests still unread in the socket at the stop
(the server had stopped reading the connection) were writes that may have committed, for their client
(``OutcomeUnknownError``), though none had run; a transaction's call among them said only "the connection
dropped"."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.errors import TinystoreError
from tinystore.protocol import frames
from tinystore.protocol.messages import GoAway, Hello, decode, encode
from tinystore.protocol.sql import Exec
from tinystore.server import paths

from ..helpers import ServerProcess, free_port, write_tokens

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


def _hello(sock: socket.socket, token: str = "") -> frames.Connection:
    """The handshake, by hand, on a blocking connection to a server: the frames' state of the connection."""
    conn = frames.Connection("client")
    sock.sendall(conn.send_hello(encode(Hello(version=frames.PROTOCOL_VERSION, token=token, client="raw", pid=0))))
    while not isinstance(ev := conn.next_event(), frames.Frame):
        conn.receive_data(sock.recv(65536))
    assert ev.kind is frames.Kind.WELCOME
    return conn


def _unix_hello(directory: Path) -> tuple[socket.socket, frames.Connection]:
    """A blocking raw connection to ``directory``'s server, past its handshake."""
    info = paths.read_address(directory) or {}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(info["socket"]))
    return sock, _hello(sock)


def _goaways_after_a_request(sock: socket.socket, conn: frames.Connection, settle: float = 0.0) -> list[GoAway]:
    """Send request 7 (a write) on a connection whose server stops, wait ``settle`` seconds, then read until its
    GOAWAY (or the end)."""
    sock.sendall(conn.send_request(7, "sql.exec", encode(Exec(db="app", sql="create table t (a)", params=[]))))
    time.sleep(settle)
    got: list[frames.Frame] = []
    with contextlib.suppress(OSError):  # (ssl.SSLError too)
        while not any(f.kind is frames.Kind.GOAWAY for f in got) and (data := sock.recv(65536)):
            conn.receive_data(data)
            while isinstance(ev := conn.next_event(), frames.Frame):
                got.append(ev)
    return [decode(f.body, GoAway) for f in got if f.kind is frames.Kind.GOAWAY]


# contract: STORE-05
def test_at_a_stop_the_server_reads_on_after_its_goaway_until_the_client_closes(tmp_path: Path) -> None:
    # from trial BS: the server closed each connection right after its GOAWAY; a request the client wrote before
    # reading the GOAWAY failed (EPIPE), and its SDK, told nothing, took it for a write that may have committed.
    # Now the close lingers (server.listener.LINGER): the write goes through (dropped, never run), the GOAWAY
    # says which requests were read, then the connection ends
    d = tmp_path / "s"
    server = ServerProcess(d).start()
    try:
        sock, conn = _unix_hello(d)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert sock.recv(1, socket.MSG_PEEK)  # the GOAWAY waits in our socket, unread
        time.sleep(0.2)
        goaway = _goaways_after_a_request(sock, conn)
        assert len(goaway) == 1 and goaway[0].last_stream == 0  # request 7 was never read: the SDK sends it again
        assert sock.recv(65536) == b""  # then the end
        sock.close()
        assert server.proc.wait(10) == 0
    finally:
        server.stop()


# contract: STORE-05
# contract: STORE-06
def test_a_write_sent_while_the_clients_loop_was_busy_through_a_stop_goes_to_the_next_server(tmp_path: Path) -> None:
    # from trial BS: the client's loop was busy while its server stopped; its write went out after the server had
    # closed (EPIPE), unread, and raised OutcomeUnknownError. The SDK reads what the server sent before it closed
    # (its GOAWAY) and sends the write to the next server
    d = tmp_path / "s"
    servers = [ServerProcess(d).start()]

    async def main() -> tuple[Any, int]:
        store = await tinystore.open(d, reconnect_timeout=20)
        try:
            db = await store.database("app")
            await db.exec("create table t (v int)")
            first = servers[0].proc
            assert first is not None
            first.send_signal(signal.SIGTERM)
            call = asyncio.ensure_future(db.exec("insert into t (v) values (1)"))
            await asyncio.sleep(0)  # the exec is queued; it is written at the loop's next turn
            first.wait(20)  # the loop is busy (blocked) while the server stops, lingers, and exits
            servers.append(ServerProcess(d).start())
            got = await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 30)
            return got[0], int(await db.scalar("select count(*) from t where v = 1"))
        finally:
            await store.close()

    try:
        outcome, rows = asyncio.run(main())
        assert not isinstance(outcome, BaseException), outcome
        assert rows == 1
    finally:
        for s in servers:
            s.stop()


# contract: STORE-05
def test_at_a_stop_a_tls_connection_is_read_on_after_its_goaway_too(tmp_path: Path) -> None:
    # TLS has no half-close: the server closed at once, and over TCP a request that came after its GOAWAY made that
    # close a reset, which can take the unread GOAWAY with it (trial BW). It keeps the connection open and reads on
    # (dropping) until the client closes, as over a Unix socket
    import ssl

    from .test_store03_auth import make_cert

    cert, key = make_cert(tmp_path)
    tokens, admin, _ = write_tokens(tmp_path)
    port = free_port()
    d = tmp_path / "s"
    args = ["--listen", f"tls://127.0.0.1:{port}", "--tokens", str(tokens)]
    args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    server = ServerProcess(d, *args).start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
        conn = _hello(sock, admin)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the GOAWAY is sent meanwhile, and (before) the connection closed
        goaway = _goaways_after_a_request(sock, conn, settle=0.3)  # (a reset, had the server closed, comes back)
        assert len(goaway) == 1 and goaway[0].last_stream == 0
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):  # still open: the server waits for us to close it
            sock.recv(65536)
        sock.close()
        assert server.proc.wait(10) == 0
    finally:
        server.stop()


# contract: STORE-05
# contract: STORE-06
def test_a_write_whose_goaway_was_lost_behind_answers_is_sent_to_the_next_server(tmp_path: Path) -> None:
    # from trial BW: with 32 MiB of answers on their way, the client's loop blocked through its server's stop:
    # the GOAWAY, queued behind the answers, went with the lingering close's abort, and the write the server never
    # read raised OutcomeUnknownError. The stopping server writes down the last request it read of each client;
    # the next server tells the client in its WELCOME, and the write is sent to it
    d = tmp_path / "s"
    servers = [ServerProcess(d).start()]

    async def main() -> tuple[Any, int]:
        store = await tinystore.open(d, reconnect_timeout=20)
        try:
            db = await store.database("app")
            await db.exec("create table t (v int)")
            await db.exec("create table big (b blob)")
            await db.exec("insert into big (b) values (zeroblob(4 * 1024 * 1024))")
            reads = [asyncio.ensure_future(db.scalar("select b from big")) for _ in range(8)]
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            call = asyncio.ensure_future(db.exec("insert into t (v) values (1)"))
            await asyncio.sleep(0)  # queued: written at the loop's next turn
            time.sleep(1.0)  # noqa: ASYNC251 (the loop is blocked: the server answers the reads into a full socket)
            first = servers[0].proc
            assert first is not None
            first.send_signal(signal.SIGTERM)
            first.wait(20)  # it stops, lingers, and exits
            servers.append(ServerProcess(d).start())
            got = await asyncio.wait_for(asyncio.gather(call, *reads, return_exceptions=True), 30)
            return got[0], int(await db.scalar("select count(*) from t where v = 1"))
        finally:
            await store.close()

    try:
        outcome, rows = asyncio.run(main())
        assert not isinstance(outcome, BaseException), outcome
        assert rows == 1
    finally:
        for s in servers:
            s.stop()


# contract: STORE-06
async def test_a_write_unread_by_a_server_whose_connection_was_cut_is_sent_again(tmp_path: Path) -> None:
    # a connection cut by the network (here: the client drops it while the server reads none of it, so the server
    # does not see it end): its writes were OutcomeUnknownError though the server never read them. The client's
    # next connection ends that one at the server (supersede), which says in its WELCOME the last request it read
    d = tmp_path / "s"
    owner, client = await _owner_and_client(d)
    try:
        db = await client.database("app")
        await db.exec("insert into t values (0)")
        server_conn = _server_side(owner)
        server_conn.transport.pause_reading()  # nothing more is read of it (nor its end)
        write = asyncio.ensure_future(db.exec("insert into t values (1)"))
        await asyncio.sleep(0.3)
        assert not write.done()
        conn = client.transport._conn  # type: ignore[attr-defined]
        conn.transport.abort()  # the client's side of the cut
        await asyncio.wait_for(write, 20)
        assert await db.scalar("select count(*) from t where k = 1") == 1
    finally:
        await client.close()
        await owner.close()


# contract: STORE-06
async def test_a_write_unread_by_a_server_that_saw_the_cut_is_sent_again(tmp_path: Path) -> None:
    # trial DZ: a proxy that cut both sides (the server saw its connection end before the client came back): the
    # server noted nothing of what it had read, and the write it never read was OutcomeUnknownError at once
    d = tmp_path / "s"
    owner, client = await _owner_and_client(d)
    try:
        db = await client.database("app")
        await db.exec("insert into t values (0)")
        server_conn = _server_side(owner)
        server_conn.transport.pause_reading()  # nothing more is read of it
        write = asyncio.ensure_future(db.exec("insert into t values (1)"))
        await asyncio.sleep(0.3)
        assert not write.done()
        first = client.transport._conn  # type: ignore[attr-defined]
        server_conn.transport.abort()  # the server's side of the cut, seen at once
        await asyncio.sleep(0.05)
        if first.transport is not None:  # and the client's, unless it saw the cut already (not its next one)
            first.transport.abort()
        await asyncio.wait_for(write, 20)
        assert await db.scalar("select count(*) from t where k = 1") == 1
    finally:
        await client.close()
        await owner.close()


# contract: STORE-06
async def test_a_write_read_before_its_connection_was_cut_is_not_sent_again(tmp_path: Path) -> None:
    # the other side of the test above (trial BX: after two cuts, a fact about the second connection cleared a write
    # of the first, which the server had read and committed: applied twice). A fact names its connection: the
    # write the server read raises OutcomeUnknownError, and its row is there once
    d = tmp_path / "s"
    owner, client = await _owner_and_client(d)
    try:
        db = await client.database("app")
        await db.exec("insert into t values (0)")
        conn = client.transport._conn  # type: ignore[attr-defined]
        conn.transport.pause_reading()  # its answer stays unread
        write = asyncio.ensure_future(db.exec("insert into t values (1)"))
        odb = await owner.database("app")
        for _ in range(200):
            if await odb.scalar("select count(*) from t where k = 1"):
                break
            await asyncio.sleep(0.01)
        _server_side(owner).transport.pause_reading()  # the server does not see the cut
        conn.transport.abort()
        with pytest.raises(tinystore.OutcomeUnknownError):
            await asyncio.wait_for(write, 20)
        assert await db.scalar("select count(*) from t where k = 1") == 1
    finally:
        await client.close()
        await owner.close()


# contract: STORE-05
async def test_what_a_server_read_is_kept_for_the_servers_after_the_next_one(tmp_path: Path) -> None:
    # trial BX: the next server took the record away as it started; killed before the client came back, the one
    # after it knew nothing, and the unread write raised OutcomeUnknownError. The record stays, the newest facts
    from tinystore.server import paths as server_paths

    d = tmp_path / "s"
    a = await tinystore.open(d, embedded=True)
    a._core.read_fact("client-x", 3, 41)
    await a.close()
    b = await tinystore.open(d, embedded=True)
    try:
        assert b._core.read_facts["client-x"] == [(a.epoch, 3, 41)]
        assert server_paths.read_last_read(d) == {"client-x": [(a.epoch, 3, 41)]}  # kept on disk while b runs
    finally:
        await b.close()
    assert server_paths.read_last_read(d) == {"client-x": [(a.epoch, 3, 41)]}
