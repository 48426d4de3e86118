"""Channels in the SDK: :class:`Channel`, :class:`Subscription`, :class:`ChannelIterator`, :class:`Message`.

A channel is a name that values of one type are published on; ``under(*owners)`` picks a branch of it.
Publishing encodes the value as MessagePack (as the channel's type encodes it) and hands it to the store;
subscribing registers a position in the branch's log with the store, which then pushes what lies past it,
never more than the subscription's credit (the prefetch window, ``Limits.channel_prefetch``, 64 messages).
The SDK gives credit back in batches as the handler finishes messages (over a connection, the grants of
every subscription of one loop turn go in one ``channels.grant_many`` call), so a slow handler never makes the
store or this process buffer more than the window; what the store's bounded log dropped meanwhile is told
as ``Missed("behind", n)`` with the exact n (CHAN-02).

When the connection drops, every live subscription subscribes again by itself after the last message it
handled, and the next thing it hears is ``Missed("reconnect", n)``: n is exact (0 when nothing was lost)
while the store still holds what was published meanwhile, ``None`` when it restarted (CHAN-04).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import json
import logging
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

import msgspec
import msgspec.inspect

from ..errors import ClosedError, InvalidError, LimitError, TinystoreError
from ..names import a_or_an, check_name, key_text, not_a_type, type_name
from ..protocol.channels import (
    DELIVER,
    FLOAT64,
    GRANT,
    GRANT_MANY,
    GRANT_MANY_MAX,
    MAX_DEPTH,
    PUBLISH,
    PUBLISH_MANY,
    SUBSCRIBE,
    UNSUBSCRIBE,
    After,
    Delivery,
    DeliveryItem,
    Grant,
    GrantMany,
    MessageItem,
    MissedItem,
    Publish,
    Published,
    PublishMany,
    Subscribe,
    Subscribed,
    Unsubscribe,
    malformed_id,
    non_finite,
    non_finite_error,
    parse_id,
)
from . import attempt_guard
from .merged_keys import merged_key, merging_type
from .turns import pass_turn

if TYPE_CHECKING:
    from .sql import SqlTx
    from .store import Store
    from .transport import Transport

__all__ = ["Channel", "ChannelIterator", "Message", "Missed", "Subscription", "TxChannel"]

log = logging.getLogger("tinystore.channels")

T = TypeVar("T")

Handler = Callable[["Message[T]"], Any]
"""A message handler: a plain function or a coroutine function of one :class:`Message`."""
MissedHandler = Callable[["Missed"], Any]
ErrorHandler = Callable[[Exception], Any]
AfterArg = str | Mapping[Any, str] | None
"""A message id, or (recursive subscriptions) a mapping ``{branch: id}``, a branch being a tuple of owners (str or
int) or one owner."""

BATCH_BYTES = 1024 * 1024
"""Publishes of one loop turn go in one call up to this many payload bytes (then a new call starts)."""
BATCH_ITEMS = 1024

Guard = Callable[[str], None]
"""A job's handler's guard (see :mod:`.attempt_guard`)."""
_Batched = tuple[Publish, "asyncio.Future[Published]", Guard | None]
"""A publish of a turn's batch: its request, the future its caller awaits, the guard of its caller (if any)."""

WARN_EVERY = 10.0
"""Seconds between two warnings of one kind from one subscription (the ones in between are counted)."""


class Message(msgspec.Struct, Generic[T], frozen=True):
    """One message of a channel.

    ``value``: the published value, decoded as the channel's type. ``branch``: the branch it was published on,
    as a list of str (``[]`` for the channel itself; ``under(7)`` gives ``["7"]``). ``seq``: its place in its
    branch, one more than the message before it. ``id``: ``"<epoch>-<seq>"``, unique on its branch across
    server restarts; ``subscribe(after=id)`` resumes after it.
    """

    value: T
    branch: list[str]
    seq: int
    id: str


class Missed(msgspec.Struct, frozen=True):
    """Messages a subscription did not get. ``reason``: ``"behind"`` (the branch log dropped them before they
    could be sent: the subscription fell behind, or ``after=`` named a message the log no longer holds) or
    ``"reconnect"`` (the connection dropped and the subscription was made again). ``count``: the exact number
    of messages lost, ``0`` when none was (a reconnect is always told), ``None`` when the store cannot tell
    (it restarted, or the branch was forgotten)."""

    reason: Literal["behind", "reconnect"]
    count: int | None


def _check_recursive(channel: str, call: str, recursive: object) -> None:
    if not isinstance(recursive, bool):
        raise InvalidError(f"channel {channel}: {call}: recursive {recursive!r}: expected True or False")


class _Codec:
    """Encodes and checks values of one channel's type; decodes its payloads."""

    __slots__ = ("check", "decode", "encoder", "limit", "merging", "name", "type")

    def __init__(self, name: str, type_: Any, limit: int) -> None:
        self.name = name
        self.type = type_
        self.limit = limit
        self.encoder = msgspec.msgpack.Encoder()
        try:
            decoder = msgspec.msgpack.Decoder(Any if type_ is None else type_)
            custom = type_ is not None and isinstance(msgspec.inspect.type_info(type_), msgspec.inspect.CustomType)
        except TypeError as exc:
            raise InvalidError(f"channel {name}: {not_a_type(type_, exc)}") from None
        if custom:
            raise InvalidError(
                f"channel {name}: type {type_name(type_)} cannot be carried: use a dataclass, a msgspec Struct, "
                "a TypedDict or a JSON type"
            )
        self.decode = decoder.decode
        self.check = type_ is not None
        # (a type that reads some dict's keys as other than text may make two of them one: see merged_keys)
        self.merging = None if type_ is None else merging_type(type_)

    def encode(self, value: Any, branch: tuple[str, ...] = ()) -> bytes:
        """``value`` as the payload of a message on ``branch``. Raises ``InvalidError`` (it does not encode as
        the channel's type; it holds a NaN or an infinity, a dict key JSON cannot have, keys that are the same once
        written as JSON text, or a MessagePack extension) and ``LimitError`` (over ``channel_message_bytes``; told
        before the rest is looked at)."""
        try:
            data = self.encoder.encode(value)
        except RecursionError:
            raise InvalidError(
                f"channel {self.name}: the value does not encode: it holds itself, or nests too deeply"
            ) from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidError(f"channel {self.name}: the value does not encode: {exc}") from None
        if len(data) > self.limit:
            # (first: trial FQ, the checks below took seconds over a value of megabytes refused here anyway)
            raise LimitError(
                f"channel {self.name}: a message of {len(data)} bytes is over the limit of {self.limit} bytes",
                limit=self.limit,
                wanted=len(data),
            )
        if FLOAT64 in data:  # a float may be there (msgspec writes every float as a float64): look closer
            problem = non_finite(data)
            if problem is not None:
                raise InvalidError(non_finite_error(self.name, branch, problem))
        plain: Any = None  # (data read back as plain MessagePack, once: see merged_keys and _not_json)
        if self.check:
            try:
                typed = self.decode(data)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                raise InvalidError(
                    f"channel {self.name}: the value is not {a_or_an(type_name(self.type))}: {exc}"
                ) from None
            if self.merging is not None:
                plain = _read_back(data)  # (None: a key that does not read back; _not_json says so below; trial GE)
                where = None if plain is None else merged_key(self.merging, typed, plain)
                if where is not None:
                    # (trial GA: {datetime(2024, 1, 1, tzinfo=UTC): 1, "2024-01-01T01:00:00+01:00": 2} reached a
                    # listener of dict[datetime, int] as one entry)
                    raise InvalidError(
                        f"channel {self.name}: the value does not encode: two keys (or set items) at {where} are one "
                        f"as {type_name(self.type)} reads them: its listeners would get one of the two"
                    )
        # every channel, typed too: a typed channel's decode above passes over fields its type does not name (a
        # dict's extra keys, a subclass's fields), which untyped listeners, the CLI and browsers get (trial FQ)
        problem = _not_json(value, data, plain)
        if problem is not None:
            # (trial EZ: {(1, 2): "t"} was published, arrived with a tuple key, and no web page could be sent it)
            raise InvalidError(
                f"channel {self.name}: the value does not encode: {problem} (a channel carries JSON values, whose "
                "object keys are text, and bytes)"
            )
        return data


