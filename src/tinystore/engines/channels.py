"""The channels engine: live messages in memory, one bounded log per branch, a position per subscriber.

A *branch* is ``(channel, parts)``: a channel name and a tuple of strs (``()`` is the channel's root branch).
Each branch has one log of its recent messages, bounded by ``Limits.channel_log`` messages and
``Limits.channel_log_bytes`` bytes of payload; all logs together hold at most ``Limits.channel_total_bytes``.
A subscription keeps only its position in the log of each branch it hears (the next seq to send), never a
copy of a message, so a publish costs O(1) plus, once per loop turn, O(subscribers of the branch).

Delivery is pushed to the subscriber's :class:`~tinystore.engines.base.Peer` as
``peer.push("channels.deliver", Delivery(sub, items))`` (see :mod:`tinystore.protocol.channels`), at most
once per subscription per loop turn (publishes of one turn are coalesced by ``loop.call_soon``), and never
more messages than the subscription's credit (at most ``Limits.channel_prefetch``: a subscribe or a grant past it
gives that much). When the log dropped messages a subscription had not been
sent, its next delivery starts with ``MissedItem("behind", n)``, n exact: for every subscription, messages
delivered + missed counts == messages published to its branches after it subscribed (CHAN-02).

A peer that cannot take more for now (the server's listener says so through :meth:`ChannelsEngine.peer_full`
when its connection's write buffer is past its high-water mark) is sent nothing until it can again: its
subscriptions keep their positions meanwhile, so what the logs drop is told as ``MissedItem("behind", n)``,
exactly, as for a subscriber without credit. The memory a client that stops reading costs the store is then
its connection's buffer, whatever its credit and however many subscriptions it has (CHAN-08).

A branch keeps its log while someone listens and for ``Limits.channel_linger`` seconds after the last
listener left; a branch nobody listened to within that time keeps no payload. The state of a branch idle
that long (no listener, no publish) is forgotten, and so is a branch heard only by recursive subscriptions
that were sent all of it, after a linger without a publish: memory stays bounded (CHAN-06, CHAN-08). The byte
bounds count payload bytes. Message seqs grow by one per message of a branch; a branch made again after it
was forgotten starts above every seq any forgotten branch reached, so an id ``"<epoch>-<seq>"`` never repeats
on a branch within an epoch (ids of different branches may be equal; a seq jump is not a loss).

Without a running asyncio loop (plain synchronous use, as in property tests) every call that makes
something deliverable flushes before it returns.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..clock import Clock, Timer
from ..errors import ClosedError, InvalidError, LimitError
from ..limits import Limits
from ..names import check_name
from ..protocol.channels import (
    BEHIND,
    DELIVER,
    MAX_DEPTH,
    After,
    Delivery,
    DeliveryItem,
    MessageItem,
    MissedItem,
    Published,
    Subscribed,
    malformed_id,
    parse_id,
)
from .base import Peer

__all__ = ["Branch", "ChannelsEngine"]

log = logging.getLogger("tinystore.channels")

Branch = tuple[str, ...]
"""A branch path under a channel: ``()`` is the channel's root, ``("7",)`` is ``under(7)``."""

MAX_PART = 256
TOMBS_KEPT = 16384
"""How many forgotten branches the engine remembers where their seqs stopped (see ``_tombs``), and how many
channels when their last message nobody could hear was published (see ``_unheard_at``)."""
_NEVER = -math.inf
_GONE = MessageItem(0, "", [], b"")  # fills the slots of dropped messages until the log list is compacted


class _Branch:
    """One branch: its log (``log[head:]`` holds seqs ``next_seq - held .. next_seq - 1``) and listeners."""

    __slots__ = (
        "base",
        "channel",
        "dirty",
        "forgotten",
        "head",
        "heap_at",
        "heard_until",
        "key",
        "last_g",
        "last_pub",
        "log",
        "nbytes",
        "next_seq",
        "parts",
        "subs",
        "touched",
        "wire",
    )

    def __init__(self, channel: str, parts: Branch, base: int) -> None:
        self.channel = channel
        self.parts = parts
        self.key = (channel, parts)
        self.wire = list(parts)
        self.base = base  # the first seq of this incarnation
        self.next_seq = base
        self.log: list[MessageItem] = []
        self.head = 0
        self.nbytes = 0
        self.subs: dict[_Sub, None] = {}  # every subscription that hears it (direct or recursive)
        self.heard_until = _NEVER  # keeps its log until then when nobody listens
        self.last_pub = _NEVER
        self.last_g = 0  # the engine's publish count at its last message (see ChannelsEngine._published)
        self.heap_at = math.inf  # the deadline of its entry on the idle heap (inf: none)
        self.dirty = False  # published to in this loop turn, not flushed yet
        self.touched = True  # published to since the last sweep of recursively heard branches
        self.forgotten = False

    def first_held(self) -> int:
        return self.next_seq - (len(self.log) - self.head)


