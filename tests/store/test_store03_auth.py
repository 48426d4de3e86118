"""STORE-03: who may connect — a 0700 socket directory, tokens on TCP, TLS that checks the server first."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.errors import InvalidError, PermissionDeniedError, UnauthenticatedError, UnavailableError
from tinystore.protocol.frames import Kind
from tinystore.protocol.messages import decode, encode
from tinystore.protocol.sql import Exec
from tinystore.protocol.store import Stop
from tinystore.server import paths

from ..helpers import ServerProcess, open_store, write_tokens
from .raw import RawClient, error_of, goaway_of

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]


def tcp_where(address: str) -> tuple[str, tuple[str, int]]:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    return "tcp", (host, int(port))


@pytest.fixture
def tcp_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    """A TCP server with tokens: (server, admin token, data token)."""
    tokens, admin, data = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        yield server, admin, data
    finally:
        server.stop()


@pytest.fixture
async def admin_store(tcp_server: tuple[ServerProcess, str, str]) -> AsyncIterator[tinystore.Store]:
    server, admin, _ = tcp_server
    store = await tinystore.connect(server.tcp, token=admin)
    try:
        db = await store.database("app", migrations=MIGRATIONS)
        await db.exec("insert into t (a) values ('kept')")
        yield store
    finally:
        await store.close()


def server_alive(server: ServerProcess) -> bool:
    return server.proc is not None and server.proc.poll() is None


# contract: STORE-03
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar", "tcp"])
async def test_socket_directory_is_the_owners_only(tmp_path: Path, mode: str) -> None:
    d = tmp_path / "store"
    async with open_store(mode, d):
        server_dir = d / "server"
        assert (server_dir.stat().st_mode & 0o777) == 0o700
        sock = paths.socket_path(d)
        assert sock.parent == server_dir
        assert (sock.stat().st_mode & 0o777) == 0o600
        assert sock.stat().st_uid == server_dir.stat().st_uid


# contract: STORE-03
async def test_tcp_refuses_no_token_and_a_wrong_token(tcp_server: tuple[ServerProcess, str, str]) -> None:
    server, admin, data = tcp_server
    for token in ("", "x" * 32, admin[:-1] + ("0" if admin[-1] != "0" else "1"), admin.upper() + "!"):
        with pytest.raises(UnauthenticatedError) as info:
            await tinystore.connect(server.tcp, token=token)
        assert info.value.code == "unauthenticated"
    for token in (admin, data):
        store = await tinystore.connect(server.tcp, token=token)
        try:
            assert (await store.status())["pid"] == server.proc.pid  # type: ignore[union-attr]
        finally:
            await store.close()
    # the server's log says so, once a minute at most, naming the client's address, never the token (trial FK: it
    # said nothing)
    text = (server.directory / "serve.log").read_text()
    assert "refused a client from 127.0.0.1:" in text and "it gave no token" in text, text
    assert "(and 3 more times" not in text and "x" * 32 not in text and admin.upper() not in text
    # a tokens file others may read, and plain text on an address other machines reach, are warned of
    server.stop()
    assert "tokens file" not in text and "plain text on an address" not in text  # (0600, 127.0.0.1)
    tokens = server.directory.parent / "tokens"
    tokens.chmod(0o644)
    wide = ServerProcess(server.directory.parent / "wide", "--listen", "tcp://0.0.0.0:0", "--tokens", str(tokens))
    wide.start()
    try:
        text = (wide.directory / "serve.log").read_text()
        assert "may be read by other users of this machine (its mode is 0o644): chmod 600 it" in text, text
        assert "listen address tcp://0.0.0.0:0 is plain text on an address other machines may reach" in text, text
    finally:
        wide.stop()


# contract: STORE-03
async def test_nothing_is_reachable_before_the_handshake(
    tcp_server: tuple[ServerProcess, str, str], admin_store: tinystore.Store
) -> None:
    server, _, _ = tcp_server
    where = tcp_where(server.tcp)
    db = await admin_store.database("app")
    insert = encode(Exec("app", "insert into t (a) values ('sneaked in')", []))

    # a REQUEST before any HELLO: closed with a reason; no method runs
    raw = await RawClient.open(where)
    raw.send(raw.conn.send_request(1, "sql.exec", insert) + raw.conn.send_request(2, "store.stop", encode(Stop())))
    got = await raw.frames_until_closed()
    await raw.close()
    assert [f.kind for f in got] == [Kind.GOAWAY]
    bye = goaway_of(got)
    assert bye.code == "protocol" and "HELLO" in bye.reason

    # a HELLO without a token, with requests right behind it: refused, and the requests are not run
    raw = await RawClient.open(where)
    raw.send(
        raw.conn.send_hello(encode({"version": 1, "token": ""}))
        + raw.conn.send_request(1, "sql.exec", insert)
        + raw.conn.send_request(2, "store.stop", encode(Stop()))
    )
    got = await raw.frames_until_closed()
    await raw.close()
    assert [f.kind for f in got] == [Kind.ERROR]
    assert error_of(got[0]).code == "unauthenticated"

    # a wrong token, then requests one by one as if refused meant nothing
    raw = await RawClient.open(where)
    f = await raw.hello("w" * 32)
    assert error_of(f).code == "unauthenticated"
    raw.send(raw.conn.send_request(1, "store.stop", encode(Stop())))
    assert await raw.frames_until_closed() == []
    await raw.close()

    await asyncio.sleep(0.2)
    assert server_alive(server)
    assert [r["a"] for r in await db.all("select a from t")] == ["kept"]
    assert (await admin_store.status())["pid"] == server.proc.pid  # type: ignore[union-attr]


# contract: STORE-03
async def test_data_token_reads_and_writes_but_cannot_stop_or_migrate(
    tcp_server: tuple[ServerProcess, str, str], admin_store: tinystore.Store
) -> None:
    server, _, data = tcp_server
    store = await tinystore.connect(server.tcp, token=data)
    try:
        # reads and writes
        db = await store.database("app", migrations=MIGRATIONS)  # already applied: nothing to run
        done = await db.exec("insert into t (a) values (?) returning id", "by data")
        assert done.changes == 1 and done.rows
        assert await db.scalar("select count(*) from t") == 2

        async def work(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t (a) values ('in a tx')")
            n: int = await tx.scalar("select count(*) from t")
            return n

        assert await db.tx(work) == 3
        # no stopping
        with pytest.raises(PermissionDeniedError):
            await store.stop_server()
        # no new migrations, nor a changed one
        with pytest.raises(PermissionDeniedError):
            await store.database("app", migrations=[*MIGRATIONS, ("002_u.sql", "create table u (a);")])
        with pytest.raises(PermissionDeniedError):
            await store.database("app", migrations=[("001_t.sql", "create table t (id integer primary key);")])
        # nor the schema changes a migration is for, through exec (alone or in a transaction)
        for ddl in (
            "create table u (a)",
            "drop table t",
            "alter table t add column b",
            " /* x */ CREATE INDEX i ON t (a)",
            # trial S: an empty statement first (SQLite skips it) hid the word from the check
            "; drop table t",
            ";create table u (a)",
            " ; /* x */ ;\n alter table t add column b",
        ):
            with pytest.raises(PermissionDeniedError) as info:
                await db.exec(ddl)
            assert "admin capability" in info.value.message

        for ddl in ("drop table t", ";create index i on t (a)"):

            async def ddl_in_tx(tx: tinystore.SqlTx, ddl: str = ddl) -> None:
                await tx.exec(ddl)

            with pytest.raises(PermissionDeniedError):
                await db.tx(ddl_in_tx)

            async def ddl_deferring(tx: tinystore.SqlTx, ddl: str = ddl) -> None:
                await tx.exec("pragma defer_foreign_keys = on")  # (its later statements are prepared apart)
                await tx.exec(ddl)

            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.tx(ddl_deferring)
        # nor through a transaction's reads, which run on the writer (they did: tx.one("drop table t"))
        for ddl in ("drop table t", "create table evil (a)", "analyze", "reindex"):

            async def ddl_as_read(tx: tinystore.SqlTx, ddl: str = ddl) -> None:
                await tx.one(ddl)

            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.tx(ddl_as_read)
        for ddl in ("analyze", "vacuum", "reindex"):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(ddl)
        # nor by a PRAGMA that does the same (trial FC: optimize ran ANALYZE, sqlite_stat1 made for a data token)
        for pragma in (
            "pragma optimize=0x10002",
            "pragma optimize(-1)",
            'pragma /* x */ main."optimize"',
            "pragma incremental_vacuum(100)",
            "pragma auto_vacuum=2",
            "pragma page_size = 8192",
            "pragma user_version=77",
            # (trial FD: a name in single quotes, which SQLite takes too, passed the check)
            "pragma 'user_version' = 6",
            "pragma 'user_version'(8)",
            "pragma main.'optimize'",
            "pragma 'incremental_vacuum'",
            "pragma 'main'.'application_id' = 9",
        ):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(pragma)
            # a read refuses them alike (trial FF: a reader's connection answered page_size and optimize with no
            # row and no word, where exec and tx refused)
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.all(pragma)
        # trial HB: a byte order mark, which SQLite reads as a blank, before or inside the words hid them
        for ddl in ("\ufeffdrop table t", "\ufeff create index i on t (a)", "\ufeffanalyze"):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(ddl)
        with pytest.raises(InvalidError, match="syntax error"):  # (inside a word, SQLite takes it for a letter)
            await db.exec("drop\ufefftable t")
        with pytest.raises(PermissionDeniedError, match="need the admin capability"):
            await db.exec("\ufeffpragma user_version = 42")
        # trial HB: PRAGMA optimize as its table function ran ANALYZE from a SELECT, in a transaction or not
        for sql in ("select * from pragma_optimize", "select * from main.PRAGMA_OPTIMIZE(0x10002)"):

            async def optimize(tx: tinystore.SqlTx, sql: str = sql) -> None:
                await tx.all("select count(*) from t")
                await tx.all(sql)

            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.tx(optimize)
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.all(sql)
        assert await db.scalar("select count(*) from sqlite_master where name like 'sqlite_stat%'") == 0
        # trial HB: the planner's statistics, which ANALYZE writes, written by hand (an admin's ANALYZE made them)
        admin_db = await admin_store.database("app")
        await admin_db.exec("create index t_a on t (a)")
        await admin_db.exec("analyze")
        stats = await admin_db.all("select * from sqlite_stat1 order by idx")
        assert stats
        for sql in (
            "delete from sqlite_stat1",
            "insert into main.sqlite_stat1 values ('t', null, '9 9')",
            # trial HC: a name as a string literal (SQLite takes one where a name goes), and a quoted name holding
            # -- or ' that hid the rest of the text as a comment or a string
            "update 'sqlite_stat1' set stat = '1 1'",
            "insert into main.'SQLITE_STAT1' values ('t', null, '5')",
            "with \"--\" as (select 1) update sqlite_stat1 set stat = '1 1'",
            "with `'` as (select 1) delete from sqlite_stat1",
            "with [/*] as (select 1) delete from sqlite_stat1",
        ):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(sql)
        for sql in (
            "select * from 'pragma_optimize'",
            'select 1 as "--" from pragma_optimize',
            "select 1 as `'`, * from pragma_optimize as `'`",
            "select 1 as [/*] from pragma_optimize(65538)",
        ):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.all(sql)
        # trial HC: EXPLAIN of a PRAGMA that sets what migrations own sets it as it is prepared
        for sql in ("explain pragma auto_vacuum = full", "EXPLAIN QUERY PLAN pragma user_version = 3"):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(sql)
        # (and what only reads, or holds the words in its strings or quoted names, is fine: SQLite's authorizer judges
        # what the statement does, not its words, so a value that is exactly a guarded name is fine too)
        assert await db.scalar("select 'pragma_optimize, sqlite_stat1'") == "pragma_optimize, sqlite_stat1"
        assert await db.scalar("select 'sqlite_stat1'") == "sqlite_stat1"
        assert await db.scalar("select count(*) from t where a = 'pragma_optimize' or a = \"sqlite_stat1\"") == 0
        done = await db.exec("insert into t (a) values ('drop table t') returning a")
        assert done.rows == [["drop table t"]]
        await db.exec("delete from t where a = 'drop table t'")
        assert await db.scalar("select \"a's\" from (select 1 as \"a's\") where 'see sqlite_stat1' != ''") == 1
        assert await db.scalar("select count(*) from t where a like '%pragma_optimize%' or \"a\" = 'it''s'") == 0
        assert await db.scalar("pragma user_version") == 0  # reading them is fine
        assert await db.all("select * from sqlite_stat1 order by idx") == stats  # (reading them is fine)
        # a statement that the admin's client had prepared is prepared anew, and refused, for a data token (sqlite3
        # keeps prepared statements by their text: they must not be shared)
        for sql in ("analyze t", "reindex t_a", "pragma optimize"):
            await admin_db.exec(sql)
            await admin_db.exec(sql)
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.exec(sql)
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await db.tx(lambda tx, sql=sql: tx.exec(sql))
        # trial HF: SQLite prepares statements while one runs too: pragma_optimize's PRAGMA, and the ANALYZE it runs,
        # at the second row of a statement (on the writer, after a read that used the index t_a); refused alike
        await admin_db.exec("delete from sqlite_stat1")
        await admin_db.exec(
            "insert into t (a) with recursive c(n) as (select 1 union all select n + 1 from c where n < 2000) "
            "select n % 10 from c"
        )
        await db.exec("select count(*) from t where a = '6'")
        late = "select 1 union all select (select count(*) from pragma_optimize(2))"
        for run in (lambda: db.exec(late), lambda: db.tx(lambda tx: tx.exec(late)), lambda: db.all(late)):
            with pytest.raises(PermissionDeniedError, match="need the admin capability"):
                await run()
        assert await admin_db.all("select * from sqlite_stat1") == []
        await admin_db.exec("delete from t where id > 3")
        # what no client may do says so, not that it needs the admin capability (trial HH)
        for sql in ("attach 'x.db' as y", "vacuum into 'copy.db'"):
            with pytest.raises(InvalidError, match="ATTACH, DETACH and VACUUM INTO are refused"):
                await db.exec(sql)
        # still connected and working after the refusals
        assert await db.scalar("select count(*) from t") == 3
    finally:
        await store.close()
    assert server_alive(server)
    admin_db = await admin_store.database("app")
    assert await admin_db.scalar("select count(*) from sqlite_master where name in ('u', 'evil')") == 0
    assert await admin_db.scalar("select count(*) from sqlite_master where name = 't'") == 1


# contract: STORE-03
async def test_a_statement_names_the_database_of_its_transaction(
    tcp_server: tuple[ServerProcess, str, str], admin_store: tinystore.Store
) -> None:
    """A raw ``sql.exec`` naming one database (one of the store's own, whose schema check was skipped) with a
    transaction of another ran in that transaction: a data token dropped a table of ``app`` so."""
    from tinystore.protocol.sql import Begin, TxRef

    server, _, data = tcp_server
    host, port = server.tcp.removeprefix("tcp://").rsplit(":", 1)
    raw = await RawClient.open(("tcp", (host, int(port))))
    try:
        assert (await raw.hello(data)).kind is Kind.WELCOME
        began = await raw.call(1, "sql.begin", encode(Begin("app", False)))
        assert began.kind is Kind.RESPONSE
        tx_id = decode(began.body, int)
        for db in ("tinystore-jobs", "other"):
            f = await raw.call(2, "sql.exec", encode(Exec(db, "drop table t", [], tx_id)))
            assert f.kind is Kind.ERROR, f
            assert error_of(f).code in ("invalid", "permission_denied"), error_of(f)
        f = await raw.call(3, "sql.exec", encode(Exec("tinystore-jobs", "select 1", [], tx_id)))
        assert f.kind is Kind.ERROR and "is a transaction of database app" in error_of(f).message
        assert (await raw.call(4, "sql.rollback", encode(TxRef(tx_id)))).kind is Kind.RESPONSE
    finally:
        await raw.close()
    admin_db = await admin_store.database("app")
    assert await admin_db.scalar("select count(*) from sqlite_master where name = 't'") == 1


# contract: STORE-03
async def test_data_token_cannot_migrate_a_new_database(
    tcp_server: tuple[ServerProcess, str, str],
) -> None:
    server, _, data = tcp_server
    store = await tinystore.connect(server.tcp, token=data)
    try:
        with pytest.raises(PermissionDeniedError):
            await store.database("fresh", migrations=MIGRATIONS)
    finally:
        await store.close()


# -- TLS ------------------------------------------------------------------------------------------


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the `cryptography` package if there, else `openssl`)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        import datetime

        from cryptography import x509  # type: ignore[import-not-found]
        from cryptography.hazmat.primitives import hashes, serialization  # type: ignore[import-not-found]
        from cryptography.hazmat.primitives.asymmetric import ec  # type: ignore[import-not-found]
        from cryptography.x509.oid import NameOID  # type: ignore[import-not-found]
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is available")
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return cert, key
    import ipaddress

    pkey = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    c = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pkey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(pkey, hashes.SHA256())
    )
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key


# contract: STORE-03
async def test_tls_checks_the_server_before_the_token_leaves(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(
        tmp_path / "store",
        "--listen",
        "tls://127.0.0.1:0",
        "--tokens",
        str(tokens),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    ).start()
    try:
        address = server.tcp
        assert address.startswith("tls://127.0.0.1:")
        trusting = ssl.create_default_context(cafile=str(cert))
        store = await tinystore.connect(address, token=admin, ssl_context=trusting)
        try:
            db = await store.database("app", migrations=MIGRATIONS)
            await db.exec("insert into t (a) values ('over tls')")
            assert await db.scalar("select a from t") == "over tls"
        finally:
            await store.close()
        # a context that does not trust the certificate: refused by the client, before any HELLO
        with pytest.raises(UnavailableError):
            await tinystore.connect(address, token=admin, ssl_context=ssl.create_default_context())
        # the right certificate but a wrong token is still refused
        with pytest.raises(UnauthenticatedError):
            await tinystore.connect(address, token="z" * 32, ssl_context=trusting)
        # plain TCP to the TLS port gets nothing of the store
        with pytest.raises(UnavailableError):
            await tinystore.connect(address.replace("tls://", "tcp://"), token=admin, reconnect_timeout=1)
        assert server_alive(server)
    finally:
        server.stop()


class _Recorder(asyncio.Protocol):
    """A TLS server's protocol that records whatever a client sends after the handshake, then hangs up."""

    def __init__(self, got: list[bytes]) -> None:
        self.got = got
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got.append(data)
        assert self.transport is not None
        self.transport.close()


# contract: STORE-03
async def test_an_untrusted_server_never_sees_the_token(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(cert), str(key))
    got: list[bytes] = []
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Recorder(got), "127.0.0.1", 0, ssl=server_ctx)
    try:
        port = srv.sockets[0].getsockname()[1]
        token = "s3cret-" + "t" * 24
        # the client does not trust this server: the handshake fails and nothing is sent
        with pytest.raises(UnavailableError):
            await tinystore.connect(f"tls://127.0.0.1:{port}", token=token, ssl_context=ssl.create_default_context())
        await asyncio.sleep(0.1)
        assert got == []
        # the control: a client that trusts it sends its HELLO, token included, over TLS
        with pytest.raises(UnavailableError):
            await tinystore.connect(
                f"tls://127.0.0.1:{port}",
                token=token,
                ssl_context=ssl.create_default_context(cafile=str(cert)),
                reconnect_timeout="1s",  # (a server that hangs up is tried again until then)
            )
        assert token.encode() in b"".join(got)
    finally:
        srv.close()
        await srv.wait_closed()