_KEY_NOT_JSON = (bool, type(None), tuple, list, frozenset, set, bytes, bytearray)
_KEY_JSON = (str, int, float)  # (exactly these types: a subclass, an Enum of them, is looked at once encoded)
_PLAIN = frozenset({str, int, float, bool, type(None), bytes, bytearray})
_decode_any = msgspec.msgpack.Decoder().decode
_Ext = msgspec.msgpack.Ext
_EXT_NOT_JSON = "a msgspec.msgpack.Ext is not a JSON value"
_json_text = msgspec.json.encode
_json_pairs = json.loads


class _Outgoing:
    """The publishes of one call (``channels.publish`` for one, ``channels.publish_many`` for more), as it is sent:
    :meth:`still` is the transport's ``still`` (see ``Transport.call``)."""

    __slots__ = ("items", "request", "single")

    def __init__(self, items: list[_Batched]) -> None:
        self.items = items
        self.single = len(items) == 1
        self.request: Any = self._made()

    def _made(self) -> Any:
        return self.items[0][0] if self.single else PublishMany([r for r, _, _ in self.items])

    def still(self) -> Any:
        """The request to send now: without the publishes of a handler past its lease (each told why), or
        ``False`` when none is left."""
        kept = [b for b in self.items if attempt_guard.passes(b[2], PUBLISH, b[1])]
        if not kept:
            self.items = []
            return False
        if len(kept) != len(self.items):
            self.items = kept
            self.request = self._made()
        return self.request


def _read_back(data: bytes) -> Any:
    """``data`` decoded as plain MessagePack, or None when it does not read back."""
    try:
        return _decode_any(data)
    except (msgspec.DecodeError, RecursionError, TypeError):
        return None


def _not_json(value: Any, data: bytes, decoded: Any = None) -> str | None:
    """What in ``value`` JSON cannot carry as it is, or ``None``: a dict key JSON cannot have (msgspec writes str,
    number, UUID, date and decimal keys as text; not None, a bool, bytes or an array), two keys of one dict that are
    the same once written as text (``1`` and ``"1"``: a browser's ``JSON.parse`` keeps the last), or a MessagePack
    extension. ``data``: ``value`` encoded (MessagePack). Plain dicts, lists and tuples are looked into as they are,
    without recursion (a value may nest as deep as msgspec encodes); anything else (a dict's subclass, a
    dataclass, a Struct, an Enum key: trial FF found each let a None or tuple key through) makes it look at what
    ``data`` decodes to, which is plain."""
    found, unsure = _plain_not_json(value)
    if found is not None or not unsure:
        return found
    if decoded is None:  # (not read back already, for a typed channel's merged keys)
        decoded = _read_back(data)
    if decoded is None:
        # (a key that is a map or an array once encoded, such as a frozen dataclass, cannot be read back as one;
        # nor can a msgspec.Raw that is not MessagePack; None itself is plain, told above)
        return "it does not read back (a dict key that is not text or a number, or a msgspec.Raw that is not valid)"
    found = _plain_not_json(decoded)[0]
    if found is not None:
        return found
    # keys of other types (a UUID, an Enum, a date, a Decimal) are text once written: two may be one there (trial
    # FS: {E.A: 1, "x": 2} reached a browser as {"x":1,"x":2}); what a browser would read is looked at, as the
    # publisher wrote it and as listeners read it (trial FX: a datetime key at +01:00 is UTC once read, the text of
    # a str key beside it; and two keys written as one text are one once read)
    for shown in (value, decoded):
        try:
            _json_pairs(_json_text(shown), object_pairs_hook=_one_each)
        except _SameKey as exc:
            return (
                f"two keys of a dict are the same once written as JSON text ({exc.args[0]!r}): a browser's "
                "JSON.parse would keep the last"
            )
        except (TypeError, ValueError, RecursionError):
            pass  # (not JSON as it is: what it is, the checks above said; a msgspec.Raw holds MessagePack)
    return None


class _SameKey(Exception):
    pass


def _one_each(pairs: list[tuple[str, Any]]) -> None:
    """``object_pairs_hook`` of ``json.loads``: raises :class:`_SameKey` naming a key that comes twice."""
    if len(pairs) > 1:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _SameKey(key)
            seen.add(key)


def _plain_not_json(value: Any) -> tuple[str | None, bool]:
    """As :func:`_not_json` for a value of plain types, and whether ``value`` holds another type (then a key of
    that type, or what is within it, was not looked at)."""
    stack = [value]
    unsure = False
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            texts = False  # a key that is not str: the keys' texts may collide
            for k, item in v.items():
                tk = type(k)
                if tk is not str:
                    if isinstance(k, _KEY_NOT_JSON):
                        return f"a dict key {k!r} is not text or a number", unsure
                    if tk not in _KEY_JSON:
                        unsure = True
                    texts = True
                ti = type(item)
                if ti is dict or ti is list or ti is tuple:
                    stack.append(item)
                elif ti is _Ext:
                    return _EXT_NOT_JSON, unsure
                elif ti not in _PLAIN:
                    unsure = True
            if texts:
                clash = _same_text(v)
                if clash is not None:
                    return clash, unsure
        elif t is list or t is tuple:
            for item in v:
                ti = type(item)
                if ti is dict or ti is list or ti is tuple:
                    stack.append(item)
                elif ti is _Ext:
                    return _EXT_NOT_JSON, unsure
                elif ti not in _PLAIN:
                    unsure = True
        elif t is _Ext:
            return _EXT_NOT_JSON, unsure
        elif t not in _PLAIN:
            unsure = True
    return None, unsure


def _same_text(d: dict[Any, Any]) -> str | None:
    """Two keys of ``d`` (str, int or float; others are looked at once encoded) that JSON writes as the same text,
    named, or ``None``."""
    seen: dict[str, Any] = {}
    for k in d:
        tk = type(k)
        if tk is str:
            text = k
        elif tk is int or tk is float:
            text = _json_text(k).decode()
        else:
            continue
        if text in seen:
            return f"the dict keys {seen[text]!r} and {k!r} are the same once written as JSON text ({text!r})"
        seen[text] = k
    return None


def _branch_parts(name: str, owners: Sequence[object]) -> tuple[str, ...]:
    return tuple(key_text("channel", name, o, "branch part") for o in owners)


