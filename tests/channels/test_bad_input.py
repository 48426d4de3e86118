"""Bad input to channels that Python itself would trip on: a value that holds itself or nests too deeply, an
``on_missed`` of ``each`` that is not callable. Each is an ``InvalidError`` naming the channel, at once, in
every mode; nothing is published."""

from __future__ import annotations

import asyncio
import collections
import datetime
import enum
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, NamedTuple, TypedDict, TypeVar

import msgspec
import pytest

import tinystore
from tinystore import InvalidError, LimitError
from tinystore.client import channels as client_channels
from tinystore.protocol.channels import non_finite

from ..helpers import open_store


@dataclass
class Box:
    items: list[Any]


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    cur = top
    for _ in range(depth):
        inner: list[Any] = []
        cur.append(inner)
        cur = inner
    return top


async def test_a_value_that_holds_itself_or_nests_too_deeply_is_invalid_naming_the_channel(
    store: tinystore.Store,
) -> None:
    itself: list[Any] = []
    itself.append(itself)
    heard: list[Any] = []
    sub = await store.channel("c").subscribe(lambda m: heard.append(m.value))
    for value in (itself, _nested(1200), {"a": _nested(5000)}):
        with pytest.raises(InvalidError, match=r"^channel c: the value does not encode: it holds itself, or nests"):
            await store.channel("c").publish(value)
    typed = store.channel("boxes", Box)
    with pytest.raises(InvalidError, match=r"^channel boxes: the value does not encode"):
        await typed.under(1).publish(Box(items=_nested(1200)))
    await store.channel("c").publish("after")  # the channel goes on; nothing of the refused ones was published
    for _ in range(500):
        if heard:
            break
        await asyncio.sleep(0.01)
    await sub.stop()
    assert heard == ["after"]


async def test_a_value_not_of_a_type_with_arguments_names_the_type_whole(store: tinystore.Store) -> None:
    # (it was "the value is not a dict", of a dict whose keys were not ints)
    with pytest.raises(InvalidError, match=r"^channel c: the value is not a dict\[int, str\]: Expected `int`"):
        await store.channel("c", dict[int, str]).publish({"a": "x"})  # type: ignore[dict-item]
    with pytest.raises(InvalidError, match=r"^channel c: the value is not a list\[int\]: "):
        await store.channel("c", list[int]).publish(["a"])  # type: ignore[list-item]
    # (trial GF: a Literal's dotted text lost its dots, "Literal['v1', 'v1']")
    with pytest.raises(InvalidError, match=r"^channel c: the value is not a Literal\['api\.v1', 'api\.v2'\]: "):
        await store.channel("c", Literal["api.v1", "api.v2"]).publish("api.v3")


async def test_each_refuses_an_on_missed_that_is_not_callable_at_once(store: tinystore.Store) -> None:
    ch = store.channel("c").under(1)
    for bad in (7, "x"):
        with pytest.raises(InvalidError, match=rf"^channel c: each: on_missed {bad!r} is not callable"):
            ch.each(on_missed=bad)  # type: ignore[arg-type]
    assert (await store.status())["channels"]["subscriptions"] == 0


def test_a_payload_nested_too_deeply_to_check_is_told_not_raised() -> None:
    nan = msgspec.msgpack.encode(float("nan"))
    assert non_finite(b"\x91" * 200_000 + nan) == "it nests too deeply to be read"
    assert non_finite(b"\x91" * 10 + nan) == "nan is not a JSON number (at $[0][0][0][0][0][0][0][0][0][0])"


async def test_a_publish_many_past_its_item_limit_is_refused_unread(tmp_path: Path) -> None:
    """Trial DG: 1.5 million messages in one channels.publish_many (under the 16 MiB frame limit) kept the server's
    loop, and every other client, waiting some 6 s. Past PUBLISH_MANY_MAX it is refused, and nothing published."""
    from tinystore.protocol.channels import PUBLISH_MANY_MAX, Publish, PublishMany

    async with open_store("private", tmp_path / "s") as store:
        got: list[Any] = []
        sub = await store.channel("c").under("7").subscribe(lambda m: got.append(m.value))
        try:
            item = Publish("c", ["7"], msgspec.json.encode(1))
            with pytest.raises(InvalidError, match=r"channels.publish_many: Expected `array` of length <= 10000"):
                await store._call("channels.publish_many", PublishMany([item] * (PUBLISH_MANY_MAX + 1)), Any)
            await store.channel("c").under("7").publish(2)
            for _ in range(500):
                if got:
                    break
                await asyncio.sleep(0.01)
            assert got == [2]  # none of the refused call's
            done = await store._call("channels.publish_many", PublishMany([item] * PUBLISH_MANY_MAX), Any)
            assert len(done) == PUBLISH_MANY_MAX
        finally:
            await sub.stop()


