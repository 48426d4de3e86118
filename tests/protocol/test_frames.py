"""The sans-I/O frames and Connection state machine: round trips, ordering, limits, and a fuzz test."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinystore.errors import ProtocolError
from tinystore.protocol import frames
from tinystore.protocol.frames import (
    CLOSED,
    HEADER_SIZE,
    MORE,
    NEED_DATA,
    Closed,
    Connection,
    Frame,
    Kind,
    NeedData,
    encode_frame,
)
from tinystore.protocol.messages import ErrorBody, GoAway, Hello, Welcome, decode, encode

HELLO = Hello(version=frames.PROTOCOL_VERSION, token="t" * 16, client="test", pid=1)
WELCOME = Welcome(
    version=frames.PROTOCOL_VERSION,
    server_version="0",
    epoch=7,
    capability="admin",
    max_inflight=4,
    max_body=1024,
    pid=1,
)


def events(conn: Connection) -> list[Frame | NeedData | Closed]:
    """Every event buffered, up to and including the first NEED_DATA or CLOSED."""
    out: list[Frame | NeedData | Closed] = []
    while True:
        ev = conn.next_event()
        out.append(ev)
        if not isinstance(ev, Frame):
            return out


def handshake(max_inflight: int = 4, max_body: int = frames.DEFAULT_MAX_BODY) -> tuple[Connection, Connection]:
    """A client and a server Connection past the handshake."""
    client = Connection("client")
    server = Connection("server", max_inflight=max_inflight, max_body=max_body)
    server.receive_data(client.send_hello(encode(HELLO)))
    f = server.next_event()
    assert isinstance(f, Frame) and f.kind is Kind.HELLO
    assert decode(f.body, Hello) == HELLO
    client.receive_data(server.send_welcome(encode(WELCOME)))
    w = client.next_event()
    assert isinstance(w, Frame) and w.kind is Kind.WELCOME
    assert decode(w.body, Welcome) == WELCOME
    assert client.handshaken and server.handshaken
    return client, server


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_of_every_kind() -> None:
    client, server = handshake()
    # client → server: REQUEST, CANCEL, GOAWAY
    server.receive_data(
        client.send_request(1, "sql.exec", b"\x91\x01")
        + client.send_request(2, "store.ping", b"")
        + client.send_cancel(2)
        + client.send_goaway(encode(GoAway(reason="bye")))
    )
    got = events(server)
    assert got[-1] is NEED_DATA
    frames_ = [f for f in got if isinstance(f, Frame)]
    assert [(f.kind, f.stream, f.method, f.body) for f in frames_[:3]] == [
        (Kind.REQUEST, 1, "sql.exec", b"\x91\x01"),
        (Kind.REQUEST, 2, "store.ping", b""),
        (Kind.CANCEL, 2, "", b""),
    ]
    assert frames_[3].kind is Kind.GOAWAY and decode(frames_[3].body, GoAway).reason == "bye"
    assert server.inflight == {1}  # the CANCEL gave stream 2's credit back
    server.finished(2)
    # server → client: RESPONSE, ERROR, PUSH, GOAWAY
    out = b"".join(server.send_response(1, b"\xc3"))
    out += server.send_error(3, encode(ErrorBody(code="invalid", message="no")))
    out += server.send_push("chan.deliver", b"\x90")
    out += server.send_goaway(encode(GoAway(reason="stopping", code="unavailable")))
    assert server.inflight == set()
    client.receive_data(out)
    got = events(client)
    frames_ = [f for f in got if isinstance(f, Frame)]
    assert [(f.kind, f.stream, f.method, f.flags) for f in frames_] == [
        (Kind.RESPONSE, 1, "", 0),
        (Kind.ERROR, 3, "", 0),
        (Kind.PUSH, 0, "chan.deliver", 0),
        (Kind.GOAWAY, 0, "", 0),
    ]
    assert frames_[0].body == b"\xc3"
    assert decode(frames_[1].body, ErrorBody).message == "no"
    assert decode(frames_[3].body, GoAway).code == "unavailable"


def test_byte_at_a_time_gives_the_same_frames() -> None:
    client, _ = handshake()
    server = Connection("server")
    data = client.send_hello(encode(HELLO))
    for i, b in enumerate(data):
        server.receive_data(bytes([b]))
        ev = server.next_event()
        if i < len(data) - 1:
            assert ev is NEED_DATA
        else:
            assert isinstance(ev, Frame) and ev.kind is Kind.HELLO


def test_eof_gives_closed_and_eof_mid_frame_is_an_error() -> None:
    _, server = handshake()
    server.receive_data(b"")
    assert server.next_event() is CLOSED
    _, server = handshake()
    server.receive_data(encode_frame(Kind.REQUEST, 1, "m", b"abc")[:-1])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(ProtocolError, match="middle of a frame"):
        server.next_event()
    _, server = handshake()
    server.receive_data(b"\x00\x00")
    server.receive_data(b"")
    with pytest.raises(ProtocolError, match="middle of a frame"):
        server.next_event()


def test_encode_refuses_a_long_method_name() -> None:
    with pytest.raises(ProtocolError, match="too long"):
        encode_frame(Kind.REQUEST, 1, "m" * 256, b"")


# -- handshake ordering ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Kind.REQUEST, Kind.CANCEL, Kind.GOAWAY])
def test_server_wants_hello_first(kind: Kind) -> None:
    server = Connection("server")
    server.receive_data(encode_frame(kind, 1, "store.ping", b""))
    with pytest.raises(ProtocolError, match="expected HELLO first"):
        server.next_event()


def test_a_server_refuses_a_large_hello_from_its_header_before_buffering_it() -> None:
    """Before the handshake no token was shown: a peer may not make the server buffer a frame of up to the frame
    limit (250 such connections held 4 GiB). The header alone is enough to refuse it."""
    # contract: STORE-04
    server = Connection("server")
    header = struct.pack(">IBBIB", 7 + frames.HELLO_MAX + 1, Kind.HELLO, 0, 0, 0)
    server.receive_data(header + b"x" * 100)  # the body has barely begun
    with pytest.raises(ProtocolError, match=f"a handshake is at most {frames.HELLO_MAX} bytes"):
        server.next_event()
    ok = Connection("server")  # a HELLO at the bound is read
    ok.receive_data(encode_frame(Kind.HELLO, 0, "", b"h" * frames.HELLO_MAX))
    assert isinstance(ok.next_event(), Frame)


def test_hello_twice_is_refused() -> None:
    client = Connection("client")
    server = Connection("server")
    # a second HELLO before the WELCOME went out
    server.receive_data(client.send_hello(b"") * 2)
    assert isinstance(server.next_event(), Frame)
    with pytest.raises(ProtocolError, match="second HELLO"):
        server.next_event()
    # and after the handshake
    _, server = handshake()
    server.receive_data(client.send_hello(b""))
    with pytest.raises(ProtocolError, match="HELLO after the handshake"):
        server.next_event()


def test_requests_before_welcome_are_refused_even_after_hello() -> None:
    client = Connection("client")
    server = Connection("server")
    server.receive_data(client.send_hello(b"") + client.send_request(1, "store.ping", b""))
    assert isinstance(server.next_event(), Frame)
    with pytest.raises(ProtocolError, match="expected HELLO first, got REQUEST"):
        server.next_event()


@pytest.mark.parametrize("kind", [Kind.WELCOME, Kind.RESPONSE, Kind.ERROR, Kind.PUSH])
def test_server_refuses_server_kinds_from_a_client(kind: Kind) -> None:
    _, server = handshake()
    server.receive_data(encode_frame(kind, 0, "", b""))
    with pytest.raises(ProtocolError, match=f"does not accept {kind.name}"):
        server.next_event()


@pytest.mark.parametrize("kind", [Kind.HELLO, Kind.REQUEST, Kind.CANCEL])
def test_client_refuses_client_kinds_from_a_server(kind: Kind) -> None:
    client, _ = handshake()
    client.receive_data(encode_frame(kind, 1, "", b""))
    with pytest.raises(ProtocolError, match=f"does not accept {kind.name}"):
        client.next_event()


@pytest.mark.parametrize("kind", [Kind.RESPONSE, Kind.PUSH])
def test_client_wants_welcome_first(kind: Kind) -> None:
    client = Connection("client")
    client.receive_data(encode_frame(kind, 1, "", b""))
    with pytest.raises(ProtocolError, match="expected WELCOME first"):
        client.next_event()


def test_client_accepts_a_refusal_or_goaway_as_first_frame() -> None:
    for kind in (Kind.ERROR, Kind.GOAWAY):
        client = Connection("client")
        client.receive_data(encode_frame(kind, 0, "", encode(GoAway(reason="no"))))
        ev = client.next_event()
        assert isinstance(ev, Frame) and ev.kind is kind
        assert not client.handshaken


def test_welcome_twice_is_refused() -> None:
    client, _ = handshake()
    client.receive_data(encode_frame(Kind.WELCOME, 0, "", encode(WELCOME)))
    with pytest.raises(ProtocolError, match="WELCOME after the handshake"):
        client.next_event()


# -- limits ---------------------------------------------------------------------------------------


def test_oversized_body_is_refused_from_the_header_alone() -> None:
    _, server = handshake(max_body=1000)
    # exactly at the limit: fine
    server.receive_data(encode_frame(Kind.REQUEST, 1, "m", b"x" * 1000))
    assert isinstance(server.next_event(), Frame)
    # one past it: refused as soon as the header is in, before any of the body arrives
    header = struct.pack(">IBBIB", HEADER_SIZE - 4 + 1 + 1001, Kind.REQUEST, 0, 2, 1)
    server.receive_data(header)
    with pytest.raises(ProtocolError, match="over the limit of 1000 bytes"):
        server.next_event()


def test_length_shorter_than_the_header_is_refused() -> None:
    _, server = handshake()
    server.receive_data(struct.pack(">IBBIB", 3, Kind.REQUEST, 0, 1, 0))
    with pytest.raises(ProtocolError, match="shorter than its header"):
        server.next_event()
    _, server = handshake()
    # a method length running past the frame's length
    server.receive_data(struct.pack(">IBBIB", HEADER_SIZE - 4 + 2, Kind.REQUEST, 0, 1, 200) + b"ab")
    with pytest.raises(ProtocolError, match="shorter than its header"):
        server.next_event()
    # told as soon as the length is in, not once a whole header came (a zero-length frame before the handshake
    # waited for the handshake's timeout)
    for receive in ("next_event", "next_frames"):
        _, server = handshake()
        server.receive_data(b"\x00\x00\x00\x00")
        with pytest.raises(ProtocolError, match="frame length 0 is shorter than its header"):
            getattr(server, receive)()
    server = Connection("server", max_body=1000)
    server.receive_data(b"\x00\x00\x00\x06")
    with pytest.raises(ProtocolError, match="frame length 6 is shorter than its header"):
        server.next_event()


@pytest.mark.parametrize("kind", [0, 9, 200, 255])
def test_unknown_kind(kind: int) -> None:
    _, server = handshake()
    # refused from the header alone: the (huge) body never needs to arrive
    server.receive_data(struct.pack(">IBBIB", HEADER_SIZE - 4 + 1_000_000, kind, 0, 1, 0))
    with pytest.raises(ProtocolError, match=f"unknown frame kind {kind}"):
        server.next_event()


def test_non_ascii_method_is_refused() -> None:
    _, server = handshake()
    m = "é".encode()
    server.receive_data(struct.pack(">IBBIB", HEADER_SIZE - 4 + len(m), Kind.REQUEST, 0, 1, len(m)) + m)
    with pytest.raises(ProtocolError, match="not ASCII"):
        server.next_event()


def test_stream_zero_request_is_refused() -> None:
    _, server = handshake()
    server.receive_data(encode_frame(Kind.REQUEST, 0, "store.ping", b""))
    with pytest.raises(ProtocolError, match="non-zero stream id"):
        server.next_event()


def test_duplicate_in_flight_stream() -> None:
    client, server = handshake()
    server.receive_data(client.send_request(5, "a", b"") + client.send_request(5, "b", b""))
    assert isinstance(server.next_event(), Frame)
    with pytest.raises(ProtocolError, match="stream 5 is already in flight"):
        server.next_event()
    # once answered, the id may be used again
    client, server = handshake()
    server.receive_data(client.send_request(5, "a", b""))
    assert isinstance(server.next_event(), Frame)
    server.send_response(5, b"")
    server.receive_data(client.send_request(5, "b", b""))
    assert isinstance(server.next_event(), Frame)


def test_more_than_max_inflight() -> None:
    client, server = handshake(max_inflight=3)
    server.receive_data(b"".join(client.send_request(i, "m", b"") for i in range(1, 4)))
    assert [type(e) for e in events(server)] == [Frame, Frame, Frame, NeedData]
    assert server.inflight == {1, 2, 3}
    server.receive_data(client.send_request(4, "m", b""))
    with pytest.raises(ProtocolError, match="more than 3 requests in flight"):
        server.next_event()


def test_credit_comes_back_with_responses_errors_and_cancels() -> None:
    client, server = handshake(max_inflight=2)
    server.receive_data(client.send_request(1, "m", b"") + client.send_request(2, "m", b""))
    events(server)
    server.send_response(1, b"")
    server.send_error(2, b"")
    server.receive_data(client.send_request(3, "m", b"") + client.send_request(4, "m", b""))
    assert [type(e) for e in events(server)] == [Frame, Frame, NeedData]
    server.finished(3)  # a cancelled request
    server.receive_data(client.send_request(5, "m", b""))
    assert isinstance(server.next_event(), Frame)
    server.receive_data(client.send_request(6, "m", b""))
    with pytest.raises(ProtocolError, match="in flight"):
        server.next_event()


def test_a_cancel_gives_its_credit_back_to_the_requests_read_with_it() -> None:
    """A client that cancels a call and sends another at once (one write: CANCEL, then REQUEST) stays within
    its credit: the parser frees the cancelled stream as it reads the CANCEL."""
    client, server = handshake(max_inflight=2)
    server.receive_data(client.send_request(1, "m", b"") + client.send_request(2, "m", b""))
    events(server)
    server.receive_data(client.send_cancel(2) + client.send_request(3, "m", b"") + client.send_cancel(3))
    server.receive_data(client.send_request(3, "m", b""))  # a stream id used again after its cancel
    kinds = [(e.kind, e.stream) for e in events(server) if isinstance(e, Frame)]
    assert kinds == [(Kind.CANCEL, 2), (Kind.REQUEST, 3), (Kind.CANCEL, 3), (Kind.REQUEST, 3)]
    assert server.inflight == {1, 3}


def test_a_broken_connection_stays_broken() -> None:
    client, server = handshake()
    server.receive_data(encode_frame(Kind.WELCOME, 0, "", b"") + client.send_request(1, "m", b""))
    with pytest.raises(ProtocolError) as first:
        server.next_event()
    with pytest.raises(ProtocolError) as again:
        server.next_event()
    assert again.value.message == first.value.message == server.closed_reason


# -- chunked responses ----------------------------------------------------------------------------


def test_chunked_response_with_more() -> None:
    client, server = handshake()
    server.receive_data(client.send_request(9, "sql.query", b""))
    server.next_event()
    body = bytes(range(256)) * 40  # 10240 bytes
    parts = server.send_response(9, body, chunk=1000)
    assert len(parts) == 11
    assert server.inflight == set()
    client.receive_data(b"".join(parts))
    got = [f for f in events(client) if isinstance(f, Frame)]
    assert [f.flags & MORE for f in got] == [MORE] * 10 + [0]
    assert all(f.stream == 9 and f.kind is Kind.RESPONSE for f in got)
    assert b"".join(f.body for f in got) == body
    # exactly one chunk's worth: one frame, no MORE
    assert len(server.send_response(9, b"x" * 1000, chunk=1000)) == 1
    assert len(server.send_response(9, b"", chunk=1000)) == 1


def test_large_buffers_are_compacted() -> None:
    client, server = handshake(max_inflight=10_000)
    big = b"y" * 300_000
    data = b"".join(client.send_request(i, "m", big) for i in range(1, 8))
    server.receive_data(data[:-5])
    got = [f for f in events(server) if isinstance(f, Frame)]
    server.receive_data(data[-5:])
    got += [f for f in events(server) if isinstance(f, Frame)]
    assert [f.stream for f in got] == list(range(1, 8))
    assert all(f.body == big for f in got)


def test_role_must_be_client_or_server() -> None:
    with pytest.raises(ValueError):
        Connection("peer")


# -- fuzz -----------------------------------------------------------------------------------------


def _valid_client_stream() -> bytes:
    c = Connection("client")
    out = c.send_hello(encode(HELLO))
    out += c.send_request(1, "sql.exec", encode(["app", "insert into t values (?)", [1], 0]))
    out += c.send_request(2, "store.status", encode({}))
    out += c.send_cancel(2)
    out += c.send_request(3, "sql.query", b"\x93\xa3app\xa8select 1\x90")
    out += c.send_goaway(encode(GoAway(reason="bye")))
    return out


VALID = _valid_client_stream()


def _drive(chunks: list[bytes], eof: bool, max_inflight: int = 4, max_body: int = 4096) -> None:
    """Feed ``chunks`` to a server-role Connection, answering as a server would. Only frames, NEED_DATA,
    CLOSED and ProtocolError may ever come out."""
    server = Connection("server", max_inflight=max_inflight, max_body=max_body)
    feed = [c for c in chunks if c]  # b"" is how the peer's close is told
    if eof:
        feed.append(b"")
    for chunk in feed:
        server.receive_data(chunk)
        while True:
            try:
                ev = server.next_event()
            except ProtocolError:
                # broken for good: every later call says so too
                with pytest.raises(ProtocolError):
                    server.next_event()
                return
            if ev is NEED_DATA:
                break
            if ev is CLOSED:
                assert eof and chunk == b""
                return
            assert isinstance(ev, Frame), ev
            assert isinstance(ev.method, str) and isinstance(ev.body, bytes)
            assert len(ev.body) <= max_body
            if ev.kind is Kind.HELLO:
                server.send_welcome(b"")
            elif ev.kind is Kind.REQUEST:
                assert ev.stream != 0
                if ev.stream % 2:
                    server.send_response(ev.stream, b"", chunk=16)
            elif ev.kind is Kind.CANCEL:
                server.finished(ev.stream)
            assert len(server.inflight) <= max_inflight


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return [c for c in out if c]


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.booleans())
def test_fuzz_random_bytes(chunks: list[bytes], eof: bool) -> None:
    _drive(chunks, eof)


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_fuzz_random_bytes_after_a_valid_hello(tail: bytes, cuts: list[int], eof: bool) -> None:
    data = Connection("client").send_hello(encode(HELLO)) + tail
    _drive(_split(data, cuts), eof)


@FUZZ
@given(st.integers(min_value=0, max_value=len(VALID)), st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_fuzz_truncated_valid_streams(cut: int, cuts: list[int], eof: bool) -> None:
    _drive(_split(VALID[:cut], cuts), eof)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(min_value=0, max_value=len(VALID) - 1), st.integers(0, 255)), max_size=6),
    st.lists(st.tuples(st.integers(min_value=0, max_value=len(VALID)), st.binary(min_size=1, max_size=8)), max_size=3),
    st.lists(st.tuples(st.integers(min_value=0, max_value=len(VALID)), st.integers(1, 16)), max_size=3),
    st.lists(st.integers(min_value=0), max_size=6),
    st.booleans(),
    st.integers(1, 4),
)
def test_fuzz_mutated_valid_streams(
    flips: list[tuple[int, int]],
    inserts: list[tuple[int, bytes]],
    deletes: list[tuple[int, int]],
    cuts: list[int],
    eof: bool,
    max_inflight: int,
) -> None:
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos % len(data)] = value
    for pos, blob in inserts:
        data[pos % (len(data) + 1) : pos % (len(data) + 1)] = blob
    for pos, n in deletes:
        p = pos % (len(data) + 1)
        del data[p : p + n]
    _drive(_split(bytes(data), cuts), eof, max_inflight=max_inflight)


def test_the_fuzz_corpus_is_valid_when_unmutated() -> None:
    server = Connection("server")
    server.receive_data(VALID)
    kinds = []
    while isinstance(ev := server.next_event(), Frame):
        kinds.append(ev.kind)
        if ev.kind is Kind.HELLO:
            server.send_welcome(b"")
    assert kinds == [Kind.HELLO, Kind.REQUEST, Kind.REQUEST, Kind.CANCEL, Kind.REQUEST, Kind.GOAWAY]


@pytest.mark.parametrize(
    ("first", "said"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP"),
        (b"\x16\x03\x01\x02\x00" + b"x" * 40, "TLS (a tls:// client at a listener without TLS"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "SSH"),
        (b"*1\r\n$4\r\nPING\r\n", "RESP (a Redis client)"),
    ],
)
# contract: STORE-04
def test_a_peer_that_speaks_another_protocol_is_named(first: bytes, said: str) -> None:
    """Trial HV: an HTTP request at the TCP port was logged "frame body of 1195725802 bytes is over the limit"."""
    conn = Connection("server")
    conn.receive_data(first)
    with pytest.raises(ProtocolError) as info:
        conn.next_event()
    assert info.value.message.startswith(f"the peer speaks {said}"), info.value.message
    assert info.value.message.endswith("not TinyStore's protocol")
