"""Bodies of the channels engine: what it returns and pushes, and the wire messages of its methods.

Every body is a msgspec Struct of ints, strs, bytes and lists, so it encodes to MessagePack as is. The hot
ones (:class:`Publish`, :class:`Published`, :class:`Delivery` and its items) are ``array_like``: they travel
as MessagePack arrays in field order, not maps.

Methods (request body → reply body):

- ``channels.publish``: :class:`Publish` → :class:`Published`.
- ``channels.publish_many``: :class:`PublishMany` → ``list[Published]`` (all or nothing: one bad item and
  none is published).
- ``channels.subscribe``: :class:`Subscribe` → :class:`Subscribed`.
- ``channels.grant``: :class:`Grant` → nothing (``None``); a grant for an unknown subscription is ignored.
- ``channels.grant_many``: :class:`GrantMany` → nothing (``None``): several grants in one call, each as
  ``channels.grant`` would apply it (all checked first: one bad ``n`` and none is applied). The SDK sends one
  per loop turn for every subscription of its connection that has credit to give back.
- ``channels.unsubscribe``: :class:`Unsubscribe` → ``bool`` (false when it was already gone).
- push ``channels.deliver``: :class:`Delivery`, to the peer that owns the subscription.

Flow control (CHAN-01, CHAN-02): a subscription has a credit, a number of messages. The server sends it
messages only while its credit is above 0, and each :class:`MessageItem` it sends takes one; a
:class:`MissedItem` takes none. The subscriber gives credit back with ``channels.grant`` (or ``channels.grant_many``) as
its handler finishes messages. A subscription's credit is at most the store's ``channel_prefetch``: a larger
``Subscribe.credit``, or a grant that would take it past that, gives that much (the excess is ignored, not
refused). While a connection does not read what the server writes (past the server's high-water mark of bytes
waiting for it), its subscriptions are sent nothing; what their branches' logs drop meanwhile comes as
``MissedItem("behind", n)`` once it reads again. For every subscription, messages delivered + the counts of its
missed notices equals the messages published to its branches after it subscribed, exactly.
"""

from __future__ import annotations

import re
import reprlib
from typing import Annotated

import msgspec

from .values import json_problem

PUBLISH = "channels.publish"
PUBLISH_MANY = "channels.publish_many"
SUBSCRIBE = "channels.subscribe"
GRANT = "channels.grant"
GRANT_MANY = "channels.grant_many"
UNSUBSCRIBE = "channels.unsubscribe"
DELIVER = "channels.deliver"
"""The method name of the push that carries a :class:`Delivery`."""

BEHIND = "behind"
"""``MissedItem.reason``: the branch log dropped messages this subscription had not been sent yet."""

ID_DIGITS = 30
"""A message id is ``"<epoch>-<seq>"``: two runs of 1 to this many ASCII digits (a longer one is malformed)."""

_shown = reprlib.Repr()
_shown.maxstring = 48
_shown.maxother = 48
_shown.maxlist = _shown.maxtuple = _shown.maxdict = 4


def parse_id(mid: object) -> tuple[int, int] | None:
    """``(epoch, seq)`` of a message id ``"<epoch>-<seq>"``; ``None`` for anything else (not a str, other
    characters, a part empty or longer than :data:`ID_DIGITS` digits). Never raises, whatever ``mid`` is."""
    if not isinstance(mid, str) or len(mid) > 2 * ID_DIGITS + 1:
        return None
    epoch, sep, seq = mid.partition("-")
    if (
        not sep
        or not 0 < len(epoch) <= ID_DIGITS
        or not 0 < len(seq) <= ID_DIGITS
        or not (epoch.isascii() and epoch.isdigit() and seq.isascii() and seq.isdigit())
    ):
        return None
    return int(epoch), int(seq)


def show_id(mid: object) -> str:
    """``mid`` for an error message: its ``repr``, cut in the middle past about 48 characters."""
    text = _shown.repr(mid)
    if isinstance(mid, str) and len(mid) > _shown.maxstring:
        text += f" ({len(mid)} characters)"
    return text


def malformed_id(channel: str, mid: object) -> str:
    """The message of the ``InvalidError`` for a malformed id given as ``after``."""
    return f"channel {channel}: after {show_id(mid)}: a message id is '<epoch>-<seq>' (1 to {ID_DIGITS} digits each)"


FLOAT64 = 0xCB
FLOAT32 = 0xCA
"""The MessagePack markers of a float (msgspec writes every float as a float64)."""