class Channel(Generic[T]):
    """A channel (or one of its branches) of a store. Get one with ``store.channel(name, type)``.

    ``name`` matches ``[a-z0-9][a-z0-9_-]{0,63}``; ``type`` is a dataclass, msgspec Struct, TypedDict or plain
    JSON type (``None``: any JSON value); ``branch`` is the tuple of str this object publishes and listens on.
    Creating one raises ``InvalidError`` for a bad name or a type msgspec cannot carry; it sends nothing.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        type: Any = None,
        *,
        _branch: tuple[str, ...] = (),
        _codec: _Codec | None = None,
    ) -> None:
        check_name("channel", name)
        self.store = store
        self.name = name
        self.type = type
        self.branch = _branch
        self._wire_branch = list(_branch)
        self._codec = _codec or _Codec(name, type, store.limits.channel_message_bytes)

    def under(self, *owners: str | int) -> Channel[T]:
        """The branch ``owners`` below this one: ``under(7)`` and ``under("7")`` are one branch, and
        ``ch.under("org-1").under(7)`` is ``ch.under("org-1", 7)``. Each owner is a str or an int, 1 to 256
        characters as text, and a branch has at most 32 parts; anything else raises ``InvalidError``. Sends
        nothing."""
        parts = self.branch + _branch_parts(self.name, owners)
        if len(parts) > MAX_DEPTH:
            raise InvalidError(
                f"channel {self.name}: a branch has at most {MAX_DEPTH} parts; this one would have {len(parts)}"
            )
        return Channel(self.store, self.name, self.type, _branch=parts, _codec=self._codec)

    async def publish(self, value: T) -> str:
        """Publish ``value`` on this branch; returns its message id (``"<epoch>-<seq>"``) once the store has it.

        Never waits for any subscriber (CHAN-02); many publishes may be in flight at once, and those of one
        task are delivered in the order published. Over a connection, a publish made while another is in
        flight goes with the others of its loop turn in one call (at most 1 MiB or 1024 messages a call),
        so concurrent publishers cost the store one request per turn, not one each.

        Raises ``InvalidError`` (the value does not encode as the channel's type, or holds a NaN or an
        infinity anywhere: JSON has none, as SQL and jobs refuse them), ``LimitError`` (its
        encoding is over ``channel_message_bytes``, 64 KiB: ``limit`` and ``wanted`` in bytes) — in both
        cases nothing is published —, ``OutcomeUnknownError`` (the connection dropped before the answer: it
        may have been published), ``ClosedError`` (the store is closed). A cancel before the message was sent
        publishes nothing; a cancel after it was sent may leave it published.
        """
        data = self._codec.encode(value, self.branch)
        req = Publish(self.name, self._wire_branch, data)
        hub = _hub(self.store)
        if hub.local:
            got: Published = await self.store._call(PUBLISH, req, Published, write=True)
            # an embedded publish never waits: a loop of them would never let this process's subscribers run
            # (they would miss what the log cannot hold meanwhile). Every few publishes give the loop a turn.
            hub.unyielded += 1
            if hub.unyielded >= LOCAL_YIELD_EVERY:
                hub.unyielded = 0
                await pass_turn()
            return got.id
        if hub.inflight or hub.batch is not None:
            got = await hub.publish(req, len(data))  # under load: with the others of this loop turn
            return got.id
        hub.inflight += 1  # alone: at once, from this task
        try:
            got = await hub.transport.call(PUBLISH, req, Published, write=True)
        finally:
            hub.inflight -= 1
        return got.id

    def _bind_tx(self, tx: SqlTx) -> TxChannel[T]:
        if tx.db.store is not self.store:
            raise InvalidError(f"channel {self.name}: the transaction belongs to another store")
        return TxChannel(self, tx)

    async def subscribe(
        self,
        handler: Callable[[Message[T]], Any],
        *,
        on_missed: MissedHandler | None = None,
        on_error: ErrorHandler | None = None,
        recursive: bool = False,
        after: AfterArg = None,
    ) -> Subscription[T]:
        """Listen to this branch (and, with ``recursive=True``, every branch below it); returns once the store
        has the subscription: every message published after that reaches ``handler`` in publish order per
        branch, unless told missed (CHAN-01).

        ``handler(message)`` is called with one :class:`Message` at a time, never two at once; it may be a
        coroutine function (awaited before the next message). When it raises, the exception goes to
        ``on_error(exc)`` (or a warning in the log, at most one every 10 s) and the subscription goes on (a
        ``CancelledError`` the handler raises itself goes there as a ``RuntimeError``); a cancel of the
        handler's task from elsewhere than :meth:`Subscription.stop` ends the subscription, with a warning.
        ``on_missed(Missed(reason, count))`` is called, in line with the messages, before the first message
        after a gap; without it a gap is a warning in the log. ``after``: resume after this message id (for a
        recursive subscription also a mapping ``{branch: id}`` with branches as tuples of owners): what the
        store still holds after it is delivered, preceded by ``Missed("behind", n)`` when some was lost
        (``count`` ``None`` when the store cannot tell, e.g. the id is from before a restart).

        Raises ``InvalidError`` (bad ``after``, a handler that is not callable), ``LimitError`` (the store has
        100,000 subscriptions),
        ``ClosedError``, ``UnavailableError``. A cancel while subscribing returns at once; a subscription the
        store makes after all is ended as soon as its answer comes.
        """
        if not callable(handler):
            raise InvalidError(f"channel {self.name}: subscribe: the handler {handler!r} is not callable")
        _check_recursive(self.name, "subscribe", recursive)
        for label, fn in (("on_missed", on_missed), ("on_error", on_error)):
            if fn is not None and not callable(fn):
                raise InvalidError(f"channel {self.name}: subscribe: {label} {fn!r} is not callable")
        hub = _hub(self.store)
        sub: Subscription[T] = Subscription(hub, self, recursive, on_missed, on_error)
        await sub._subscribe(after)
        sub._task = asyncio.get_running_loop().create_task(
            sub._run(handler), name=f"tinystore channel {self.name} subscription"
        )
        return sub

    def each(
        self, *, on_missed: MissedHandler | None = None, recursive: bool = False, after: AfterArg = None
    ) -> ChannelIterator[T]:
        """The messages of this branch as an async iterator: ``async for m in ch.each(): ...``.

        It subscribes on entering ``async with`` (so nothing published after that is missed), else at the first
        turn of the loop (as :meth:`subscribe`, with the same errors); the loop's body is the
        handler: credit goes back to the store as the body asks for the next message. ``on_missed`` is called
        before the first message after a gap (a warning in the log without it). The loop ends when the store
        closes; it raises ``UnavailableError`` (or ``UnauthenticatedError``) when the store will not be reached
        again as things are (its directory gone, its private server stopped, this client's token refused at a
        reconnect). See :class:`ChannelIterator` for how the subscription ends: ``async with ch.each() as it:
        async for m in it: ...`` ends it when the block ends, whatever way it is left. Raises ``InvalidError`` at
        once for an ``on_missed`` that is not callable.
        """
        if on_missed is not None and not callable(on_missed):
            raise InvalidError(f"channel {self.name}: each: on_missed {on_missed!r} is not callable")
        _check_recursive(self.name, "each", recursive)
        return ChannelIterator(self, on_missed, recursive, after)

    def __repr__(self) -> str:
        where = "/".join((self.name, *self.branch))
        return f"<tinystore.Channel {where} {type_name(self.type) if self.type is not None else 'JSON'}>"


class TxChannel(Generic[T]):
    """A channel bound to a SQL transaction (``tx.with_(channel)``): what it publishes is handed over only
    when the transaction commits, and never if it rolls back (CHAN-03)."""

    def __init__(self, channel: Channel[T], tx: SqlTx) -> None:
        self.channel = channel
        self.tx = tx

    def under(self, *owners: str | int) -> TxChannel[T]:
        """The branch ``owners`` below this one, still bound to the transaction (see :meth:`Channel.under`)."""
        return TxChannel(self.channel.under(*owners), self.tx)

    def publish(self, value: T) -> Coroutine[Any, Any, None]:
        """Publish ``value`` when the transaction commits (a coroutine: await it; one never awaited fails the
        transaction, see ``Database.tx``); returns once the store has it, checked.

        Subscribers hear it only after the commit returned, and a subscriber that hears it can read the
        committed rows; a rollback (a raise, a cancel, a timeout, a dropped connection) drops it, and nobody
        hears of it. Raises ``InvalidError`` (the value does not encode as the channel's type, or holds a NaN
        or an infinity; a read-only transaction), ``LimitError`` (over 64 KiB encoded), ``ClosedError`` (the
        transaction ended, or the connection dropped: the transaction is then rolled back). Nothing is kept
        when it raises. A cancel after the call was sent may leave the message waiting for the commit;
        cancelling the transaction's function rolls it back, and the message with it.
        """
        return self.tx._watch(self._publish(value), f"tx.with_(channel {self.channel.name}).publish")

    async def _publish(self, value: T) -> None:
        self.tx._check()
        ch = self.channel
        data = ch._codec.encode(value, ch.branch)
        await ch.store._call(PUBLISH, Publish(ch.name, ch._wire_branch, data, self.tx.id), Any, retry=False)

    def __repr__(self) -> str:
        return f"<tinystore.TxChannel {'/'.join((self.channel.name, *self.channel.branch))} tx {self.tx.id}>"


class ChannelIterator(Generic[T]):
    """What :meth:`Channel.each` returns: an async iterator of the branch's messages, and an async context
    manager that ends its subscription on exit.

    The subscription is made at the first ``__anext__`` and ends with :meth:`aclose`, which ``async with``
    calls on exit (``contextlib.aclosing`` works too); after that the loop ends. Written as
    ``async for m in ch.each(): ...`` (the iterator held by nothing else), a ``break``, an exception or a
    cancel that leaves the loop drops the iterator, and the subscription ends then, at once in CPython
    (reference counting): it stops taking messages in this process at that moment and the store forgets it
    a loop turn later. An iterator that something still holds (a variable, ``it = ch.each()``) keeps the
    subscription alive after a ``break``, until it is closed or dropped: meanwhile up to the prefetch window
    (``channel_prefetch``, 64) of messages wait in this process, the store keeps sending none past that
    window, and what the branch log drops meanwhile is told as ``Missed("behind", n)`` at the next
    ``__anext__``. Two tasks may not wait on one iterator at once (``RuntimeError``).
    """

    __slots__ = ("_after", "_channel", "_closed", "_on_missed", "_opening", "_recursive", "_sub")

    def __init__(self, channel: Channel[T], on_missed: MissedHandler | None, recursive: bool, after: AfterArg) -> None:
        self._channel = channel
        self._on_missed = on_missed
        self._recursive = recursive
        self._after = after
        self._sub: Subscription[T] | None = None
        self._closed = False
        self._opening = False

    @property
    def subscription(self) -> Subscription[T] | None:
        """The subscription, once the first ``__anext__`` made it (its ``last_id``, ``position``, counts)."""
        return self._sub

    def __aiter__(self) -> ChannelIterator[T]:
        return self

    async def __anext__(self) -> Message[T]:
        try:
            sub = self._sub
            if sub is None:
                if self._closed:
                    raise StopAsyncIteration
                sub = await self._open()
            while True:
                item = sub._take()  # no await while messages are buffered
                if type(item) is Message:
                    sub.handled += 1
                    return item
                if item is _EMPTY:
                    await sub._wait()
                elif item is None:
                    if sub._failure is not None:
                        raise sub._failure  # (the store is gone for good, or refuses the token: not a quiet end)
                    raise StopAsyncIteration
                elif isinstance(item, Missed):
                    await sub._tell_missed(item)
                else:
                    assert isinstance(item, InvalidError)
                    await sub._report(item)
        except asyncio.CancelledError as exc:
            why = exc.args
        # A cancel goes on as a new CancelledError raised here, from a frame that holds neither this iterator nor
        # its subscription: the one caught kept them in its traceback, and a task cancelled while it waited here
        # keeps its error (trial EN: a cancelled task not awaited, still held, kept the subscription alive)
        del self, sub
        raise asyncio.CancelledError(*why)

    async def _open(self) -> Subscription[T]:
        if self._opening:
            raise RuntimeError(f"{self!r}: another task is already waiting for its next message")
        self._opening = True
        ch = self._channel
        sub: Subscription[T] = Subscription(_hub(ch.store), ch, self._recursive, self._on_missed, None)
        try:
            await sub._subscribe(self._after)
        finally:
            self._opening = False
        if self._closed:  # closed from elsewhere while subscribing
            await sub.stop()
            raise StopAsyncIteration
        self._sub = sub
        return sub

    async def aclose(self) -> None:
        """End the subscription (the store forgets it; messages received and not handled are dropped) and
        the loop: the next ``__anext__`` raises ``StopAsyncIteration``. Idempotent; never raises for a
        connection that is gone."""
        self._closed = True
        sub = self._sub
        if sub is not None:
            await sub.stop()

    async def __aenter__(self) -> ChannelIterator[T]:
        """Subscribe now: every message published once the block is entered is heard (or told missed)."""
        if self._sub is None and not self._closed:
            await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # dropped while its subscription lives (a break out of ``async for m in ch.each()``): end it now
        sub = getattr(self, "_sub", None)
        if sub is not None and not sub._stopped:
            with contextlib.suppress(Exception):
                sub._abandon()

    def __repr__(self) -> str:
        sub = self._sub
        state = "closed" if self._closed else "not started" if sub is None else f"sub {sub._sid}"
        return f"<tinystore.ChannelIterator {self._channel!r} {state}>"


class _Empty:
    """The type of :data:`_EMPTY`."""


_EMPTY = _Empty()
"""What :meth:`Subscription._take` returns when nothing is buffered."""


class _Warner:
    """At most one warning every :data:`WARN_EVERY` seconds; the ones in between are counted."""

    __slots__ = ("next_at", "suppressed")

    def __init__(self) -> None:
        self.next_at = 0.0
        self.suppressed = 0

    def warn(self, msg: str, *args: object, exc: BaseException | None = None) -> None:
        now = time.monotonic()
        if now < self.next_at:
            self.suppressed += 1
            return
        if self.suppressed:
            msg += f" ({self.suppressed} more like it in the last {WARN_EVERY:g}s)"
        self.suppressed = 0
        self.next_at = now + WARN_EVERY
        log.warning(msg, *args, exc_info=exc)


class Subscription(Generic[T]):
    """A live subscription, as :meth:`Channel.subscribe` returns it. End it with :meth:`stop`.

    ``channel`` is the branch it listens to, ``recursive`` whether it hears the branches below too.
    ``handled`` counts the messages handed to the handler, ``missed`` the messages told missed (the counts of
    the ``Missed`` notices that had one), ``reconnects`` the times it was made again after a dropped
    connection: for every subscription, ``handled + missed`` is the number of messages published to its
    branches since it subscribed (whenever no reconnect had count ``None``). ``last_id`` and ``position``
    (read-only) say where it is in its branch.
    """

    def __init__(
        self,
        hub: _Hub,
        channel: Channel[T],
        recursive: bool,
        on_missed: MissedHandler | None,
        on_error: ErrorHandler | None,
    ) -> None:
        self.channel = channel
        self.recursive = recursive
        self.handled = 0
        self.missed = 0
        self.reconnects = 0
        self.errors = 0
        self._hub = hub
        self._decode = channel._codec.decode
        self._on_missed = on_missed
        self._on_error = on_error
        self._sid = 0  # the store's id of this subscription; 0 while there is none
        self._conn_gen = -1  # the connection it was made on (hub.conn_gen at the time)
        self._buf: collections.deque[DeliveryItem | Missed] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._stopped = False
        self._failure: TinystoreError | None = None  # what ended it, when the store did (see _Hub._on_failed)
        self._task: asyncio.Task[None] | None = None
        self._in_hand = False  # the message last handed out took a credit of the current subscription
        self._owed = 0  # credit earned by finished messages, not granted yet
        self._cut: str | None = None  # a recursive subscription's Subscribed.cut (Subscribe.since on a resume)
        prefetch = hub.prefetch
        self._prefetch = prefetch
        # credit goes back once a quarter of the window is finished: the store never has less than 3/4 of
        # the window minus what is buffered here, so it never stalls, and grants cost one call per batch
        self._batch = max(1, prefetch // 4)
        self._pos: str | None = None  # not recursive: the id just before the next message to handle
        self._last_id: str | None = None  # the id of the last message handed out
        self._last: dict[tuple[str, ...], str] = {}  # recursive: the last id handled per branch
        self._unsure = False  # recursive: a "behind" notice was handled since it last subscribed
        self._copy_branch = hub.local
        self._warner = _Warner()

    # ------------------------------------------------------------------ public

    async def stop(self) -> None:
        """End the subscription: the store forgets it, nothing more is delivered, and messages received but
        not handled yet are dropped. A handler running when ``stop`` is called from elsewhere is cancelled
        (called from inside the handler, the handler finishes and nothing follows). Idempotent; never raises
        for a connection that is gone (the store ends the subscription with the connection anyway). A cancel
        of ``stop`` itself, once it has begun, leaves the subscription ended on this side, and the store told all
        the same, without waiting (before, it stayed in the store until the connection closed, counted against
        the limit, its branch kept). A task of ``stop()`` cancelled before it first ran ran none of it, as any
        coroutine: the subscription goes on; call ``stop`` again."""
        if self._stopped:
            return
        sid = self._stop_local()
        task = self._task
        try:
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
                await asyncio.wait([task])
            if sid and not self._hub.closed:
                await self._hub.unsubscribe(sid)
        except asyncio.CancelledError:
            if sid:
                self._hub.unsubscribe_soon(sid)  # (again, should the call have gone out: an unknown id is ignored)
            raise

    @property
    def active(self) -> bool:
        """True until :meth:`stop` (or the store's close) ended it."""
        return not self._stopped

    @property
    def last_id(self) -> str | None:
        """The id of the last message handed to the handler (or to the ``each()`` loop), from the moment it
        is handed over; ``None`` before the first. A missed notice does not change it."""
        return self._last_id

    @property
    def position(self) -> str | None:
        """Where the subscription is in its branch: the id just before the next message it will handle, which
        ``subscribe(after=position)`` resumes after. It is :attr:`last_id` once a message was handled, moved
        past the messages a ``Missed("behind", n)`` notice counted, and made again by a reconnect; right after
        subscribing, the id just before the first message it will be sent (``seq`` may be one below the
        branch's first). ``None`` for a recursive subscription (it has one position per branch)."""
        return self._pos

    def _abandon(self) -> None:
        """End it without waiting (its ``each()`` iterator was dropped): nothing more is handed out here, and
        the store is told on the next loop turn (at once in embedded mode)."""
        sid = self._stop_local()
        if sid:
            self._hub.unsubscribe_soon(sid)

    def statistics(self) -> dict[str, Any]:
        """Counts: ``handled``, ``missed``, ``reconnects``, ``errors`` (handler exceptions), ``buffered``
        (messages received and not handled yet, at most the prefetch window), ``credit_owed`` (finished
        messages whose credit was not granted yet)."""
        return {
            "handled": self.handled,
            "missed": self.missed,
            "reconnects": self.reconnects,
            "errors": self.errors,
            "buffered": sum(1 for i in self._buf if type(i) is MessageItem),
            "credit_owed": self._owed,
        }

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else f"sub {self._sid}"
        return f"<tinystore.Subscription {self.channel!r} {state} handled {self.handled} missed {self.missed}>"

    # ------------------------------------------------------------------ subscribing

    def _request(self, after: AfterArg, resume: bool) -> Subscribe:
        ch = self.channel
        req = Subscribe(
            channel=ch.name,
            branch=ch._wire_branch,
            recursive=self.recursive,
            credit=self._prefetch,
            resume=resume,
        )
        if after is None:
            return req
        if isinstance(after, str):
            if parse_id(after) is None:
                raise InvalidError(malformed_id(ch.name, after))
            req.after = after
            if self.recursive:
                self._last[ch.branch] = after
            return req
        if not isinstance(after, Mapping):
            raise InvalidError(malformed_id(ch.name, after))
        if not self.recursive:
            raise InvalidError(f"channel {ch.name}: after: a mapping of ids needs recursive=True")
        for key, mid in after.items():
            owners = key if isinstance(key, list | tuple) else (key,)
            parts = _branch_parts(ch.name, owners)
            if parse_id(mid) is None:
                raise InvalidError(malformed_id(ch.name, mid))
            req.after_branches.append(After(list(parts), mid))
            self._last[parts] = mid
        req.resume = True
        return req

    async def _call_subscribe(self, req: Subscribe, *, retry: bool) -> Subscribed:
        """The subscribe call. A cancel does not stop the call itself: a subscription the store makes after all
        is ended as soon as its answer comes (the answer alone tells its id)."""
        hub = self._hub
        hub.subscribing += 1
        call: asyncio.Future[Subscribed] = asyncio.ensure_future(
            hub.transport.call(SUBSCRIBE, req, Subscribed, retry=retry)
        )
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(functools.partial(_end_unwanted, hub))
            raise
        finally:
            hub.subscribing -= 1

    async def _subscribe(self, after: AfterArg) -> None:
        hub = self._hub
        if hub.closed:
            raise ClosedError(f"channel {self.channel.name}: the store is closed")
        req = self._request(after, False)
        got = await self._call_subscribe(req, retry=True)
        # the connection that answered (the call waits out a reconnect and is sent again on the new one): a
        # subscription made there is not made again, which would drop the notice below and count from its start
        gen = hub.conn_gen
        early = hub.take_early(got.sub)
        if hub.closed:
            self._stopped = True
            raise ClosedError(f"channel {self.channel.name}: the store closed while subscribing")
        self._install(got, gen)
        if after is not None and (got.missed is None or got.missed > 0):
            self._buf.append(Missed("behind", got.missed))
        if early:
            self._buf.extend(early)
        hub.live[self] = None

    def _install(self, got: Subscribed, gen: int) -> None:
        if got.credit is not None:
            # a store whose channel_prefetch is below this process's window gives less credit than asked: credit
            # goes back by a quarter of what it gave, or the subscription would wait for ever for a batch
            self._batch = max(1, min(self._prefetch, got.credit) // 4)
        self._sid = got.sub
        self._conn_gen = gen
        if self.recursive:
            self._cut = got.cut  # (what it heard nothing from since then has had nothing for it, when resumed)
            last = self._last
            for a in got.skipped or ():
                last[tuple(a.branch)] = a.id  # past what got.missed counted: not to be counted again
            if got.cut is not None and last:
                # ids of an earlier server run name no place in this one: resumed after them, every later reconnect
                # was told None (trial BE); without them, a branch's count is exact again while nothing was
                # published on it since this subscription was made (``cut``)
                epoch = got.cut.rpartition("-")[0]
                stale = [b for b, mid in last.items() if mid.rpartition("-")[0] != epoch]
                for b in stale:
                    del last[b]
        self._hub.subs[got.sub] = self
        if not self.recursive:
            self._pos = got.start

    async def _resubscribe(self, gen: int) -> None:
        """Subscribe again after a reconnect, after the last message handled; tell ``Missed("reconnect", n)``."""
        hub = self._hub
        # what was received and not handled is dropped: the store sends it again (or counts it as missed)
        old = self._sid
        if old and hub.subs.get(old) is self:
            # (an id of the last connection: the new one may have given the same id to another subscription
            # already, made while this one waited its turn here; that one's entry and credit stay)
            del hub.subs[old]
            hub.grants.pop(old, None)
        self._sid = 0
        # messages received and not handled go (the store sends them again, or counts them); notices this SDK made
        # stay, in order: their counts are of messages before the position it subscribes again after (a "behind"
        # of subscribe(after=...), an earlier "reconnect")
        kept = [item for item in self._buf if type(item) is Missed]
        if self.recursive:
            # a branch whose first messages came and were not handled yet resumes before them: unlisted, the store
            # could not tell what it had heard there (trial BF: told None, and those messages never came again)
            last = self._last
            for item in self._buf:
                if type(item) is MissedItem:
                    # a notice of the store's not told yet: it is dropped with the buffer, and what it counted is
                    # before the messages after it; those branches stay unlisted ("cannot tell": trial BH). (The
                    # SDK's own notices, kept, count only what came before the last position: trial BI)
                    break
                if type(item) is not MessageItem:
                    continue
                if (b := tuple(item.branch)) not in last:
                    last[b] = f"{item.id.rpartition('-')[0]}-{item.seq - 1}"
        self._buf.clear()  # (in place: the delivery loop holds this deque)
        self._buf.extend(kept)
        self._in_hand = False
        self._owed = 0
        if self.recursive:
            ch = self.channel
            req = Subscribe(
                channel=ch.name,
                branch=ch._wire_branch,
                recursive=True,
                credit=self._prefetch,
                after_branches=[After(list(b), mid) for b, mid in self._last.items()],
                resume=True,
                since=self._cut,
            )
        else:
            req = self._request(self._pos, True)
        got = await self._call_subscribe(req, retry=False)
        early = hub.take_early(got.sub)
        if self._stopped or hub.closed:
            if not hub.closed:
                await hub.unsubscribe(got.sub)
            return
        self._install(got, gen)
        count = got.missed
        if self.recursive and self._unsure:
            count = None  # a "behind" notice moved it past ids it cannot name: the store would count twice
        self._unsure = False
        self.reconnects += 1
        self._buf.append(Missed("reconnect", count))
        if early:
            self._buf.extend(early)
        self._wake()
        # (the old id was the last connection's, which ended it: on this one it may name another subscription)

    # ------------------------------------------------------------------ delivery

    def _feed(self, items: list[DeliveryItem]) -> None:
        self._buf.extend(items)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _take(self) -> Message[T] | Missed | InvalidError | _Empty | None:
        """For ``each()``: the next buffered message or missed notice, without waiting; the message handed out
        before it counts as finished. :data:`_EMPTY` when nothing is buffered, ``None`` once stopped, an
        ``InvalidError`` to report for a message that does not decode."""
        if self._in_hand:
            self._in_hand = False
            self._owed += 1
            if self._owed >= self._batch:
                self._grant()
        if self._stopped:
            return None
        buf = self._buf
        if not buf:
            return _EMPTY
        item = buf.popleft()
        if type(item) is not MessageItem:
            return self._missed(item)
        mid = item.id
        self._last_id = mid
        if self.recursive:
            self._last[tuple(item.branch)] = mid
        else:
            self._pos = mid
        self._in_hand = self._sid != 0
        try:
            value = self._decode(item.payload)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            self.errors += 1
            return self._undecodable(mid, exc)
        return Message(value, list(item.branch) if self._copy_branch else item.branch, item.seq, mid)

    async def _wait(self) -> None:
        """Wait until something is buffered or the subscription stopped (one waiter at a time)."""
        if self._waiter is not None:
            raise RuntimeError(f"{self!r}: another task is already waiting for its next message")
        fut = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await fut
        finally:
            self._waiter = None

    def _grant(self) -> None:
        """Give the credit of the finished messages back: with the grants of the other subscriptions of this
        loop turn, in one call (:meth:`_Hub.grant`)."""
        n = self._owed
        sid = self._live_sid()
        if not n or not sid or self._stopped:
            return
        self._owed = 0
        self._hub.grant(sid, n)

    def _live_sid(self) -> int:
        """The store's id of this subscription on the connection now, or 0: an id of an earlier connection (the
        subscription not made again yet) names nothing there, or another subscription."""
        return self._sid if self._conn_gen == self._hub.conn_gen else 0

    async def _run(self, handler: Callable[[Message[T]], Any]) -> None:
        """Hand each message to ``handler``, one at a time. The hot path: the buffered messages of a delivery
        are handled in one go, without an await between them when the handler is a plain function."""
        isawaitable = inspect.isawaitable
        buf = self._buf
        popleft = buf.popleft
        decode = self._decode
        recursive = self.recursive
        copy_branch = self._copy_branch
        batch = self._batch
        last = self._last
        message_item = MessageItem
        loop = asyncio.get_running_loop()
        while not self._stopped:
            if not buf:
                fut = self._waiter = loop.create_future()
                try:
                    await fut
                finally:
                    self._waiter = None
                continue
            item = popleft()
            if type(item) is not message_item:
                await self._tell_missed(self._missed(item))
                continue
            mid = item.id
            self._last_id = mid
            if recursive:
                last[tuple(item.branch)] = mid
            else:
                self._pos = mid
            # its credit is the current subscription's (a reconnect in the handler clears _in_hand)
            self._in_hand = self._sid != 0
            try:
                value = decode(item.payload)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                self.errors += 1
                await self._report(self._undecodable(mid, exc))
            else:
                self.handled += 1
                try:
                    r = handler(Message(value, list(item.branch) if copy_branch else item.branch, item.seq, mid))
                    if r is not None and isawaitable(r):
                        await r
                except Exception as exc:
                    self.errors += 1
                    await self._report(exc)
                except asyncio.CancelledError as exc:
                    if self._stopped:
                        raise  # stop() cancelled it
                    task = asyncio.current_task()
                    self.errors += 1
                    if task is not None and task.cancelling() == 0:
                        # nobody cancelled this task: the handler raised CancelledError itself (or let one of its
                        # own tasks' cancels through): an error like any other, and the subscription goes on
                        await self._report(RuntimeError(f"the handler raised {_describe_cancel(exc)}"))
                    else:
                        # the task was cancelled, not by stop(): by the handler (asyncio.current_task().cancel())
                        # or as the program ends. The subscription ends, said, rather than stay silently dead.
                        self._abandon()
                        self._warner.warn(
                            "%r: the handler's task was cancelled (not by stop()): the subscription ended", self
                        )
                        raise
            if self._in_hand:  # finished: its credit goes back, a batch at a time
                self._in_hand = False
                self._owed += 1
                if self._owed >= batch:
                    self._grant()

    def _missed(self, item: DeliveryItem | Missed) -> Missed:
        """A missed notice out of the buffer, as told: a "behind" one moves the position past what it counts."""
        if type(item) is MissedItem:
            if item.count:
                if self.recursive:
                    if item.skipped is None:
                        self._unsure = True  # a store that does not say where each branch resumes
                    else:
                        for a in item.skipped:
                            self._last[tuple(a.branch)] = a.id
                elif self._pos is not None:
                    self._pos = _advance(self._pos, item.count)
            return Missed(cast('Literal["behind", "reconnect"]', item.reason), item.count)
        assert isinstance(item, Missed)
        return item

    async def _tell_missed(self, m: Missed) -> None:
        if m.count:
            self.missed += m.count
        cb = self._on_missed
        if cb is None:
            self._warner.warn(
                "%r: missed %s messages (%s); pass on_missed= to handle it",
                self,
                "an unknown number of" if m.count is None else m.count,
                m.reason,
            )
            return
        try:
            r = cb(m)
            if inspect.isawaitable(r):
                await r
        except Exception as exc:
            await self._report(exc)

    def _undecodable(self, mid: str, exc: Exception) -> InvalidError:
        """The error for message ``mid``, which does not decode as this subscription's type (``extra["message_id"]``
        names it)."""
        return InvalidError(f"channel {self.channel.name}: message {mid} does not decode: {exc}", message_id=mid)

    async def _report(self, exc: Exception) -> None:
        cb = self._on_error
        if cb is None:
            if isinstance(exc, InvalidError) and "message_id" in exc.extra:  # not the handler's: the message's
                self._warner.warn("%r: %s; the subscription goes on", self, exc.message, exc=exc)
            else:
                self._warner.warn("%r: the handler raised %r; the subscription goes on", self, exc, exc=exc)
            return
        try:
            r = cb(exc)
            if inspect.isawaitable(r):
                await r
        except Exception as again:
            self._warner.warn("%r: on_error raised %r", self, again, exc=again)

    def _stop_local(self) -> int:
        """Mark stopped, leave the hub, wake the reader; returns the store's id to unsubscribe (or 0)."""
        self._stopped = True
        hub = self._hub
        hub.live.pop(self, None)
        sid = self._live_sid()
        if self._sid and hub.subs.get(self._sid) is self:
            del hub.subs[self._sid]
        if sid:
            hub.grants.pop(sid, None)
        self._sid = 0
        self._buf.clear()
        self._wake()
        return sid


def _advance(pos: str, n: int) -> str:
    epoch, _, seq = pos.partition("-")
    return f"{epoch}-{int(seq) + n}"


LOCAL_YIELD_EVERY = 16
"""An embedded publisher gives the event loop a turn every this many publishes (see ``Channel.publish``)."""


def _describe_cancel(exc: asyncio.CancelledError) -> str:
    return f"CancelledError: {exc}" if exc.args else "CancelledError"


def _end_unwanted(hub: _Hub, call: asyncio.Future[Subscribed]) -> None:
    """The answer to a subscribe whose caller was cancelled: end the subscription it made, if it made one."""
    if call.cancelled() or call.exception() is not None:
        return
    hub.unsubscribe_soon(call.result().sub)


class _Hub:
    """The channels side of one store's connection: routes deliveries to subscriptions by the store's id,
    subscribes them again after a reconnect, and stops them when the store closes."""

    def __init__(self, store: Store) -> None:
        self.transport: Transport = store.transport
        self.local = bool(self.transport.local)
        self.prefetch = store.limits.channel_prefetch
        self.subs: dict[int, Subscription[Any]] = {}
        self.live: dict[Subscription[Any], None] = {}
        self.early: dict[int, list[DeliveryItem]] = {}
        self.subscribing = 0
        self.closed = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.sending: set[asyncio.Task[Any]] = set()  # the tasks of publishes (see spawn)
        self.resub_task: asyncio.Task[None] | None = None
        self.orphans: set[int] = set()
        self.batch: list[_Batched] | None = None
        self.batch_bytes = 0
        self.inflight = 0  # publish calls sent and not answered
        self.unyielded = 0  # embedded publishes since the last one that gave the loop a turn
        self.grants: dict[int, int] = {}  # credit to give back at the end of this loop turn, by the store's id
        self.grants_gen = 0  # the connection those ids are of
        self.grant_many = True  # the server knows channels.grant_many (an older one refused it: one call each)
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self.transport.on_push(DELIVER, self._deliver, Delivery)
        self.transport.reconnect_hooks.append(self._on_reconnect)
        self.transport.failed_hooks.append(self._on_failed)
        store._close_hooks.append(self.close)

    def _deliver(self, body: Delivery) -> None:
        s = self.subs.get(body.sub)
        if s is not None and s._conn_gen != self.conn_gen:
            # an id of the last connection, whose subscription is not made again yet: on this one the store may have
            # given it to another (trial EZ: a restarted server's delivery for a new subscription was handled by an
            # old one that held the same id, which then resumed after it, told Missed("reconnect", 0) of what it
            # had lost)
            del self.subs[body.sub]
            s = None
        if s is not None:
            s._feed(body.items)
        elif self.subscribing:
            # the answer to a subscribe in flight may come after its first delivery is read
            self.early.setdefault(body.sub, []).extend(body.items)
        elif not self.closed and body.sub not in self.orphans and len(self.orphans) < 10_000:
            self.orphans.add(body.sub)  # a subscription whose subscribe was cancelled: end it
            self.spawn(self.unsubscribe(body.sub))

    def publish(self, req: Publish, size: int) -> asyncio.Future[Published]:
        """Send ``req`` with the other publishes of this loop turn: one ``channels.publish_many`` call for
        them all (all or none), in the order they were made. (A publish made while no other is in flight is
        sent at once instead, by :meth:`Channel.publish`.)"""
        guard = attempt_guard.CURRENT.get()
        if guard is not None:
            attempt_guard.check(PUBLISH)  # (its caller's: the batch's task is the SDK's own; asked again as it goes)
        fut: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        batch = self.batch
        if batch is None or self.batch_bytes + size > BATCH_BYTES or len(batch) >= BATCH_ITEMS:
            batch = self.batch = []
            self.batch_bytes = 0
            self.spawn(self._send_batch(batch), sends=True)
        batch.append((req, fut, guard))
        self.batch_bytes += size
        return fut

    async def _send_batch(self, batch: list[_Batched]) -> None:
        # runs one loop turn after the batch's first publish: what came in that turn is in it
        if self.batch is batch:
            self.batch = None
        # a publish cancelled before the batch went is not sent (trial IV: it was published all the same); nor one
        # of a job's handler whose attempt went past its lease by then (trial IO: two publishes made before the
        # event loop was blocked for 3 s went out after it), nor as it is written
        out = _Outgoing([b for b in batch if not b[1].done() and attempt_guard.passes(b[2], PUBLISH, b[1])])
        if not out.items:
            return
        still = out.still if any(g is not None for _, _, g in out.items) else None
        self.inflight += 1
        try:
            if out.single:
                got = [await self.transport.call(PUBLISH, out.request, Published, write=True, still=still)]
            else:
                got = await self.transport.call(PUBLISH_MANY, out.request, list[Published], write=True, still=still)
        except attempt_guard.Withdrawn:
            return  # (no item left: each was told why)
        except TinystoreError as exc:
            if len(out.items) > 1 and exc.code not in ("outcome_unknown", "closed", "unavailable"):
                # refused as a whole (nothing of it was published): each on its own, so only the bad one fails
                for req, fut, guard in out.items:
                    if not fut.done():
                        self.spawn(self._send_one(req, fut, guard), sends=True)
                return
            for _, fut, _ in out.items:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException as exc:
            for _, fut, _ in out.items:
                if not fut.done():
                    fut.set_exception(ClosedError(f"channels: the publish was interrupted: {exc!r}"))
            raise
        finally:
            self.inflight -= 1
        for (_, fut, _), published in zip(out.items, got, strict=True):
            if not fut.done():
                fut.set_result(published)

    async def _send_one(self, req: Publish, fut: asyncio.Future[Published], guard: Guard | None = None) -> None:
        out = _Outgoing([(req, fut, guard)])
        if not attempt_guard.passes(guard, PUBLISH, fut):
            return
        try:
            got: Published = await self.transport.call(
                PUBLISH, req, Published, write=True, still=None if guard is None else out.still
            )
        except attempt_guard.Withdrawn:
            return
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, TinystoreError) else ClosedError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        if not fut.done():
            fut.set_result(got)

    def take_early(self, sid: int) -> list[DeliveryItem] | None:
        early = self.early.pop(sid, None)
        if not self.subscribing:
            self.early.clear()
        return early

    def grant(self, sid: int, n: int) -> None:
        """Give ``n`` messages of credit back to subscription ``sid``. Embedded: at once. Over a connection:
        with the grants of every other subscription of this loop turn, in one ``channels.grant_many`` call
        sent on the next turn (so 1,000 subscriptions finishing a batch in one turn cost one call, not 1,000).
        """
        if self.local:
            t: Any = self.transport
            with contextlib.suppress(TinystoreError):
                t.core.invoke(t.session, GRANT, Grant(sid, n))
            return
        grants = self.grants
        if not grants:
            self.grants_gen = self.conn_gen
            self.spawn(self._send_grants())  # its first step runs next turn: it takes what this turn added
        grants[sid] = grants.get(sid, 0) + n

    async def _send_grants(self) -> None:
        grants, self.grants = self.grants, {}
        if not grants or self.closed or self.grants_gen != self.conn_gen:
            return  # (ids of a connection that dropped since: a subscription made again starts with fresh credit)
        items = [Grant(sid, n) for sid, n in grants.items()]
        try:
            if len(items) == 1:
                await self.transport.call(GRANT, items[0], Any, retry=False)
            elif self.grant_many:
                for at in range(0, len(items), GRANT_MANY_MAX):  # (in parts the server takes)
                    part = GrantMany(items[at : at + GRANT_MANY_MAX])
                    await self.transport.call(GRANT_MANY, part, Any, retry=False)
            else:
                await self._grant_each(items)
        except InvalidError as exc:
            if "unknown method" in exc.message and self.grant_many:
                self.grant_many = False  # a server from before channels.grant_many: one call per subscription
                await self._grant_each(items)
            else:  # not expected: the subscriptions it was for may stall until they are made again
                log.error("channels: the server refused a grant of credit: %s", exc)
        except TinystoreError:
            return  # the connection is gone: a subscription made again starts with fresh credit

    async def _grant_each(self, items: list[Grant]) -> None:
        calls = [self.transport.call(GRANT, g, Any, retry=False) for g in items]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException) and not isinstance(r, TinystoreError):
                raise r

    async def unsubscribe(self, sid: int) -> None:
        if not self.transport.connected:
            return  # the store ended it with the connection; a reconnect does not bring a stopped one back
        with contextlib.suppress(TinystoreError):
            await self.transport.call(UNSUBSCRIBE, Unsubscribe(sub=sid), Any, retry=False)

    def unsubscribe_soon(self, sid: int) -> None:
        """End subscription ``sid`` in the store without waiting (from a finalizer too: never raises).
        Embedded: at once; over a connection: the call goes out on the loop's next turn."""
        if self.closed:
            return
        try:
            if self.local:
                t: Any = self.transport
                with contextlib.suppress(TinystoreError):
                    t.core.invoke(t.session, UNSUBSCRIBE, Unsubscribe(sub=sid))
                return
            loop = self.loop
            if loop is None or loop.is_closed():
                return
            loop.call_soon_threadsafe(self._unsubscribe_later, sid)
        except Exception:  # a loop shutting down: the store ends the subscription with the connection
            pass

    def _unsubscribe_later(self, sid: int) -> None:
        if not self.closed:
            self.spawn(self.unsubscribe(sid))

    def spawn(self, coro: Coroutine[Any, Any, Any], sends: bool = False) -> None:
        """Run ``coro`` in a task of the hub's; ``sends``: a publish's, which a close lets end (see :meth:`close`)."""
        task = attempt_guard.spawn(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if sends:
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    @property
    def conn_gen(self) -> int:
        """The connection now: the transport's count of reconnects, which grows as a new connection is up (before
        the calls that waited for it are sent on it, and before this hub hears of it)."""
        return int(getattr(self.transport, "reconnects", 0))

    async def _on_reconnect(self, old_epoch: int, new_epoch: int) -> None:
        self.orphans.clear()
        if self.live and not self.closed and (self.resub_task is None or self.resub_task.done()):
            self.resub_task = asyncio.ensure_future(self._resubscribe_all())

    def _on_failed(self, exc: TinystoreError) -> None:
        """The store will not be reached again as things are (gone from its path, or refusing this client's token
        at a reconnect; trial CX: its subscriptions waited, deaf, for ever): each ends with ``exc``. Its
        ``on_error`` is told (without one, a warning in the log), an ``each()`` loop raises it, and a later
        call raises what the store's calls raise."""
        if self.closed:
            return
        for s in list(self.live):
            if s._stopped:
                continue
            s.errors += 1
            s._failure = exc
            s._stop_local()
            if s._task is not None and not s._task.done():
                s._task.cancel()
            if s._on_error is not None:
                self.spawn(s._report(exc))
            else:
                log.warning("%r: ended: %s", s, exc.message)

    async def _resubscribe_all(self) -> None:
        """Make every live subscription again on the current connection (run after each reconnect)."""
        while not self.closed and not self.transport.closed:
            gen = self.conn_gen
            todo = [s for s in self.live if s._conn_gen != gen]
            if not todo:
                return
            for s in todo:
                if s._stopped or self.closed:
                    continue
                try:
                    await s._resubscribe(gen)
                except TinystoreError as exc:
                    if self.transport.closed or self.closed:
                        return
                    if exc.code in ("closed", "unavailable", "outcome_unknown"):
                        break  # the connection dropped again: the next pass (or reconnect) does it
                    log.error("%r: could not subscribe again after a reconnect: %s", s, exc)
                    s.errors += 1
                    await s._report(exc)
                    s._stop_local()
                    if s._task is not None:
                        s._task.cancel()

    async def close(self) -> None:
        """The store is closing: stop every subscription here (the store ends them with the connection)."""
        if self.closed:
            return
        self.closed = True
        tasks: list[asyncio.Task[Any]] = []
        for s in list(self.live):
            s._stop_local()
            if s._task is not None and not s._task.done():
                s._task.cancel()
                tasks.append(s._task)
        if self.resub_task is not None:
            self.resub_task.cancel()
            tasks.append(self.resub_task)
        for t in list(self.tasks):
            if t in self.sending:
                # (a publish's is let end: its answer is waited for by the connection's close, as every write's;
                # cancelled, the publishes it sent were told ClosedError though subscribers heard them: trial HU)
                continue
            t.cancel()
            tasks.append(t)
        if self.sending:
            await asyncio.sleep(0)  # (a batch of this turn's publishes is sent: what was asked before the close)
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.1, self.transport.close_left(5.0)))


_hubs: weakref.WeakKeyDictionary[Store, _Hub] = weakref.WeakKeyDictionary()


def _hub(store: Store) -> _Hub:
    hub = _hubs.get(store)
    if hub is None:
        hub = _hubs[store] = _Hub(store)
    return hub
