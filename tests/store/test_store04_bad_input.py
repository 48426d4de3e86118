"""STORE-04: bad input on one connection gets an error or that connection closed with a reason; the server
keeps serving everyone else and loses nothing committed."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinystore
from tinystore.client.sql import Database
from tinystore.protocol.frames import HEADER_SIZE, Kind, encode_frame
from tinystore.protocol.messages import encode
from tinystore.protocol.sql import Exec, Query
from tinystore.server import paths

from ..helpers import ServerProcess, write_tokens
from .raw import RawClient, Where, error_of, goaway_of

MIGRATIONS = [("001_t.sql", "create table t (id integer primary key, a text);")]


@dataclass
class Served:
    """A running server, a well-behaved client on it, and how to reach it by hand."""

    good: tinystore.Store
    db: Database
    where: Where
    token: str
    rows: int = 1

    async def raw(self) -> RawClient:
        return await RawClient.open(self.where)

    async def handshaken(self) -> RawClient:
        raw = await self.raw()
        f = await raw.hello(self.token)
        assert f.kind is Kind.WELCOME, error_of(f).message
        return raw

    async def check_good(self) -> None:
        """The good client still works: it commits one more row and sees every committed row."""
        await self.db.exec("insert into t (a) values (?)", f"good {self.rows}")
        self.rows += 1
        assert await self.db.scalar("select count(*) from t where a like 'good %'") == self.rows
        assert (await self.good.status())["pid"] > 0


@pytest.fixture(params=["private", "tcp"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    d = tmp_path / "store"
    server: ServerProcess | None = None
    if request.param == "private":
        good = await tinystore.open(d, private=True)
        where: Where = ("unix", paths.socket_path(d))
        token = ""
    else:
        tokens, admin, _ = write_tokens(tmp_path)
        server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
        good = await tinystore.connect(server.tcp, token=admin)
        host, port = server.tcp.split("://")[1].rsplit(":", 1)
        where = ("tcp", (host, int(port)))
        token = admin
    try:
        db = await good.database("app", migrations=MIGRATIONS)
        await db.exec("insert into t (a) values ('good 0')")
        s = Served(good, db, where, token)
        yield s
        # and at the very end, after everything: every committed row is there
        assert await db.scalar("select count(*) from t where a like 'good %'") == s.rows
    finally:
        await good.close()
        if server is not None:
            assert server.stop() == 0


async def closed_with_reason(raw: RawClient, *words: str) -> str:
    got = await raw.frames_until_closed()
    await raw.close()
    bye = goaway_of(got)
    assert bye.reason
    for w in words:
        assert w in bye.reason, bye.reason
    return bye.reason


# contract: STORE-04
async def test_garbage_bytes(served: Served) -> None:
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\x00\x00\x02" + b"\x01" * 10, b"\xff" * 64):
        raw = await served.raw()
        raw.send(garbage)
        await closed_with_reason(raw)
        await served.check_good()
    # a zero-length frame first: told at once (it waited for the handshake's 10 s)
    raw = await served.raw()
    raw.send(b"\x00\x00\x00\x00")
    await asyncio.wait_for(closed_with_reason(raw, "frame length 0 is shorter than its header"), 5)
    # garbage after a good handshake
    raw = await served.handshaken()
    raw.send(b"\x00\x00\x00\x03abcdefgh")
    await closed_with_reason(raw, "shorter than its header")
    await served.check_good()


# contract: STORE-04
async def test_truncated_frame_then_close(served: Served) -> None:
    raw = await served.handshaken()
    frame = raw.conn.send_request(1, "sql.exec", encode(Exec("app", "insert into t (a) values ('half')", [])))
    raw.send(frame[: len(frame) // 2])
    await raw.writer.drain()
    await raw.close()
    # also cut inside the header, before any handshake
    raw = await served.raw()
    raw.send(b"\x00\x00\x00")
    await raw.close()
    await served.check_good()
    assert await served.db.scalar("select count(*) from t where a = 'half'") == 0


# contract: STORE-04
async def test_oversized_frame_header(served: Served) -> None:
    raw = await served.handshaken()
    # says 17 MiB of body follow (the limit is 16 MiB): refused from the header, the body never sent
    raw.send(struct.pack(">IBBIB", HEADER_SIZE - 4 + 8 + 17 * 1024 * 1024, Kind.REQUEST, 0, 1, 8) + b"sql.exec")
    await closed_with_reason(raw, "over the limit")
    # and before any handshake
    raw = await served.raw()
    raw.send(struct.pack(">IBBIB", 0xFFFFFFFF, Kind.HELLO, 0, 0, 0))
    await closed_with_reason(raw, "over the limit")
    await served.check_good()


# contract: STORE-04
async def test_out_of_order_frames(served: Served) -> None:
    # a WELCOME from a client, before and after the handshake
    raw = await served.raw()
    raw.send(encode_frame(Kind.WELCOME, 0, "", encode({"version": 1})))
    await closed_with_reason(raw, "WELCOME")
    raw = await served.handshaken()
    raw.send(encode_frame(Kind.WELCOME, 0, "", b""))
    await closed_with_reason(raw, "WELCOME")
    # a second HELLO
    raw = await served.handshaken()
    raw.send(raw.conn.send_hello(b""))
    await closed_with_reason(raw, "HELLO")
    # a RESPONSE from a client
    raw = await served.handshaken()
    raw.send(encode_frame(Kind.RESPONSE, 1, "", b""))
    await closed_with_reason(raw, "RESPONSE")
    # the same stream twice while in flight (a slow statement holds stream 1)
    raw = await served.handshaken()
    slow = encode(
        Query(
            "app",
            "with recursive c(x) as (select 1 union all select x + 1 from c where x < 100000) select count(*) from c",
            [],
            "scalar",
        )
    )
    raw.send(raw.conn.send_request(1, "sql.query", slow) + raw.conn.send_request(1, "sql.query", slow))
    await closed_with_reason(raw, "already in flight")
    # a HELLO whose body is not a Hello
    raw = await served.raw()
    raw.send(raw.conn.send_hello(b"\xc1\xc1"))
    await closed_with_reason(raw, "HELLO")
    await served.check_good()


# contract: STORE-04
async def test_unknown_method_and_wrong_body_types_get_errors(served: Served) -> None:
    raw = await served.handshaken()
    try:
        f = await raw.call(1, "no.such.method", b"")
        err = error_of(f)
        assert err.code == "invalid" and "no.such.method" in err.message
        # sql.exec with params a string instead of a list
        f = await raw.call(2, "sql.exec", encode(["app", "insert into t (a) values (?)", "oops", 0]))
        err = error_of(f)
        assert err.code == "invalid" and "sql.exec" in err.message
        # the body is not MessagePack at all
        f = await raw.call(3, "sql.exec", b"\xc1\xc1\xc1")
        assert error_of(f).code == "invalid"
        # a body of the wrong shape entirely
        f = await raw.call(4, "sql.query", encode({"db": 7}))
        assert error_of(f).code == "invalid"
        f = await raw.call(5, "store.stop", encode("now"))
        assert error_of(f).code == "invalid"
        # a value SQLite cannot hold, sent by hand past the SDK's own check
        f = await raw.call(6, "sql.exec", encode(Exec("app", "insert into t (a) values (?)", [float("nan")])))
        assert error_of(f).code == "invalid"
        f = await raw.call(61, "sql.exec", encode(Exec("app", "insert into t (a) values (?)", [{"a": [1]}])))
        assert error_of(f).code == "invalid"
        # a database that does not exist, and SQL that does not parse
        f = await raw.call(7, "sql.exec", encode(Exec("nope", "select 1", [])))
        assert error_of(f).code == "invalid"
        f = await raw.call(8, "sql.exec", encode(Exec("app", "insert into", [])))
        assert error_of(f).code in ("invalid", "conflict")
        # the same connection still serves a good call afterwards
        f = await raw.call(9, "store.ping", encode({}))
        assert f.kind is Kind.RESPONSE
        f = await raw.call(
            10, "sql.query", encode(Query("app", "select count(*) from t where a like 'good %'", [], "scalar"))
        )
        assert f.kind is Kind.RESPONSE
    finally:
        await raw.close()
    await served.check_good()
    assert await served.db.scalar("select count(*) from t where a = 'oops'") == 0


# contract: STORE-04
async def test_many_bad_connections_at_once(served: Served) -> None:
    raws = [await served.raw() for _ in range(20)]
    for i, raw in enumerate(raws):
        raw.send(bytes([i]) * (i + 5))
    await served.check_good()
    for raw in raws:
        await raw.close()
    await served.check_good()


# contract: STORE-04
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=300), after_hello=st.booleans())
async def test_random_bytes_on_fresh_connections(served: Served, data: bytes, after_hello: bool) -> None:
    raw = await (served.handshaken() if after_hello else served.raw())
    raw.send(data)
    raw.writer.write_eof()
    # the server answers with frames (or nothing) and closes; it never hangs on a half-closed connection
    await raw.frames_until_closed(timeout=5)
    await raw.close()
    await served.check_good()


async def test_a_body_nested_too_deeply_is_invalid_not_internal(served: Served) -> None:
    deep = msgspec.Raw(b"\x91" * 200_000 + b"\xc0")  # 200,000 arrays, one in the other
    raw = await served.handshaken()
    try:
        f = await raw.call(1, "sql.exec", encode(Exec("app", "select ?", [deep])))
        err = error_of(f)
        assert err.code == "invalid" and err.message == "sql.exec: the body nests too deeply to be read"
        f = await raw.call(2, "store.ping", encode({}))  # the connection goes on
        assert f.kind is Kind.RESPONSE
    finally:
        await raw.close()
    with pytest.raises(tinystore.InvalidError, match="nests too deeply"):  # so does the SDK's call of it
        await served.good._call("sql.exec", Exec("app", "select ?", [deep]), write=True)
    await served.check_good()