async def test_calls_past_their_item_limits_are_refused_unread(tmp_path: Path) -> None:
    """Trial DJ: one frame of 5 million channel grants, 4 million job renewals or 15 million SQL parameters kept
    the server's loop, and every other client, waiting up to 2.6 s. Past their limits they are refused as the
    body is read."""
    from tinystore.protocol.channels import GRANT_MANY_MAX, Grant, GrantMany
    from tinystore.protocol.jobs import RENEW_MAX, Attempt, Renew
    from tinystore.protocol.sql import PARAMS_MAX, Query

    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        with pytest.raises(InvalidError, match=r"channels.grant_many: Expected `array` of length <= 10000"):
            await store._call("channels.grant_many", GrantMany([Grant(1, 1)] * (GRANT_MANY_MAX + 1)), Any)
        with pytest.raises(InvalidError, match=r"jobs.renew: Expected `array` of length <= 10000"):
            await store._call("jobs.renew", Renew(queue="q", attempts=[Attempt("x", 1)] * (RENEW_MAX + 1)), Any)
        with pytest.raises(InvalidError, match=r"database app: too many SQL variables \(250,001 parameters"):
            await store._call("sql.query", Query("app", "select 1", [1] * (PARAMS_MAX + 1)), Any)
        assert await db.scalar("select 1") == 1  # the connection goes on


@dataclass
class _Box:
    inner: dict[Any, Any]


class _Holder(msgspec.Struct):
    inner: dict[Any, Any]


@dataclass
class _Plain:
    kind: str


@dataclass
class _Wider(_Plain):
    extra: dict[Any, Any]


class _PlainStruct(msgspec.Struct):
    kind: str


class _PlainDict(TypedDict):
    kind: str


class _Key(enum.Enum):
    NONE = None
    TEXT = "t"


# contract: CHAN-07
async def test_a_dict_key_no_json_object_has_is_refused_at_publish(store: tinystore.Store) -> None:
    # trial EZ: {(1, 2): "t"} was published on a channel without a type; it arrived with a tuple key, and no web page
    # could be sent it (the SSE stream told a reload instead)
    heard: list[Any] = []
    ch = store.channel("any")
    sub = await ch.subscribe(lambda m: heard.append(m.value))
    for value, key in (
        ({(1, 2): "t"}, "(1, 2)"),
        ({"a": [{None: 1}]}, "None"),
        ([{"b": {True: 1}}], "True"),
        ({"c": ({frozenset(): 1},)}, "frozenset()"),
        # (trial FF: a dict's subclass, a dataclass's or a Struct's field, an Enum key whose value is None)
        (collections.OrderedDict({None: 1}), "None"),
        ({"a": collections.defaultdict(int, {(1, 2): 3})}, "(1, 2)"),
        (collections.Counter({True: 2}), "True"),
        (_Box({None: 1}), "None"),
        ([_Holder({(1,): 2})], "(1,)"),
        ({_Key.NONE: 1}, "None"),
    ):
        want = rf"^channel any: the value does not encode: a dict key {re.escape(key)} is not"
        with pytest.raises(InvalidError, match=want):
            await ch.publish(value)
    # so does a channel whose type may hold such a key (trial FH: dict, Any, a Struct's dict field took {None: 1})
    for typed, value in (
        (dict, {None: 1}),
        (Any, {"a": {(1, 2): "t"}}),
        (dict[Any, int], {True: 1}),
        (_Holder, _Holder({None: 2})),
        (list[_Box], [_Box({"ok": 1}), _Box({(1,): 2})]),
    ):
        with pytest.raises(InvalidError, match=r"^channel any: the value does not encode: a dict key"):
            await store.channel("any", typed).publish(value)
    # and a typed channel whose type holds no dict: its decode passes over fields it does not name, which untyped
    # listeners, the CLI and browsers get (trial FQ)
    for typed, value in (
        (_Plain, {"kind": "k", "extra": {None: 1, (1, 2): 2}}),
        (_PlainStruct, {"kind": "k", "x": [{True: 1}]}),
        (_Plain, _Wider("k", {(1, 2): 3})),
        (_PlainDict, {"kind": "x", "e": {None: 1}}),
    ):
        with pytest.raises(InvalidError, match=r"^channel any: the value does not encode: a dict key"):
            await store.channel("any", typed).publish(value)
    await store.channel("keyed", dict[int, str]).publish({1: "a"})  # (a type with text or number keys only)
    await ch.publish({1: "number keys", "b": b"x", "c": [1, (2, {"d": 3})]})  # JSON writes these keys as text
    await ch.publish(_Box(collections.OrderedDict({_Key.TEXT: 1, uuid.UUID(int=1): _Holder({"x": 2})})))
    for _ in range(500):
        if len(heard) == 2:
            break
        await asyncio.sleep(0.01)
    assert heard == [
        {1: "number keys", "b": b"x", "c": [1, [2, {"d": 3}]]},
        {"inner": {"t": 1, "00000000-0000-0000-0000-000000000001": {"inner": {"x": 2}}}},
    ]
    await sub.stop()