_decode_any = msgspec.msgpack.Decoder().decode
# a float marker followed by the bytes of a NaN or an infinity (big-endian, the exponent's bits all ones): a
# float64 s1111111 1111xxxx ..., a float32 s1111111 1xxxxxxx ... (may also match inside a string: then the
# value is decoded to be sure; never misses one, as every position is tried)
_maybe_non_finite = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]|\xca[\x7f\xff][\x80-\xff]").search


def non_finite(payload: bytes) -> str | None:
    """Where the MessagePack ``payload`` holds a float that is NaN or infinite, as text (``nan is not a JSON
    number (at $.readings[2])``, see :func:`~tinystore.protocol.values.json_problem`), or ``None`` when it holds
    none (or does not decode: that is not for this to judge).

    Channels refuse such values, as SQL and jobs do: JSON has no NaN nor infinity, and subscribers (the
    command line, a browser through SSE) speak JSON. Cheap, as a hot path needs: two scans of the bytes when
    no byte of ``payload`` is a float marker (:data:`FLOAT64`, :data:`FLOAT32`); two more when no byte is
    0x7f or 0xff (a NaN's or an infinity's first byte after its marker: the usual finite floats have none);
    then a regular expression; ``payload`` is decoded only when a marker is followed by a NaN's or an
    infinity's bytes.
    """
    if (
        (FLOAT64 not in payload and FLOAT32 not in payload)
        or (0x7F not in payload and 0xFF not in payload)
        or _maybe_non_finite(payload) is None
    ):
        return None
    try:
        value = _decode_any(payload)
    except msgspec.DecodeError:
        return None
    except RecursionError:
        return "it nests too deeply to be read"
    return json_problem(value, keys=False)


def non_finite_error(channel: str, branch: list[str] | tuple[str, ...], problem: str) -> str:
    """The message of the ``InvalidError`` for a published value that holds ``problem`` (see :func:`non_finite`)."""
    where = f" branch {list(branch)!r}:" if branch else ""  # (the channel's root: no branch to name, trial IQ)
    return (
        f"channel {channel}:{where} the value cannot be published: {problem} "
        "(subscribers read JSON, which has no NaN nor infinity)"
    )


