"""Framing of server-sent events (SSE-01): what encode_event writes is what a spec-conforming parser reads."""

from __future__ import annotations

import dataclasses
import json
import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinystore import InvalidError
from tinystore.sse import encode_comment, encode_event, encode_json

from .parser import EventStreamParser, parse

TRICKY_LINES = ["data:", "data: x", "id:", "id: 7", ":", ": comment", "event: reload", "retry: 10", "", " ", "\ufeff"]
BREAKS = ["\n", "\r", "\r\n"]


def normalized(text: str) -> str:
    """The spec's parser turns every line break into LF: what EventSource gives for ``text``."""
    return re.sub(r"\r\n|\r|\n", "\n", text)


def no_surrogates(text: str) -> str:
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


lines_text = st.lists(st.one_of(st.text(), st.sampled_from(TRICKY_LINES)), min_size=1, max_size=8).flatmap(
    lambda lines: st.lists(st.sampled_from(BREAKS), min_size=len(lines) - 1, max_size=len(lines) - 1).map(
        lambda breaks: lines[0] + "".join(b + ln for b, ln in zip(breaks, lines[1:], strict=True))
    )
)
any_text = st.one_of(st.text(), lines_text, st.text(alphabet=st.sampled_from(["\r", "\n", ":", "a", " ", "\x00"])))
field_text = st.text().filter(lambda s: "\r" not in s and "\n" not in s)


# contract: SSE-01
@settings(max_examples=400)
@given(
    data=any_text,
    event=st.one_of(st.none(), field_text),
    id=st.one_of(st.none(), field_text.filter(lambda s: "\x00" not in s)),
)
def test_any_text_is_one_event_whose_data_round_trips(data: str, event: str | None, id: str | None) -> None:
    raw = encode_event(data, event=event, id=id)
    raw.decode("utf-8")  # always valid UTF-8
    events = parse(raw)
    assert len(events) == 1
    ev = events[0]
    assert ev.data == no_surrogates(normalized(data))
    assert ev.type == (no_surrogates(event) if event else "message")
    assert ev.last_event_id == (no_surrogates(id) if id is not None else "")


# contract: SSE-01
@settings(max_examples=300)
@given(
    value=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(), any_text),
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(), children, max_size=4)),
        max_leaves=12,
    )
)
def test_json_data_round_trips_exactly(value: object) -> None:
    """send() writes JSON: one data line, and JSON.parse gives back the value with its CRs and lone surrogates."""
    text = encode_json(value)
    raw = encode_event(text, event="message", id="1-1")
    (ev,) = parse(raw)
    assert "\n" not in ev.data
    assert json.loads(ev.data) == value


# contract: SSE-01
@given(chunks=st.lists(st.integers(1, 7), min_size=1, max_size=30), data=any_text)
def test_split_anywhere_parses_the_same(chunks: list[int], data: str) -> None:
    raw = encode_comment("keep-alive") + encode_event(data, event="token", id="5-9") + encode_event("x")
    p = EventStreamParser()
    got = []
    pos = 0
    for n in chunks:
        got += p.feed(raw[pos : pos + n])
        pos += n
    got += p.feed(raw[pos:], final=True)
    assert [e.data for e in got] == [no_surrogates(normalized(data)), "x"]
    assert got[0].type == "token"
    assert got[1].last_event_id == "5-9"  # the id sticks until another one comes


def test_the_exact_bytes() -> None:
    assert encode_event("a\r\nb\rc\nd", event="token", id="1-2") == (
        b"event: token\nid: 1-2\ndata: a\ndata: b\ndata: c\ndata: d\n\n"
    )
    assert encode_event("") == b"data: \n\n"  # an empty string is still one event with empty data
    assert encode_event(" lead") == b"data:  lead\n\n"  # the one space after the colon is eaten, not the data's
    assert encode_event(None, id="") == b"id\n\n"
    assert encode_event("x", retry="1.5s") == b"retry: 1500\ndata: x\n\n"
    assert encode_comment("keep-alive") == b": keep-alive\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"


def test_payload_with_data_and_id_lines_is_one_event() -> None:
    """The report against other SSE servers: embedded newlines and lines starting data:/id:/: stay data."""
    text = "first\ndata: injected\nid: 666\n: not a comment\n\nevent: evil\nretry: 1\nlast"
    (ev,) = parse(encode_event(text, event="message", id="3-4"))
    assert ev.data == text
    assert ev.type == "message"
    assert ev.last_event_id == "3-4"


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\r\nb"])
def test_a_line_break_in_event_or_id_is_refused(bad: str) -> None:
    with pytest.raises(InvalidError, match="line break"):
        encode_event("x", event=bad)
    with pytest.raises(InvalidError, match="line break"):
        encode_event("x", id=bad)


def test_a_nul_in_id_is_refused() -> None:
    with pytest.raises(InvalidError, match="NUL"):
        encode_event("x", id="1\x00")


def test_bom_at_stream_start_is_not_taken_from_data() -> None:
    (ev,) = parse(encode_event("\ufeffx"))
    assert ev.data == "\ufeffx"  # data: comes first, so the BOM is inside the line


def test_json_of_dataclasses_and_structs() -> None:
    @dataclasses.dataclass
    class D:
        kind: str
        id: int

    class S(msgspec.Struct):
        kind: str
        id: int

    assert json.loads(encode_json(D("message", 1))) == {"kind": "message", "id": 1}
    assert json.loads(encode_json(S("token", 2))) == {"kind": "token", "id": 2}
    assert json.loads(encode_json("a\ud800b")) == "a\ud800b"
    with pytest.raises(InvalidError):
        encode_json(object())