# contract: CHAN-07
async def test_keys_that_are_one_once_written_as_text_bytes_keys_and_extensions_are_refused(
    store: tinystore.Store,
) -> None:
    # trial FQ: {1: "a", "1": "b"} reached a browser as {"1":"a","1":"b"}, whose JSON.parse kept "b" alone; a bytes key
    # was hex in the CLI and base64 in an SSE stream; a msgspec.msgpack.Ext was published, and no browser could get it
    ch = store.channel("any")
    for value, want in (
        ({1: "a", "1": "b"}, "the dict keys 1 and '1' are the same once written as JSON text ('1')"),
        ({"x": [{"1.5": 3, 1.5: 2}]}, "the dict keys '1.5' and 1.5 are the same"),
        (_Box({2: "a", "2": "b"}), "the dict keys 2 and '2' are the same"),
        ({b"ab": 1}, "a dict key b'ab' is not text or a number"),
        (msgspec.msgpack.Ext(5, b"abc"), "a msgspec.msgpack.Ext is not a JSON value"),
        ({"k": [msgspec.msgpack.Ext(1, b"")]}, "a msgspec.msgpack.Ext is not a JSON value"),
        (msgspec.Raw(b"\xc1"), "it does not read back"),
        # (trial FS: keys of other types are text once written too)
        ({uuid.UUID(int=1): "a", "00000000-0000-0000-0000-000000000001": "b"}, "two keys of a dict are the same"),
        ({_Key.TEXT: 1, "t": 2}, "two keys of a dict are the same once written as JSON text ('t')"),
        ([{datetime.date(2020, 1, 1): 1, "2020-01-01": 2}], "two keys of a dict are the same"),
        ({datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC): 1, "2020-01-01T00:00:00Z": 2}, "two keys of a dict"),
        (_Box({datetime.time(1, 2): 1, "01:02:00": 2}), "two keys of a dict are the same"),
        # (trial FX: at +01:00 as the publisher wrote it, UTC as listeners read it)
        (
            {
                datetime.datetime(2020, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))): 1,
                "2020-01-01T00:00:00Z": 2,
            },
            "two keys of a dict are the same once written as JSON text ('2020-01-01T00:00:00Z')",
        ),
    ):
        with pytest.raises(InvalidError, match=rf"^channel any: the value does not encode: {re.escape(want)}"):
            await ch.publish(value)
    await ch.publish({1: "a", "2": "b", 3.5: "c"})  # (keys of numbers and text that differ as text)
    at = datetime.datetime(2020, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    await ch.publish({at: 1, "2020-01-01T01:00:00Z": 2})
    await ch.publish({uuid.UUID(int=1): "a", "b": _Box({_Key.TEXT: 1, "u": 2})})
    # a typed channel's fields its type does not name are looked at too
    with pytest.raises(InvalidError, match="two keys of a dict are the same"):
        await store.channel("any", _Plain).publish(_Wider("k", {_Key.TEXT: 1, "t": 2}))


# contract: CHAN-07
async def test_a_value_over_the_message_limit_is_refused_before_it_is_looked_through(
    store: tinystore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trial FQ: a value of a million small dicts took seconds of key and NaN checks (pure Python, on the loop)
    # before its size refused it
    def looked(*args: Any) -> None:
        raise AssertionError("looked through")

    monkeypatch.setattr(client_channels, "_not_json", looked)
    monkeypatch.setattr(client_channels, "non_finite", looked)
    with pytest.raises(LimitError, match="over the limit of 65536 bytes"):
        await store.channel("any").publish([{"a": i, "b": 1.5} for i in range(30_000)])


@dataclass
class _Marks:
    marks: dict[datetime.datetime, int]


class _Tagged(msgspec.Struct):
    by_id: dict[uuid.UUID, str] | None = None


class _Row(msgspec.Struct, array_like=True):
    n: int
    marks: dict[datetime.datetime, int]


class _TaggedRow(msgspec.Struct, array_like=True, tag=True):
    n: int
    marks: dict[datetime.datetime, int]


_T = TypeVar("_T")


class _Generic(msgspec.Struct, Generic[_T]):
    v: _T


class _Filtered(msgspec.Struct):
    d: dict[int, int]

    def __post_init__(self) -> None:
        self.d = {k: v for k, v in self.d.items() if v}


class _KindA(msgspec.Struct, tag=True):
    marks: dict[datetime.datetime, int]


class _KindB(msgspec.Struct, tag=True):
    n: int


class _Pair(NamedTuple):
    n: int
    marks: dict[datetime.datetime, int]


class _Filled(msgspec.Struct):
    d: dict[int, str] = {}

    def __post_init__(self) -> None:
        self.d = {1: "a", 2: "b"}


class _StructKey(msgspec.Struct, frozen=True):
    x: int


# contract: CHAN-07
async def test_keys_that_a_channels_type_reads_as_one_are_refused(store: tinystore.Store) -> None:
    # trial GA: a listener of dict[datetime, int] got one entry of {datetime(2024, 1, 1, tzinfo=UTC): 1,
    # "2024-01-01T01:00:00+01:00": 2}, the other lost without a word
    utc = datetime.UTC
    one = datetime.datetime(2024, 1, 1, tzinfo=utc)
    for type_, value, where in (
        (dict[datetime.datetime, int], {one: 1, "2024-01-01T01:00:00+01:00": 2}, "$"),
        (dict[datetime.datetime, int], {"2024-01-01T00:00:00Z": 1, "2024-01-01T00:00:00+00:00": 2}, "$"),
        (list[_Marks], [_Marks({one: 1, "2024-01-01T01:00:00+01:00": 2})], "$[0].marks"),  # type: ignore[dict-item]
        (_Tagged, _Tagged({uuid.UUID(int=1): "a", "00000000000000000000000000000001": "b"}), "$.by_id"),  # type: ignore[dict-item]
        # (trial GE: array-like structs, named tuples and unions were not looked into)
        (_Row, _Row(1, {one: 1, "2024-01-01T01:00:00+01:00": 2}), "$.marks"),  # type: ignore[dict-item]
        (_Pair, _Pair(1, {one: 1, "2024-01-01T01:00:00+01:00": 2}), "$.marks"),  # type: ignore[dict-item]
        (_KindA | _KindB | None, _KindA({one: 1, "2024-01-01T01:00:00+01:00": 2}), "$.marks"),  # type: ignore[dict-item]
        (dict[datetime.datetime, int] | int | None, {one: 1, "2024-01-01T01:00:00+01:00": 2}, "$"),
        # (trial GF: a tagged array-like struct, a generic struct in a union, and sets were not looked into)
        (_TaggedRow, _TaggedRow(1, {one: 1, "2024-01-01T01:00:00+01:00": 2}), "$.marks"),  # type: ignore[dict-item]
        (_Generic[dict[datetime.datetime, int]] | None, _Generic({one: 1, "2024-01-01T01:00:00+01:00": 2}), "$.v"),
        (set[datetime.datetime], {one, "2024-01-01T01:00:00+01:00"}, "$"),
    ):
        with pytest.raises(InvalidError, match=rf"two keys \(or set items\) at {re.escape(where)} are one as .* reads"):
            await store.channel("typed", type_).publish(value)
    # a struct's own __post_init__ that fills a dict is no merge, and a key no map may have is refused as such (both
    # raised from inside msgspec: trial GE)
    await store.channel("filled", _Filled).publish({"d": {}})
    await store.channel("filtered", _Filtered).publish({"d": {1: 1, 2: 0}})  # (trial GF: it was refused)
    with pytest.raises(InvalidError, match=r"^channel keys: the value "):
        await store.channel("keys", dict[_StructKey, int]).publish({_StructKey(1): 1})
    with pytest.raises(InvalidError, match=r"^channel keys: the value "):
        await store.channel("keys", tuple[dict[int, str], Any]).publish(({1: "a"}, {_StructKey(1): 1}))
    heard: list[Any] = []
    sub = await store.channel("typed", dict[datetime.datetime, int]).subscribe(lambda m: heard.append(m.value))
    await store.channel("typed", dict[datetime.datetime, int]).publish({one: 1, "2024-01-01T01:00:00Z": 2})  # type: ignore[dict-item]
    for _ in range(500):
        if heard:
            break
        await asyncio.sleep(0.01)
    assert heard == [{one: 1, one + datetime.timedelta(hours=1): 2}]
    await sub.stop()
