"""NaN and infinities in published values: refused with ``InvalidError`` naming the channel and the branch, as
SQL and jobs refuse them (JSON has none), before anything is sent; and the CLI prints valid JSON whatever."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinystore
from tinystore import InvalidError
from tinystore.cli import to_json
from tinystore.protocol.channels import PUBLISH, PUBLISH_MANY, Publish, PublishMany, non_finite
from tinystore.protocol.frames import Kind
from tinystore.protocol.messages import encode
from tinystore.server import paths

from ..helpers import open_store
from ..store.raw import RawClient, error_of
from .support import Heard, cli_subscriber, eventually

NAN, INF = float("nan"), float("inf")


@dataclass
class Reading:
    sensor: str
    value: float


def _double(bits: int) -> float:
    """The float64 of these 64 bits (every NaN payload and both infinities among them)."""
    value: float = struct.unpack(">d", struct.pack(">Q", bits))[0]
    return value


def strict_json(line: str) -> Any:
    """Parse ``line`` as JSON proper: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


async def test_publish_refuses_nan_and_infinities_anywhere(any_store: tinystore.Store) -> None:
    store = any_store
    ch = store.channel("ev")
    heard = Heard()
    sub = await ch.under(7).subscribe(heard.on_message)
    for value, where in (
        (NAN, "nan"),
        (INF, "inf"),
        (-INF, "-inf"),
        ([1, 2.5, {"a": [0.0, NAN]}], "(at $[2].a[1])"),
        ({"deep": {"x": -INF}}, "(at $.deep.x)"),
    ):
        with pytest.raises(InvalidError) as err:
            await ch.under(7).publish(value)
        assert "channel ev: branch ['7']" in err.value.message and where in err.value.message, err.value.message
    with pytest.raises(InvalidError, match=r"^channel ev: the value cannot be published: nan"):
        await ch.publish({"x": NAN})
    typed = store.channel("readings", Reading)
    with pytest.raises(InvalidError, match=r"channel readings: branch \['a', 'b'\].*nan"):
        await typed.under("a", "b").publish(Reading("s1", NAN))
    # finite floats go through, and nothing refused was published
    await ch.under(7).publish({"x": 1.5, "y": [-0.0, 1e300]})
    await eventually(lambda: len(heard.values) == 1)
    await asyncio.sleep(0.05)
    assert heard.values == [{"x": 1.5, "y": [-0.0, 1e300]}]
    await sub.stop()


async def test_a_transaction_publish_refuses_nan(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a int);")])
    ch = any_store.channel("ev")

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t values (1)")
        with pytest.raises(InvalidError, match=r"channel ev: branch \['9'\]"):
            await tx.with_(ch).under(9).publish([INF])
        await tx.with_(ch).under(9).publish([1.0])

    await db.tx(fn)
    assert await db.scalar("select count(*) from t") == 1


async def test_the_server_refuses_nan_from_a_client_that_did_not_check(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "s") as store:
        raw = await RawClient.open(("unix", paths.socket_path(tmp_path / "s")))
        try:
            assert (await raw.hello()).kind is Kind.WELCOME
            nan64 = encode({"x": NAN})
            nan32 = b"\x91\xca" + struct.pack(">f", NAN)  # a float32, which msgspec never writes
            for stream, payload in ((1, nan64), (2, nan32)):
                err = error_of(await raw.call(stream, PUBLISH, encode(Publish("ev", ["3"], payload))))
                assert err.code == "invalid" and "channel ev: branch ['3']" in err.message, err.message
            # all or nothing: a good item with a bad one publishes neither
            good = Publish("ev", ["3"], encode({"x": 1.0}))
            many = PublishMany([good, Publish("ev", ["4"], nan64)])
            err = error_of(await raw.call(3, PUBLISH_MANY, encode(many)))
            assert err.code == "invalid" and "branch ['4']" in err.message
            f = await raw.call(4, PUBLISH, encode(good))
            assert f.kind is Kind.RESPONSE and msgspec.msgpack.decode(f.body)[0] == 1  # seq 1: nothing before it
        finally:
            await raw.close()
        assert (await store.status())["pid"] > 0


def test_non_finite_is_cheap_without_a_float_marker() -> None:
    assert non_finite(encode({"kind": "message", "id": 1, "text": "hello"})) is None
    assert non_finite(encode({"f": 0.5})) is None
    assert non_finite(encode("\u00cb\u00ca")) is None  # the marker bytes inside a string: decoded, nothing found
    assert non_finite(b"\xcb\xcb") is None  # not MessagePack: not for this to judge
    assert non_finite(encode({"a": [NAN]})) == "nan is not a JSON number (at $.a[0])"


@settings(max_examples=500, deadline=None)
@given(
    f=st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, (1 << 64) - 1).map(_double),
    f32=st.integers(0, (1 << 32) - 1),
    around=st.lists(st.integers(-(1 << 63), (1 << 64) - 1) | st.text() | st.binary(), max_size=4),
)
def test_non_finite_finds_every_nan_and_infinity(f: float, f32: int, around: list[Any]) -> None:
    payload = encode([*around, {"x": f}, *around])
    assert (non_finite(payload) is not None) == (not math.isfinite(f)), (f, payload)
    single = struct.unpack(">f", struct.pack(">I", f32))[0]
    payload = b"\x92\xa1x\xca" + struct.pack(">I", f32)  # a float32, as another client may write it
    assert (non_finite(payload) is not None) == (not math.isfinite(single)), (single, payload)


def test_cli_json_is_valid_with_nan_and_infinities() -> None:
    line = to_json({"value": {"a": [1.5, NAN, INF, -INF]}, "branch": ["7"]})
    assert strict_json(line) == {"value": {"a": [1.5, None, None, None]}, "branch": ["7"]}
    assert strict_json(to_json({"id": "1-1", "value": 2.5})) == {"id": "1-1", "value": 2.5}
    # a key JSON has no text for (from a client that did not check) is printed as its JSON text, not skipped (trial FH)
    line = to_json({"value": {(1, 2): "t", "n": NAN}, "branch": []})
    assert strict_json(line) == {"value": {"[1, 2]": "t", "n": None}, "branch": []}


async def test_cli_subscribe_prints_valid_json_and_publish_refuses_nan(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:  # serves its socket: the CLI connects to it
        directory = str(store.directory)
        async with cli_subscriber(store, "ev/7") as listener:
            # a message holding a NaN that reached the store past every check (a store of an older version)
            core: Any = store._core
            core.channels.publish("ev", ("7",), encode({"t": NAN, "u": [INF, 1.5]}))
            bad = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "tinystore", "channels", directory, "publish", "ev/7", '{"t": NaN}'],
                capture_output=True,
                text=True,
                timeout=30,
            )
            # (refused as text that is not JSON, a usage error, before anything is sent: trial CR)
            assert bad.returncode == 2 and "NaN is not JSON" in bad.stderr, bad.stderr
            assert listener.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(listener.stdout.readline), 20)
            got = strict_json(line)
            assert got["value"] == {"t": None, "u": [None, 1.5]} and got["seq"] == 1
