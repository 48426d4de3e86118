"""next_frames gives the same frames and the same errors as next_event, however the bytes are cut."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinystore.errors import ProtocolError
from tinystore.protocol.frames import Connection, Frame, Kind, encode_frame


def pair(role, max_inflight=8, max_body=2000):
    c = Connection(role, max_inflight=max_inflight, max_body=max_body)
    if role == "server":
        c.receive_data(encode_frame(Kind.HELLO, 0, "", b""))
        assert isinstance(c.next_event(), Frame)
        c.send_welcome(b"")
    else:
        c.receive_data(encode_frame(Kind.WELCOME, 0, "", b""))
        assert isinstance(c.next_event(), Frame)
    return c


def slow(c, chunks):
    out = []
    try:
        for ch in chunks:
            for x in list(c.inflight):
                if x % 3 == 0:
                    c.finished(x)
            c.receive_data(ch)
            while True:
                ev = c.next_event()
                if not isinstance(ev, Frame):
                    break
                out.append((ev.kind, ev.flags, ev.stream, ev.method, ev.body))
    except ProtocolError as e:
        return out, e.message
    return out, None


def fast(c, chunks):
    out = []
    try:
        for ch in chunks:
            for x in list(c.inflight):
                if x % 3 == 0:
                    c.finished(x)
            c.receive_data(ch)
            while True:
                fs = c.next_frames()
                if not fs:
                    break
                for f in fs:
                    out.append(f)
    except ProtocolError as e:
        return out, e.message
    return out, None


frame_st = st.one_of(
    st.builds(
        lambda k, s, m, b, fl: encode_frame(k, s, m, b, fl),
        st.sampled_from(list(Kind)),
        st.integers(0, 20),
        st.sampled_from(["", "a", "sql.query"]),
        st.binary(max_size=50),
        st.integers(0, 1),
    ),
    st.binary(max_size=30),
    st.builds(
        lambda n, k, s, ml: struct.pack(">IBBIB", n, k, 0, s, ml),
        st.integers(0, 3000),
        st.integers(0, 10),
        st.integers(0, 5),
        st.integers(0, 255),
    ),
)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(frame_st, max_size=12),
    st.lists(st.integers(1, 60), max_size=10),
    st.sampled_from(["server", "client"]),
    st.booleans(),
)
def test_same(parts, cuts, role, eof):
    data = b"".join(parts)
    chunks = []
    i = 0
    for c in cuts:
        chunks.append(data[i : i + c])
        i += c
    chunks.append(data[i:])
    chunks = [c for c in chunks if c]
    if eof:
        chunks.append(b"")
    # ignore the inflight check difference: processing order is identical
    a = slow(pair(role), chunks)
    b = fast(pair(role), chunks)
    assert a == b


def test_big_frame_in_pieces():
    c = pair("server", max_body=1 << 22)
    data = encode_frame(Kind.REQUEST, 1, "m", b"x" * (1 << 21)) + encode_frame(Kind.REQUEST, 2, "m", b"y")
    got = []
    for i in range(0, len(data), 7000):
        c.receive_data(data[i : i + 7000])
        got += c.next_frames()
    assert [(g[2], len(g[4])) for g in got] == [(1, 1 << 21), (2, 1)]
