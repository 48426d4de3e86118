"""Bad input to tinystore.sse gets an InvalidError naming what was wrong, at the call: an ``event`` of
event_stream that is neither a str nor a function, a NaN or an infinity in the data (never written as
``null``), a data, event or id of encode_event and send that is not a str; an event function that returns
something other than a str is logged saying so, and its message counts as missed in a reload."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tinystore
import tinystore.sse
from tinystore.sse import encode_event, encode_json, event_stream, sse_response

from ..helpers import open_store
from .harness import client, open_sse, serve

NAN, INF = math.nan, math.inf


def a_request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})


async def test_event_stream_refuses_an_event_that_is_not_a_str_nor_a_function(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        branch = store.channel("events", dict).under(1)
        for bad, kind in ((5, "an int"), (b"token", "a bytes"), (["token"], "a list")):
            with pytest.raises(tinystore.InvalidError, match=f"event_stream: event must be a str, .* got {kind}"):
                event_stream(branch, a_request(), event=bad)  # type: ignore[arg-type]
        with pytest.raises(tinystore.InvalidError, match="event field 'a\\\\nb' holds a line break"):
            event_stream(branch, a_request(), event="a\nb")
        with pytest.raises(tinystore.InvalidError, match=r"event_stream: data must be a function .* got an int"):
            event_stream(branch, a_request(), data=5)  # type: ignore[arg-type]
        # what is allowed: a str, a function, None
        for good in ("token", lambda m: "token", None):
            event_stream(branch, a_request(), event=good)


# contract: SSE-01
@pytest.mark.parametrize(
    ("value", "where"),
    [
        (NAN, "nan is not a JSON number"),
        (INF, "inf is not a JSON number"),
        ({"x": [1, None, -INF]}, r"-inf is not a JSON number \(at \$\.x\[2\]\)"),
        ({"a": None, "b": NAN}, r"nan is not a JSON number \(at \$\.b\)"),
        ({"s": "a\ud800b", "n": INF}, r"inf is not a JSON number \(at \$\.n\)"),  # the lone-surrogate way
    ],
)
def test_encode_json_refuses_a_nan_or_an_infinity_rather_than_writing_null(value: Any, where: str) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"sse: the data does not encode as JSON: {where}"):
        encode_json(value)


# contract: SSE-01
def test_encode_json_still_writes_none_as_null_and_finite_floats() -> None:
    @dataclass
    class Reading:
        value: float | None

    class S(msgspec.Struct):
        value: float

    assert json.loads(encode_json({"a": None, "b": [1.5, None]})) == {"a": None, "b": [1.5, None]}
    assert json.loads(encode_json(Reading(None))) == {"value": None}
    assert json.loads(encode_json("null")) == "null"
    assert json.loads(encode_json({"s": "a\ud800b", "n": None})) == {"s": "a\ud800b", "n": None}
    assert json.loads(encode_json(S(2.5))) == {"value": 2.5}
    with pytest.raises(tinystore.InvalidError, match=r"nan is not a JSON number \(at \$\.value\)"):
        encode_json(Reading(NAN))
    with pytest.raises(tinystore.InvalidError, match=r"inf is not a JSON number \(at \$\.value\)"):
        encode_json(S(INF))


# contract: SSE-01
def test_encode_event_names_a_field_that_is_not_a_str() -> None:
    with pytest.raises(tinystore.InvalidError, match="sse: the data of an event must be a str or None, got an int"):
        encode_event(5)  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: the data of an event must be a str or None, got a bytes"):
        encode_event(b"x")  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: the event field must be a str or None, got an int"):
        encode_event("x", event=5)  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: the id field must be a str or None, got an int"):
        encode_event("x", id=5)  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: the id field must be a str or None, got a bool"):
        encode_event("x", id=True)  # type: ignore[arg-type]
    assert encode_event("x", event="t", id="1-2") == b"event: t\nid: 1-2\ndata: x\n\n"


# contract: SSE-01
async def test_send_refuses_a_bad_event_id_or_a_nan_before_queueing_anything() -> None:
    errors: list[str] = []

    async def producer(send: Any, closed: asyncio.Event) -> None:
        for kw in ({"event": 5}, {"id": 7}, {"data": {"x": NAN}}):
            args = {"data": "x", **kw}
            try:
                send(args.pop("data"), **args)
            except Exception as exc:  # what a producer sees
                errors.append(f"{type(exc).__name__}: {exc}")
        await send({"ok": True}, event="done", id="1")

    async def endpoint(request: Request) -> Response:
        return sse_response(request, producer)

    app = Starlette(routes=[Route("/s", endpoint)])
    async with serve(app) as url, client() as http, open_sse(http, f"{url}/s") as sse:
        ev = await sse.next()
        assert (ev.type, json.loads(ev.data), ev.last_event_id) == ("done", {"ok": True}, "1")
        assert await sse.ended()
    assert errors == [
        "InvalidError: sse: the event field must be a str or None, got an int",
        "InvalidError: sse: the id field must be a str or None, got an int",
        "InvalidError: sse: the data does not encode as JSON: nan is not a JSON number (at $.x)",
    ]


# contract: SSE-03
async def test_an_event_function_returning_an_int_is_logged_and_counted_in_a_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        branch = store.channel("events", dict).under(1)

        async def endpoint(request: Request) -> Response:
            own = request.query_params.get("own") == "1"
            return event_stream(branch, request, event=lambda m: m.value["kind"], shared=not own)

        app = Starlette(routes=[Route("/s", endpoint)])
        async with serve(app) as url, client() as http:
            for path in ("/s", "/s?own=1"):  # a shared stream, and one with a subscription of its own
                caplog.clear()
                async with open_sse(http, f"{url}{path}") as sse:  # subscribed before its headers went out
                    bad = await branch.publish({"kind": 5})
                    good = await branch.publish({"kind": "token"})
                    first, second = await sse.next(), await sse.next()
                    assert first.type == "reload" and first.last_event_id == bad
                    assert json.loads(first.data) == {"kind": "reload", "reason": "error", "missed": 1}
                    assert (second.type, second.last_event_id) == ("token", good)
                logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                assert any(
                    f"message {bad} cannot be sent: the event function returned int, not str" in m for m in logged
                ), logged


def test_headers_and_max_pending_of_the_wrong_type_are_refused_at_the_call() -> None:
    def producer(send: Any, closed: asyncio.Event) -> None:
        return None

    with pytest.raises(tinystore.InvalidError, match="sse: headers must be a mapping of str to str, got an int 5"):
        sse_response(a_request(), producer, headers=5)  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: headers must be a mapping of str to str, got a dict"):
        sse_response(a_request(), producer, headers={"x-n": 5})  # type: ignore[dict-item]
    with pytest.raises(tinystore.InvalidError, match="sse: max_pending must be an int of 1 or more"):
        tinystore.sse.EventSourceResponse(producer, max_pending="1MiB")  # type: ignore[arg-type]
    with pytest.raises(tinystore.InvalidError, match="sse: max_pending must be an int of 1 or more"):
        tinystore.sse.EventSourceResponse(producer, max_pending=0)
    response = sse_response(a_request(), producer, headers={"x-n": "5"})
    assert response.headers["x-n"] == "5"