# contract: STORE-04
async def test_garbage_before_the_handshake_is_logged_once_a_minute(
    tcp_server: tuple[ServerProcess, str, str], admin_store: tinystore.Store
) -> None:
    """Trial FL: each of a hundred connections that sent garbage first logged a line of its own; before a handshake
    anyone may, so it is one line a minute, counted, naming the peer as HOST:PORT."""
    server, _, _ = tcp_server
    host, port = tcp_where(server.tcp)[1]
    for _ in range(5):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) is not None  # (closed by the server)
        writer.close()
    db = await admin_store.database("app")
    assert await db.scalar("select 1") == 1  # the others go on
    lines = [x for x in (server.directory / "serve.log").read_text().splitlines() if "closing a connection" in x]
    assert len(lines) == 1 and "closing a connection from 127.0.0.1:" in lines[0], lines


# contract: STORE-03
async def test_tls_to_a_listener_that_says_nothing_names_the_likely_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial HY: tls:// to a Redis server (which waits for a line) or to any listener that says nothing first failed
    with asyncio's bare "SSL handshake is taking longer than 15.0 seconds"."""
    import tinystore.client.transport as transport_module

    monkeypatch.setattr(transport_module, "HANDSHAKE_WAIT", 0.3)
    srv = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    try:
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises(UnavailableError, match=r"does not speak TLS .*use tcp:// in place of tls://"):
            await tinystore.connect(
                f"tls://127.0.0.1:{port}",
                token="t" * 32,
                ssl_context=ssl.create_default_context(),
                reconnect_timeout="0.2s",
            )
    finally:
        srv.close()
        await srv.wait_closed()