class Published(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Reply of ``channels.publish``: the message's ``seq`` in its branch and ``id`` ``"<epoch>-<seq>"``."""

    seq: int
    id: str


class Subscribed(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Reply of ``channels.subscribe``.

    - ``sub``: the subscription's id, unique in the server run; grants, deliveries and unsubscribe name it.
    - ``missed``: only when ``after`` was given: the exact number of messages published after ``after`` that
      the server no longer holds (0 when none was lost; those it holds follow in deliveries). ``None`` when
      it cannot tell: ``after`` is from another epoch (the server restarted) or the branch was forgotten.
      Always ``None`` without ``after``.
    - ``last_id``: the id of the branch's newest message, or ``None`` when it has none the server knows of.
    - ``start``: for a subscription that is not recursive, its position: the id ``"<epoch>-<seq>"`` just
      before the first message it will be sent (it may name no message: ``seq`` may be one below the
      branch's first). Subscribing again with ``after=start`` resumes exactly there (the SDK does so on a
      reconnect when it handled nothing yet). ``None`` for a recursive subscription.
    - ``credit``: the subscription's credit as the store took it (at most its ``channel_prefetch``): the
      subscriber must give credit back before that many messages are finished, or it hears no more.
    - ``cut``: for a recursive subscription, ``"<epoch>-<n>"``, where the store's messages stood when it was
      made; ``Subscribe.since`` on a resume (``None`` when not recursive).
    - ``skipped``: for a recursive subscription resumed with ``after``, each branch whose lost messages ``missed``
      counts, with the id it resumes after there (past them): the SDK resumes there next time, so that the next
      reconnect does not count them again (trial BC). ``None`` when there is none.
    """

    sub: int
    missed: int | None
    last_id: str | None
    start: str | None = None
    credit: int | None = None
    cut: str | None = None
    skipped: list[After] | None = None


class MessageItem(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="msg"):
    """One message in a :class:`Delivery` (encoded as ``["msg", seq, id, branch, payload]``).

    ``seq`` grows by one per message of its branch; ``id`` is ``"<epoch>-<seq>"`` (unique within a branch
    across server restarts); ``branch`` is the branch's path (``[]`` for the channel's root branch);
    ``payload`` is the published bytes. One instance is shared by every subscriber: do not mutate
    ``branch``.
    """

    seq: int
    id: str
    branch: list[str]
    payload: bytes


MAX_DEPTH = 32
"""The most parts a branch has (each part travels with every message of the branch)."""


class MissedItem(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="missed"):
    """A missed notice in a :class:`Delivery` (encoded as ``["missed", reason, count, skipped]``).

    ``reason`` is :data:`BEHIND`; ``count`` is the exact number of messages lost since the subscription's
    previous delivery. It always comes before the messages of the same delivery. ``skipped``, for a recursive
    subscription: per branch that lost messages, the id of the last one lost (where it resumes after a
    reconnect, so that those are not counted again); ``None`` otherwise.
    """

    reason: str
    count: int | None
    skipped: list[After] | None = None


DeliveryItem = MessageItem | MissedItem


class Delivery(msgspec.Struct, array_like=True, gc=False):
    """Push ``channels.deliver``: items for subscription ``sub``, in order.

    At most one :class:`MissedItem`, first; then at most the subscription's credit of
    :class:`MessageItem`, in publish order within each branch.
    """

    sub: int
    items: list[DeliveryItem]


class Publish(msgspec.Struct, array_like=True):
    """``channels.publish``: ``payload`` (at most ``channel_message_bytes``) on ``branch`` of ``channel``.

    ``tx``: 0, or the id of an open SQL transaction of the same client: the message is then checked now
    and handed over only when that transaction commits, never when it rolls back (CHAN-03); the reply is
    ``None`` instead of :class:`Published`. Ignored on the items of :class:`PublishMany`.
    """

    channel: str
    branch: list[str]
    payload: bytes
    tx: int = 0


PUBLISH_MANY_MAX = 10_000
"""Messages in one ``channels.publish_many`` (the SDK sends 1,024 at most): refused past it as the body is read,
before its items are (trial DG: 1.5 million in one frame kept the server's loop, and every other client, waiting
some 6 s)."""


class PublishMany(msgspec.Struct, array_like=True):
    """``channels.publish_many``: several messages at once, in order (a transaction's, at its commit); at most
    :data:`PUBLISH_MANY_MAX`."""

    items: Annotated[list[Publish], msgspec.Meta(max_length=PUBLISH_MANY_MAX)]


class After(msgspec.Struct, array_like=True):
    """A resume point of a recursive subscription: the last message ``id`` handled on ``branch``."""

    branch: list[str]
    id: str


class Subscribe(msgspec.Struct, kw_only=True):
    """``channels.subscribe``: listen to ``branch`` of ``channel`` (and below it when ``recursive``).

    ``after``: resume after this message id of ``branch``. ``after_branches``: for a recursive subscription,
    the last id handled per branch (``after`` then stands for ``branch`` itself). ``credit``: the initial
    credit in messages (the prefetch window; ``None``, or anything past it: the store's ``channel_prefetch``).
    ``resume``: resume even when ``after`` and ``after_branches`` are empty (a recursive subscription that
    handled nothing yet: every branch below with messages then makes ``missed`` ``None``). ``since``: for a
    recursive resume, the ``Subscribed.cut`` of the subscription resumed: a branch below it not listed in
    ``after_branches`` whose last message came before the cut then counts 0 (``None`` without it).
    """

    channel: str
    branch: list[str] = []
    recursive: bool = False
    after: str | None = None
    after_branches: list[After] = []
    credit: int | None = None
    resume: bool = False
    since: str | None = None


class Grant(msgspec.Struct, array_like=True):
    """``channels.grant``: add ``n`` messages of credit to subscription ``sub`` (its credit stays at most the
    store's ``channel_prefetch``)."""

    sub: int
    n: int


GRANT_MANY_MAX = 10_000
"""Grants of one ``channels.grant_many`` (the SDK sends at most this many a call; trial DJ: 5 million in one frame
kept the server's loop 2.6 s)."""


class GrantMany(msgspec.Struct, array_like=True):
    """``channels.grant_many``: the grants of one loop turn, in one call (``[[sub, n], ...]`` on the wire); at most
    :data:`GRANT_MANY_MAX`."""

    items: Annotated[list[Grant], msgspec.Meta(max_length=GRANT_MANY_MAX)]


class Unsubscribe(msgspec.Struct, kw_only=True):
    """``channels.unsubscribe``: end subscription ``sub``; what it held is freed."""

    sub: int