class _Sub:
    """One subscription: its credit and, per branch it hears, the next seq to send it."""

    __slots__ = ("channel", "closed", "credit", "dirty", "id", "parts", "peer", "pending", "pos", "recursive")

    def __init__(self, sub_id: int, peer: Peer, channel: str, parts: Branch, recursive: bool, credit: int):
        self.id = sub_id
        self.peer = peer
        self.channel = channel
        self.parts = parts
        self.recursive = recursive
        self.credit = credit
        self.pos: dict[_Branch, int] = {}
        self.pending: dict[_Branch, None] = {}  # branches that may hold messages not sent yet, fairness order
        self.dirty = False  # queued for the next flush
        self.closed = False


ITEM_OVERHEAD = 64
"""Bytes a message's encoding in a push may take beyond its payload, id and branch (a bound, not a measure)."""


class ChannelsEngine:
    """Channels in memory: publish, subscribe with credit, resume after an id, bounded logs.

    ``clock`` drives the linger timers; ``limits`` gives the bounds (``channel_*``, ``subscriptions``);
    ``epoch`` is this server run's epoch (an int), the first part of every message id.
    """

    def __init__(self, clock: Clock, limits: Limits, epoch: int) -> None:
        self._clock = clock
        self._limits = limits
        self._epoch = epoch
        self._prefix = f"{epoch}-"
        self._max_message = limits.channel_message_bytes
        self._log_max = limits.channel_log
        self._log_bytes = limits.channel_log_bytes
        self._total_max = limits.channel_total_bytes
        self._linger = limits.channel_linger
        # one push must fit a frame (the SDK refuses a larger one, then reconnects for ever): past the default
        # limits, where a subscription's credit of the largest messages could outgrow a frame, deliveries are
        # cut by bytes too
        self._push_budget = limits.frame_body_bytes // 2
        self._cut_by_bytes = limits.channel_prefetch * (limits.channel_message_bytes + ITEM_OVERHEAD) > (
            self._push_budget
        )
        self._branches: dict[tuple[str, Branch], _Branch] = {}
        self._by_channel: dict[str, dict[Branch, _Branch]] = {}
        self._recursive: dict[str, dict[Branch, dict[_Sub, None]]] = {}
        self._subs: dict[int, _Sub] = {}
        self._by_peer: dict[int, dict[int, _Sub]] = {}
        self._sub_ids = itertools.count(1)
        self._floor = 0  # the highest seq any forgotten branch reached
        # messages kept on branches in this run: a recursive subscription's cut (Subscribed.cut) is this count at
        # its subscribe, and a branch whose last message came before the cut had nothing for it since
        self._published = 0
        # channel -> the publish count at its last message nobody could hear (the latest TOMBS_KEPT channels; the
        # others count as at _unheard_before, the highest count of those dropped)
        self._unheard_at: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._unheard_before = 0
        # forgotten branches where their seqs stopped (the next one), the latest TOMBS_KEPT: one made again
        # before anything was published on it goes on from there, so that an id of its last messages still
        # names a place (a resume with after= is exact, not "cannot tell")
        self._tombs: collections.OrderedDict[tuple[str, Branch], int] = collections.OrderedDict()
        self._total_bytes = 0
        self._held = 0
        self._dirty_branches: list[_Branch] = []
        self._dirty_subs: list[_Sub] = []
        self._flush_pending = False
        self._flush_now = False
        self._flush_handle: asyncio.Handle | None = None
        self._max_credit = limits.channel_prefetch
        # peers that cannot take more for now (peer id → their subscriptions waiting to be sent something)
        self._held_back: dict[int, dict[_Sub, None]] = {}
        self._ticket = itertools.count()
        # (deadline, ticket, branch): at most one live entry a branch (its heap_at); a later one of the same
        # branch is stale, skipped when it comes up
        self._idle_heap: list[tuple[float, int, _Branch]] = []
        self._timer: Timer | None = None
        self._timer_when = math.inf
        self._sweep_timer: Timer | None = None  # runs every linger while recursive subscriptions exist
        self._pressure = False  # past half the total bound: keep _size_heap up to date
        self._watch = self._total_max // 2
        # bytes held elsewhere for messages still to come (open transactions' publishes, see reserve), counted in
        # _total_bytes: the logs make room for them
        self._reserved = 0
        self._size_heap: list[tuple[int, int, _Branch]] = []  # (-nbytes, ticket, branch), lazily exact
        self._closed = False

    # ------------------------------------------------------------------ publish

    def publish(self, channel: str, branch: Branch, payload: bytes) -> Published:
        """Publish ``payload`` (bytes) on ``branch`` of ``channel``; never waits for any subscriber.

        Returns ``Published(seq, id)``: the message's seq in its branch and its id ``"<epoch>-<seq>"``.
        Raises ``InvalidError`` for a bad channel name or branch part (a branch part is a non-empty str of
        at most 256 characters) or a payload that is not bytes, ``LimitError`` (``limit``, ``wanted`` in
        bytes) for a payload over ``channel_message_bytes``, ``ClosedError`` after :meth:`close`. Nothing is
        published when it raises.
        """
        if self._closed:
            raise ClosedError("channels: the store is closed")
        if type(branch) is not tuple:
            branch = _as_branch(channel, branch)
        try:
            b = self._branches.get((channel, branch))
        except TypeError:  # an unhashable part: not a str
            b = None
        if b is None:
            self._check_branch(channel, branch)
        if type(payload) is not bytes:
            payload = _as_bytes(channel, payload)
        size = len(payload)
        if size > self._max_message:
            raise self._too_big(channel, size)
        if b is None:
            if not self._covered(channel, branch):
                return self._unheard(channel, branch)
            b = self._make_branch(channel, branch, idle=True)
        out = self._append(b, payload, size)
        if self._flush_now:
            self.flush()
        return out

    def _covered(self, channel: str, parts: Branch) -> bool:
        """Whether a recursive subscription hears ``parts`` of ``channel`` (a branch with no state yet)."""
        rec = self._recursive.get(channel)
        if not rec:
            return False
        return any(parts[:depth] in rec for depth in range(len(parts) + 1))

    def _unheard(self, channel: str, parts: Branch) -> Published:
        """A message on a branch that has no state and no listener: nobody can ever get it, so it keeps
        nothing (no branch is made). Its seq comes above every seq given so far, so its id is never
        repeated, and a branch made later starts above it (not where it was forgotten: ids from before then
        name no place, as this message was lost)."""
        if self._tombs:
            self._tombs.pop((channel, parts), None)
        self._published += 1
        at = self._unheard_at
        at.pop(channel, None)
        at[channel] = self._published
        if len(at) > TOMBS_KEPT:
            self._unheard_before = at.popitem(last=False)[1]
        self._floor += 1
        return Published(self._floor, self._prefix + str(self._floor))

    def has_listeners(self, channel: str, branch: Branch) -> bool:
        """Whether a message published now on ``branch`` could reach anyone (a subscription, a resume
        within the linger, or a recursive subscription above it)."""
        if (channel, branch) in self._branches:
            return True
        return self._covered(channel, branch)

    def check(self, channel: str, branch: Branch, payload: bytes) -> None:
        """Raise what :meth:`publish` would raise for these arguments, publishing nothing.

        For a message that will be published later (a transaction's, at its commit): ``InvalidError`` (bad
        name, branch part or payload type), ``LimitError`` (over ``channel_message_bytes``), ``ClosedError``.
        """
        if self._closed:
            raise ClosedError("channels: the store is closed")
        parts = branch if type(branch) is tuple else _as_branch(channel, branch)
        self._check_branch(channel, parts)
        data = payload if type(payload) is bytes else _as_bytes(channel, payload)
        if len(data) > self._max_message:
            raise self._too_big(channel, len(data))

    def publish_many(self, items: Sequence[tuple[str, Branch, bytes]]) -> list[Published]:
        """Publish ``(channel, branch, payload)`` items in order, all or none (a transaction's at its commit).

        Returns one ``Published`` per item. Raises as :meth:`publish` does, before publishing any item.
        """
        if self._closed:
            raise ClosedError("channels: the store is closed")
        checked: list[tuple[str, Branch, bytes]] = []
        for channel, branch, payload in items:
            parts = branch if type(branch) is tuple else _as_branch(channel, branch)
            self._check_branch(channel, parts)
            data = payload if type(payload) is bytes else _as_bytes(channel, payload)
            if len(data) > self._max_message:
                raise self._too_big(channel, len(data))
            checked.append((channel, parts, data))
        out: list[Published] = []
        for channel, parts, data in checked:
            b = self._branches.get((channel, parts))
            if b is None:
                if not self._covered(channel, parts):
                    out.append(self._unheard(channel, parts))
                    continue
                b = self._make_branch(channel, parts, idle=True)
            out.append(self._append(b, data, len(data)))
        if self._flush_now:
            self.flush()
        return out

    def _append(self, b: _Branch, payload: bytes, size: int) -> Published:
        seq = b.next_seq
        b.next_seq = seq + 1
        self._published += 1
        b.last_g = self._published
        b.touched = True
        mid = self._prefix + str(seq)
        if not b.subs:
            now = self._clock.now()
            b.last_pub = now
            if now >= b.heard_until:  # nobody listened within the linger: keep nothing
                if b.head < len(b.log):
                    self._clear_log(b)
                return Published(seq, mid)
        b.log.append(MessageItem(seq, mid, b.wire, payload))
        b.nbytes += size
        self._total_bytes += size
        self._held += 1
        if len(b.log) - b.head > self._log_max or b.nbytes > self._log_bytes:
            self._trim_branch(b)
        if self._pressure and b.nbytes:
            heapq.heappush(self._size_heap, (-b.nbytes, next(self._ticket), b))
            if len(self._size_heap) > 4 * len(self._branches) + 1024:
                self._rebuild_sizes()
        if self._total_bytes > self._watch:
            self._over_watch()
        if b.subs and not b.dirty:
            b.dirty = True
            self._dirty_branches.append(b)
            if not self._flush_pending:
                self._schedule_flush()
        return Published(seq, mid)

    # ------------------------------------------------------------------ subscribe

    def subscribe(
        self,
        peer: Peer,
        channel: str,
        branch: Branch = (),
        *,
        recursive: bool = False,
        after: str | Mapping[Branch, str] | None = None,
        credit: int | None = None,
        since: str | None = None,
    ) -> Subscribed:
        """Subscribe ``peer`` to ``branch`` of ``channel`` (and every branch below it when ``recursive``).

        Without ``after`` the subscription hears every message published after this call returns (CHAN-01).
        With ``after`` (a message id ``"<epoch>-<seq>"`` of ``branch``) it resumes after that message: the
        messages the log still holds are delivered, and ``Subscribed.missed`` is the exact number published
        after it that the log no longer holds; ``missed`` is ``None`` (delivery starts at the current end)
        when ``after`` is from another epoch or the branch was forgotten since. For a recursive subscription
        ``after`` may be a mapping ``{branch: id}`` of the last id handled per branch (a str stands for
        ``branch`` itself); ``missed`` is then the sum over the branches, or ``None`` when any branch below
        cannot tell (a listed one forgotten, or one not listed that has messages).

        ``credit``: messages the server may send before a :meth:`grant` (default and most ``channel_prefetch``:
        a larger credit gives that much). ``since`` (recursive, with ``after``): the ``cut`` that the subscription
        being resumed was given: a branch below that it heard nothing from counts 0, not ``None``, when its
        last message came before the cut (and nothing was published where nobody could hear it since).
        Returns ``Subscribed(sub, missed, last_id, start, credit)``; ``last_id`` is ``branch``'s newest message id or
        None; ``start`` (not recursive) is the id just before the first message the subscription will be sent,
        which ``after`` accepts even when it names no message (the seq before a branch's first).
        Raises ``InvalidError`` (bad name, branch part, id or credit), ``LimitError`` (past
        ``Limits.subscriptions`` subscriptions in the store), ``ClosedError`` (engine or peer closed).
        """
        if self._closed:
            raise ClosedError("channels: the store is closed")
        if peer.closed:
            raise ClosedError(f"channel {channel}: the connection is closed")
        parts = branch if type(branch) is tuple else _as_branch(channel, branch)
        self._check_branch(channel, parts)
        if credit is None:
            credit = self._max_credit
        elif type(credit) is not int or credit < 0:
            raise InvalidError(f"channel {channel}: credit {credit!r}: a credit is an int >= 0")
        elif credit > self._max_credit:
            credit = self._max_credit  # at most the prefetch window (CHAN-08): what a push may carry is bounded
        if len(self._subs) >= self._limits.subscriptions:
            raise LimitError(
                f"channel {channel}: the store has {len(self._subs)} subscriptions, its limit",
                limit=self._limits.subscriptions,
                wanted=len(self._subs) + 1,
            )
        resume = self._parse_after(channel, parts, recursive, after)

        root = self._branches.get((channel, parts))
        if root is None:
            root = self._make_branch(channel, parts, idle=False)
        sub = _Sub(next(self._sub_ids), peer, channel, parts, recursive, credit)
        self._subs[sub.id] = sub
        self._by_peer.setdefault(peer.id, {})[sub.id] = sub

        missed: int | None = 0
        skipped: list[After] = []
        if not recursive:
            missed = self._attach(sub, root, after is not None, resume.get(parts))
        else:
            cut = None if since is None else self._parse_id(channel, since)
            if cut is not None and self._unheard_at.get(channel, self._unheard_before) > cut:
                missed = None  # published since where nobody listened: perhaps below this subscription
            self._recursive.setdefault(channel, {}).setdefault(parts, {})[sub] = None
            if self._sweep_timer is None:
                self._sweep_timer = self._clock.call_later(self._linger, self._sweep_recursive)
            depth = len(parts)
            for bparts, b in self._by_channel[channel].items():
                if bparts[:depth] != parts:
                    continue
                if after is not None and bparts not in resume:
                    self._attach(sub, b, False, None)
                    if b.next_seq > b.base and (cut is None or b.last_g > cut):
                        missed = None  # a branch with messages it may never have heard: cannot tell how many
                    continue
                m = self._attach(sub, b, after is not None, resume.get(bparts))
                missed = None if m is None or missed is None else missed + m
                if m:  # where it resumes on this branch, past what is counted (the SDK resumes there next time)
                    skipped.append(After(b.wire, self._prefix + str(sub.pos[b] - 1)))
            known = self._by_channel[channel]
            for key, after_seq in resume.items():
                if key in known:
                    continue
                # a listed branch forgotten since: nothing lost when it stopped right after what was heard (and
                # nothing was published on it since, which would have made it again or dropped its tomb)
                stopped = self._tombs.get((channel, key))
                if stopped is None or after_seq is None or after_seq + 1 != stopped:
                    missed = None
        if sub.pending and sub.credit > 0:
            sub.dirty = True
            self._dirty_subs.append(sub)
            if not self._flush_pending:
                self._schedule_flush()
        if self._flush_now:
            self.flush()
        start = None if recursive else self._prefix + str(sub.pos[root] - 1)
        cut_id = self._prefix + str(self._published) if recursive else None
        return Subscribed(
            sub.id, missed if after is not None else None, self._newest(root), start, credit, cut_id, skipped or None
        )

    def _parse_after(
        self, channel: str, parts: Branch, recursive: bool, after: str | Mapping[Branch, str] | None
    ) -> dict[Branch, int | None]:
        """``after`` as ``{branch: seq to resume after, or None when from another epoch}``."""
        if after is None:
            return {}
        if isinstance(after, str):
            return {parts: self._parse_id(channel, after)}
        if not isinstance(after, Mapping):
            raise InvalidError(malformed_id(channel, after))
        if not recursive:
            raise InvalidError(f"channel {channel}: after: a mapping of ids needs recursive=True")
        out: dict[Branch, int | None] = {}
        depth = len(parts)
        for key, mid in after.items():
            bparts = key if type(key) is tuple else _as_branch(channel, key)
            if bparts[:depth] != parts:
                raise InvalidError(f"channel {channel}: after: branch {list(bparts)} is not under {list(parts)}")
            self._check_branch(channel, bparts)
            out[bparts] = self._parse_id(channel, mid)
        return out

    def _parse_id(self, channel: str, mid: object) -> int | None:
        """The seq of id ``mid`` when it is of this epoch, else None; ``InvalidError`` (naming the id, cut
        short) for anything that is not ``"<epoch>-<seq>"`` of at most ``ID_DIGITS`` digits each."""
        parsed = parse_id(mid)
        if parsed is None:
            raise InvalidError(malformed_id(channel, mid))
        epoch, seq = parsed
        return seq if epoch == self._epoch else None

    def _attach(self, sub: _Sub, b: _Branch, resuming: bool, after_seq: int | None) -> int | None:
        """Make ``sub`` hear ``b``; return the exact count the log lost after ``after_seq`` (None: unsure)."""
        b.subs[sub] = None
        missed: int | None = 0
        pos = b.next_seq
        if resuming:
            if after_seq is not None and b.base - 1 <= after_seq < b.next_seq:  # base - 1: before the first
                pos = after_seq + 1
                first = b.first_held()
                if pos < first:
                    missed = first - pos
                    pos = first
            else:
                missed = None
        sub.pos[b] = pos
        if pos < b.next_seq:
            sub.pending[b] = None
        return missed

    # ------------------------------------------------------------------ credit and ending

    def grant(self, peer: Peer, sub: int, n: int) -> None:
        """Add ``n`` (an int >= 0) messages of credit to subscription ``sub`` of ``peer``; its credit is at most
        ``channel_prefetch`` (the rest of a grant past it is ignored).

        A grant for a subscription that is gone or is not ``peer``'s is ignored. Raises ``InvalidError``
        for a bad ``n``.
        """
        if type(n) is not int or n < 0:
            raise InvalidError(f"channels: subscription {sub}: grant {n!r}: credit is an int >= 0")
        s = self._subs.get(sub)
        if s is None or s.peer.id != peer.id:
            return
        credit = s.credit + n
        s.credit = credit if credit <= self._max_credit else self._max_credit
        if s.pending and not s.dirty and s.credit > 0:
            s.dirty = True
            self._dirty_subs.append(s)
            if not self._flush_pending:
                self._schedule_flush()
            if self._flush_now:
                self.flush()

    def grant_many(self, peer: Peer, grants: Sequence[tuple[int, int]]) -> None:
        """Apply several grants ``(sub, n)`` of ``peer`` at once, each as :meth:`grant` does (the SDK's
        grants of one loop turn, for all the subscriptions of its connection).

        Every ``n`` is checked first: one that is not an int >= 0 raises ``InvalidError`` and none is applied.
        Grants for subscriptions that are gone or not ``peer``'s are ignored; one subscription may appear
        more than once (its grants add up).
        """
        for sub, n in grants:
            if type(n) is not int or n < 0:
                raise InvalidError(f"channels: subscription {sub}: grant {n!r}: credit is an int >= 0")
        subs = self._subs
        dirty = self._dirty_subs
        pid = peer.id
        most = self._max_credit
        for sub, n in grants:
            s = subs.get(sub)
            if s is None or s.peer.id != pid:
                continue
            credit = s.credit + n
            s.credit = credit if credit <= most else most
            if s.pending and not s.dirty and s.credit > 0:
                s.dirty = True
                dirty.append(s)
        if dirty and not self._flush_pending:
            self._schedule_flush()
        if self._flush_now:
            self.flush()

    def unsubscribe(self, peer: Peer, sub: int) -> bool:
        """End subscription ``sub`` of ``peer``, freeing what it held; False when gone or not ``peer``'s.

        Its branches keep their logs for ``channel_linger`` when it was their last listener.
        """
        s = self._subs.get(sub)
        if s is None or s.peer.id != peer.id:
            return False
        self._remove(s)
        return True

    def peer_full(self, peer: Peer, full: bool) -> None:
        """``peer`` cannot take more for now (``full``), or can again: the server's listener says so when the
        bytes waiting to be written to a connection pass its high-water mark, and when they drained.

        While full, ``peer`` is pushed nothing; its subscriptions keep their positions (and their credit), so
        what the logs drop meanwhile is told as ``Missed("behind", n)``, exactly, at their next delivery, which
        comes once the peer can take it.
        """
        if full:
            if not peer.closed:
                self._held_back.setdefault(peer.id, {})
            return
        waiting = self._held_back.pop(peer.id, None)
        if not waiting:
            return
        dirty = self._dirty_subs
        for s in waiting:
            if not s.closed and not s.dirty and s.pending and s.credit > 0:
                s.dirty = True
                dirty.append(s)
        if dirty and not self._flush_pending:
            self._schedule_flush()
        if self._flush_now:
            self.flush()

    def drop_peer(self, peer: Peer) -> None:
        """End every subscription of ``peer`` (its connection went away). Idempotent."""
        self._held_back.pop(peer.id, None)
        subs = self._by_peer.get(peer.id)
        if subs:
            for s in list(subs.values()):
                self._remove(s)

    def _remove(self, s: _Sub) -> None:
        s.closed = True
        if self._held_back:
            waiting = self._held_back.get(s.peer.id)
            if waiting:
                waiting.pop(s, None)
        del self._subs[s.id]
        peer_subs = self._by_peer.get(s.peer.id)
        if peer_subs is not None:
            peer_subs.pop(s.id, None)
            if not peer_subs:
                del self._by_peer[s.peer.id]
        if s.recursive:
            rec = self._recursive.get(s.channel)
            if rec is not None:
                subs = rec.get(s.parts)
                if subs is not None:
                    subs.pop(s, None)
                    if not subs:
                        del rec[s.parts]
                if not rec:
                    del self._recursive[s.channel]
        for b in s.pos:
            del b.subs[s]
            if not b.subs:
                self._go_idle(b)
        s.pos.clear()
        s.pending.clear()

    # ------------------------------------------------------------------ reading

    def newest_id(self, channel: str, branch: Branch) -> str | None:
        """The id of the newest message of ``branch`` of ``channel`` this run knows of, or None."""
        parts = branch if type(branch) is tuple else _as_branch(channel, branch)
        b = self._branches.get((channel, parts))
        return None if b is None else self._newest(b)

    def _newest(self, b: _Branch) -> str | None:
        return None if b.next_seq == b.base else self._prefix + str(b.next_seq - 1)

    def status(self) -> dict[str, Any]:
        """Counts: ``branches`` known, ``subscriptions``, ``peers`` with one, ``bytes`` of payload and
        ``messages`` held in all logs, ``bytes_limit`` (``channel_total_bytes``); ``tombstones``: forgotten
        branches whose last seq is remembered, and ``unheard_kept``: channels whose last unheard publish is
        remembered (each at most :data:`TOMBS_KEPT`, the memory the engine keeps beyond what it holds)."""
        return {
            "branches": len(self._branches),
            "subscriptions": len(self._subs),
            "peers": len(self._by_peer),
            "bytes": self._total_bytes - self._reserved,
            "messages": self._held,
            "bytes_limit": self._total_max,
            "tombstones": len(self._tombs),
            "unheard_kept": len(self._unheard_at),
        }

    def close(self) -> None:
        """Drop every branch and subscription and stop the timers; later calls raise ``ClosedError``."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for s in self._subs.values():
            s.closed = True
        for b in self._branches.values():
            b.forgotten = True
        self._subs.clear()
        self._by_peer.clear()
        self._branches.clear()
        self._by_channel.clear()
        self._recursive.clear()
        self._dirty_branches.clear()
        self._dirty_subs.clear()
        self._held_back.clear()
        self._idle_heap.clear()
        self._size_heap.clear()
        self._total_bytes = 0
        self._reserved = 0
        self._held = 0

    # ------------------------------------------------------------------ delivery

    def _schedule_flush(self) -> None:
        self._flush_pending = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._flush_now = True  # no loop: the public call flushes before it returns
            return
        self._flush_handle = loop.call_soon(self.flush)

    def flush(self) -> None:
        """Push every subscription what it may be sent now. Called by the loop once per turn; idempotent."""
        self._flush_pending = False
        self._flush_now = False
        self._flush_handle = None
        subs = self._dirty_subs
        branches = self._dirty_branches
        if branches:
            self._dirty_branches = []
            for b in branches:
                b.dirty = False
                for s in b.subs:
                    s.pending[b] = None
                    if not s.dirty and s.credit > 0:
                        s.dirty = True
                        subs.append(s)
        if not subs:
            return
        self._dirty_subs = []
        for s in subs:
            s.dirty = False
            if s.closed:
                continue
            if s.peer.closed:
                self.drop_peer(s.peer)
                continue
            self._deliver(s)

    def _deliver(self, s: _Sub) -> None:
        held_back = self._held_back
        while True:
            if held_back:
                waiting = held_back.get(s.peer.id)
                if waiting is not None:  # its peer cannot take more for now: sent once it can (peer_full)
                    waiting[s] = None
                    return
            if not self._deliver_once(s):  # a push cut by bytes: the rest in the next one
                return

    def _deliver_once(self, s: _Sub) -> bool:
        """Push what ``s`` may get now (its credit's worth) in one push; ``True`` when the push was cut short to
        fit a frame and more may follow."""
        credit = s.credit
        if credit <= 0:
            return False
        pending = s.pending
        positions = s.pos
        items: list[DeliveryItem] = []
        missed = 0
        skipped: list[After] | None = [] if s.recursive else None
        size = 0
        full = False
        for b in list(pending):
            if not credit:
                break
            pos = positions[b]
            log_ = b.log
            end = b.next_seq
            first = end - (len(log_) - b.head)
            if pos < first:
                missed += first - pos
                pos = first
                if skipped is not None:
                    skipped.append(After(b.wire, self._prefix + str(first - 1)))
            n = end - pos
            if n > credit:
                n = credit
            full = False
            if n > 0:
                start = b.head + pos - first
                got = log_[start : start + n]
                if self._cut_by_bytes:
                    got, size, full = self._fit(got, size, bool(items))
                    n = len(got)
                items.extend(got)
                pos += n
                credit -= n
            positions[b] = pos
            del pending[b]
            if pos < end:
                pending[b] = None  # not done: to the back of the line, so other branches get their turn
            if full:
                break
        if missed:
            items.insert(0, MissedItem(BEHIND, missed, skipped))
        if not items:
            return False
        s.credit = credit
        try:
            s.peer.push(DELIVER, Delivery(s.id, items))
        except Exception:  # a Peer must not raise; if one does, it must not stop the others' delivery
            log.exception("channels: push to peer %s failed", s.peer.id)
            return False
        return full

    def _fit(self, got: list[Any], size: int, some: bool) -> tuple[list[Any], int, bool]:
        """The leading messages of ``got`` that keep a push under the budget (``size`` bytes in it so far; at
        least one message when the push has ``some`` none yet); the new size; whether the push is full."""
        budget = self._push_budget
        for i, item in enumerate(got):
            cost = len(item.payload) + len(item.id) + sum(len(p) for p in item.branch) + ITEM_OVERHEAD
            if size + cost > budget and (some or i):
                return got[:i], size, True
            size += cost
        return got, size, False

    # ------------------------------------------------------------------ logs and memory

    def _check_branch(self, channel: str, parts: Branch) -> None:
        check_name("channel", channel)
        if len(parts) > MAX_DEPTH:
            raise InvalidError(f"channel {channel}: a branch has at most {MAX_DEPTH} parts; this one has {len(parts)}")
        for part in parts:
            if type(part) is not str or not part or len(part) > MAX_PART:
                # (a part named by its first 40 characters: trial CX's part of 10,000 was echoed whole)
                shown = [p[:40] + "…" if type(p) is str and len(p) > 40 else p for p in parts]
                what = f"a part of {len(part)} characters" if type(part) is str and part else f"part {part!r}"
                raise InvalidError(
                    f"channel {channel}: branch {shown!r}: {what}; a branch part is a str of 1 to {MAX_PART} characters"
                )

    def _too_big(self, channel: str, size: int) -> LimitError:
        return LimitError(
            f"channel {channel}: a message of {size} bytes is over the limit of {self._max_message} bytes "
            "(channel_message_bytes)",
            limit=self._max_message,
            wanted=size,
        )

    def _make_branch(self, channel: str, parts: Branch, *, idle: bool) -> _Branch:
        base = self._tombs.pop((channel, parts), None) if self._tombs else None
        b = _Branch(channel, parts, self._floor + 1 if base is None else base)
        self._branches[b.key] = b
        self._by_channel.setdefault(channel, {})[parts] = b
        rec = self._recursive.get(channel)
        if rec:
            for depth in range(len(parts) + 1):
                listeners = rec.get(parts[:depth])
                if listeners:
                    for s in listeners:
                        b.subs[s] = None
                        s.pos[b] = b.base
        if idle and not b.subs:
            self._go_idle(b, heard_until=_NEVER)
        return b

    def _go_idle(self, b: _Branch, heard_until: float | None = None) -> None:
        """``b`` lost its last listener (or never had one): keep its log until ``heard_until``."""
        now = self._clock.now()
        b.heard_until = now + self._linger if heard_until is None else heard_until
        deadline = max(b.heard_until, now + self._linger)
        if deadline < b.heap_at:  # else its entry comes up sooner, and looks at the branch as it is then
            b.heap_at = deadline
            heapq.heappush(self._idle_heap, (deadline, next(self._ticket), b))
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            if self._timer_when <= when:
                return
            self._timer.cancel()
        self._timer_when = when
        self._timer = self._clock.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_when = math.inf
        if self._closed:
            return
        now = self._clock.now()
        heap = self._idle_heap
        linger = self._linger
        while heap and heap[0][0] <= now:
            at, _, b = heapq.heappop(heap)
            if at != b.heap_at:
                continue  # stale: the branch has an entry of its own that came up sooner
            b.heap_at = math.inf
            if b.forgotten or b.subs:
                continue  # heard again: it goes idle anew when its last listener leaves
            if now >= b.heard_until and b.head < len(b.log):
                self._clear_log(b)
            deadline = max(b.heard_until, b.last_pub + linger)
            if deadline <= now:
                self._forget(b)
            else:
                b.heap_at = deadline
                heapq.heappush(heap, (deadline, next(self._ticket), b))
        if heap:
            self._arm(heap[0][0])

    def _sweep_recursive(self) -> None:
        """Forget branches heard only by recursive subscriptions, all caught up, unpublished for a linger.

        Nothing is lost (every listener was sent everything); a publish makes the branch again and the
        recursive subscriptions hear it from its first message. This bounds the branches a long-lived
        recursive subscription keeps alive.
        """
        self._sweep_timer = None
        if self._closed:
            return
        for channel in list(self._recursive):
            for b in list(self._by_channel.get(channel, {}).values()):
                if b.touched or not b.subs:
                    b.touched = False
                    continue
                if all(s.recursive and s.pos[b] == b.next_seq for s in b.subs):
                    for s in b.subs:
                        del s.pos[b]
                        s.pending.pop(b, None)
                    b.subs.clear()
                    self._forget(b)
        if self._recursive:
            self._sweep_timer = self._clock.call_later(self._linger, self._sweep_recursive)

    def _forget(self, b: _Branch) -> None:
        b.forgotten = True
        if b.head < len(b.log):
            self._clear_log(b)
        del self._branches[b.key]
        chan = self._by_channel[b.channel]
        del chan[b.parts]
        if not chan:
            del self._by_channel[b.channel]
        if b.next_seq - 1 > self._floor:
            self._floor = b.next_seq - 1
        tombs = self._tombs
        tombs.pop(b.key, None)
        tombs[b.key] = b.next_seq
        if len(tombs) > TOMBS_KEPT:
            tombs.popitem(last=False)

    def _drop_oldest(self, b: _Branch) -> None:
        log_ = b.log
        head = b.head
        size = len(log_[head].payload)
        log_[head] = _GONE
        head += 1
        b.nbytes -= size
        self._total_bytes -= size
        self._held -= 1
        if head > 64 and head * 2 >= len(log_):
            del log_[:head]
            head = 0
        b.head = head

    def _trim_branch(self, b: _Branch) -> None:
        while len(b.log) - b.head > self._log_max or b.nbytes > self._log_bytes:
            self._drop_oldest(b)

    def _clear_log(self, b: _Branch) -> None:
        held = len(b.log) - b.head
        self._total_bytes -= b.nbytes
        self._held -= held
        b.log = []
        b.head = 0
        b.nbytes = 0
        if self._pressure and self._total_bytes < self._total_max // 4:
            self._pressure = False
            self._watch = self._total_max // 2
            self._size_heap = []

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` held elsewhere for messages still to come (an open transaction's publishes) within
        ``channel_total_bytes``: the logs drop their oldest messages to make room, as for a publish (CHAN-08: the
        store holds at most that much of channels, those messages too; trial BF). :meth:`release` gives it back."""
        self._reserved += nbytes
        self._total_bytes += nbytes
        if self._total_bytes > self._watch:
            self._over_watch()

    @property
    def reserved(self) -> int:
        """Bytes :meth:`reserve` counts now."""
        return self._reserved

    def release(self, nbytes: int) -> None:
        """Give back what :meth:`reserve` counted."""
        self._reserved -= nbytes
        self._total_bytes -= nbytes

    def _over_watch(self) -> None:
        """Past half the total bound: track log sizes; past the bound: drop from the longest logs."""
        if not self._pressure:
            self._pressure = True
            self._watch = self._total_max
            self._rebuild_sizes()
        heap = self._size_heap
        while self._total_bytes > self._total_max and heap:
            negsize, _, b = heap[0]
            if b.forgotten or not b.nbytes:
                heapq.heappop(heap)
            elif -negsize != b.nbytes:
                heapq.heapreplace(heap, (-b.nbytes, next(self._ticket), b))
            else:  # the log holding the most bytes: its oldest message goes
                self._drop_oldest(b)
                if b.nbytes:
                    heapq.heapreplace(heap, (-b.nbytes, next(self._ticket), b))
                else:
                    heapq.heappop(heap)

    def _rebuild_sizes(self) -> None:
        self._size_heap = [(-b.nbytes, next(self._ticket), b) for b in self._branches.values() if b.nbytes]
        heapq.heapify(self._size_heap)


def _as_branch(channel: str, branch: object) -> Branch:
    if isinstance(branch, list | tuple):
        return tuple(branch)
    raise InvalidError(f"channel {channel}: branch {branch!r}: a branch is a tuple (or list) of strs")


def _as_bytes(channel: str, payload: object) -> bytes:
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise InvalidError(f"channel {channel}: a payload is bytes, not {type(payload).__name__}")