# contract: STORE-06
@pytest.mark.parametrize("scheme", ["tcp", "tls"])
async def test_a_short_reconnect_timeout_bounds_a_handshake_no_one_answers(scheme: str) -> None:
    """A listener that takes the connection and says nothing (a stuck server, or not a TinyStore one) held a
    client that gave the store 2 s for the whole 15 s of a handshake's wait: one try now waits no longer than the
    ``reconnect_timeout`` (2 s at the least)."""
    srv = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    try:
        port = srv.sockets[0].getsockname()[1]
        extra: dict[str, Any] = {"ssl_context": ssl.create_default_context()} if scheme == "tls" else {}
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            await tinystore.connect(f"{scheme}://127.0.0.1:{port}", token="t" * 32, reconnect_timeout="2s", **extra)
        assert time.monotonic() - started < 5
    finally:
        srv.close()
        await srv.wait_closed()


# contract: STORE-06
async def test_a_handshake_not_answered_at_an_address_is_tried_again_until_reconnect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trial IG: a server out of file descriptors leaves new connections in its listen queue (served as others
    leave); a plain tcp:// client failed at its first handshake's wait, where a TLS one (its TLS handshake timed out,
    which passes) tried again until its reconnect_timeout and was served."""
    import tinystore.client.transport as transport_module

    monkeypatch.setattr(transport_module, "HANDSHAKE_WAIT", 0.5)
    tries = 0

    def made() -> asyncio.Protocol:
        nonlocal tries
        tries += 1
        return asyncio.Protocol()

    srv = await asyncio.get_running_loop().create_server(made, "127.0.0.1", 0)
    try:
        port = srv.sockets[0].getsockname()[1]
        started = time.monotonic()
        with pytest.raises(UnavailableError, match=r"could not be reached for .*did not answer the handshake"):
            await tinystore.connect(f"tcp://127.0.0.1:{port}", token="t" * 32, reconnect_timeout="3s")
        assert 2.5 < time.monotonic() - started < 6
        assert tries >= 3, tries
    finally:
        srv.close()
        await srv.wait_closed()


# contract: STORE-06
async def test_a_short_reconnect_timeout_still_gives_a_handshake_two_seconds(tmp_path: Path) -> None:
    """Trial II: with a handshake tried again until reconnect_timeout, each try's wait was cut to what was left of
    it: a client whose reconnect_timeout was 0.5 s failed against a server held up for a second, which the 2 s a
    handshake is given at the least let through before."""
    import os
    import signal

    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        asyncio.get_running_loop().call_later(1.0, os.kill, server.proc.pid, signal.SIGCONT)
        store = await tinystore.connect(server.tcp, token=admin, reconnect_timeout="0.5s")
        await store.close()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
