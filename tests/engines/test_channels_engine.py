"""The channels engine in process: delivery with credit, exact missed counts, branches, linger, bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinystore.clock import Clock
from tinystore.engines.channels import Branch, ChannelsEngine
from tinystore.errors import ClosedError, InvalidError, LimitError
from tinystore.limits import Limits
from tinystore.protocol.channels import (
    BEHIND,
    DELIVER,
    Delivery,
    MessageItem,
    MissedItem,
    Published,
    Subscribed,
)

EPOCH = 1_700_000_000_000
START = datetime(2030, 1, 1)


class FakePeer:
    """A Peer that records every delivery and checks the engine never sends past the credit it gave.

    ``auto_grant``: give back one credit per message as soon as it arrives (a subscriber keeping up).
    """

    _ids = 0

    def __init__(self, engine: ChannelsEngine, *, auto_grant: bool = False) -> None:
        FakePeer._ids += 1
        self.id = FakePeer._ids
        self.local = False
        self.closed = False
        self.engine = engine
        self.auto_grant = auto_grant
        self.deliveries: list[Delivery] = []
        self.messages: dict[int, list[MessageItem]] = {}
        self.missed: dict[int, int] = {}
        self.notices: dict[int, list[int]] = {}
        self.granted: dict[int, int] = {}  # all credit ever given per subscription
        self.errors: list[AssertionError] = []

    def push(self, method: str, body: Delivery) -> None:
        # the engine logs and swallows what a push raises, so a broken rule is recorded and checked on read
        try:
            self._receive(method, body)
        except AssertionError as exc:
            self.errors.append(exc)
            raise

    def _receive(self, method: str, body: Delivery) -> None:
        assert method == DELIVER
        assert not self.closed, "a closed peer got a push"
        assert body.items, "an empty delivery"
        self.deliveries.append(body)
        got = self.messages.setdefault(body.sub, [])
        n = 0
        for i, item in enumerate(body.items):
            if isinstance(item, MissedItem):
                assert i == 0, "a missed notice comes first in its delivery"
                assert item.reason == BEHIND
                assert item.count is not None and item.count > 0
                self.missed[body.sub] = self.missed.get(body.sub, 0) + item.count
                self.notices.setdefault(body.sub, []).append(item.count)
            else:
                got.append(item)
                n += 1
        assert len(got) <= self.granted[body.sub], "pushed past the credit"
        if self.auto_grant and n:
            self.grant(body.sub, n)

    def subscribe(
        self,
        channel: str,
        branch: Branch = (),
        *,
        credit: int = 64,
        recursive: bool = False,
        after: str | dict[Branch, str] | None = None,
    ) -> Subscribed:
        out = self.engine.subscribe(self, channel, branch, recursive=recursive, after=after, credit=credit)
        self.granted[out.sub] = credit
        self.messages.setdefault(out.sub, [])
        return out

    def grant(self, sub: int, n: int) -> None:
        self.granted[sub] = self.granted.get(sub, 0) + n
        self.engine.grant(self, sub, n)

    def check(self) -> None:
        assert not self.errors, self.errors

    def payloads(self, sub: int) -> list[bytes]:
        self.check()
        return [m.payload for m in self.messages.get(sub, [])]

    def seqs(self, sub: int) -> list[int]:
        self.check()
        return [m.seq for m in self.messages.get(sub, [])]

    def count(self, sub: int) -> int:
        self.check()
        return len(self.messages.get(sub, [])) + self.missed.get(sub, 0)


def engine(clock: Clock | None = None, **limits: object) -> ChannelsEngine:
    return ChannelsEngine(clock or Clock(START), Limits(**limits), EPOCH)  # type: ignore[arg-type]


async def turn(n: int = 3) -> None:
    """Let the loop run a few turns (flushes and the grants they cause)."""
    for _ in range(n):
        await asyncio.sleep(0)


def ints(values: Iterable[int]) -> list[bytes]:
    return [str(v).encode() for v in values]


# ---------------------------------------------------------------------------- CHAN-01


# contract: CHAN-01
async def test_subscribe_then_hear_everything_after_in_order() -> None:
    eng = engine()
    peer = FakePeer(eng)
    eng.publish("chat-events", ("7",), b"before")
    sub = peer.subscribe("chat-events", ("7",)).sub
    published = [eng.publish("chat-events", ("7",), p) for p in ints(range(10))]
    assert [p.seq for p in published] == list(range(2, 12))
    assert published[0].id == f"{EPOCH}-2"
    assert peer.deliveries == []  # nothing is pushed inside publish: one flush per loop turn
    await turn()
    assert len(peer.deliveries) == 1  # ten publishes of one turn, one push
    assert peer.payloads(sub) == ints(range(10))
    assert peer.seqs(sub) == list(range(2, 12))
    assert [m.id for m in peer.messages[sub]] == [p.id for p in published]
    assert all(m.branch == ["7"] for m in peer.messages[sub])
    assert eng.newest_id("chat-events", ("7",)) == f"{EPOCH}-11"


# contract: CHAN-01
async def test_coalesce_one_push_per_subscription_per_turn() -> None:
    eng = engine()
    peers = [FakePeer(eng) for _ in range(3)]
    subs = [p.subscribe("ch", ("a",)).sub for p in peers]
    for i in range(20):
        eng.publish("ch", ("a",), b"%d" % i)
    await turn()
    for p, s in zip(peers, subs, strict=True):
        assert len(p.deliveries) == 1
        assert p.payloads(s) == ints(range(20))


# contract: CHAN-01
async def test_100k_ints_keeping_up_all_in_order_and_fast() -> None:
    n = 100_000
    eng = engine()
    peer = FakePeer(eng, auto_grant=True)
    sub = peer.subscribe("numbers", ("x",), credit=64).sub
    payloads = ints(range(n))
    started = time.perf_counter()
    for i, payload in enumerate(payloads):
        eng.publish("numbers", ("x",), payload)
        if i % 32 == 31:
            await asyncio.sleep(0)
    await turn()
    elapsed = time.perf_counter() - started
    assert peer.missed.get(sub, 0) == 0
    assert peer.payloads(sub) == payloads
    assert peer.seqs(sub) == list(range(1, n + 1))
    rate = n / elapsed
    print(f"channels engine: {rate:,.0f} publishes/s with one subscriber granting as it goes")
    assert rate > 100_000, rate  # about 600k/s on a laptop; loose for slow machines


async def test_publish_throughput_without_subscribers() -> None:
    eng = engine()
    n = 100_000
    started = time.perf_counter()
    for _ in range(n):
        eng.publish("numbers", ("x",), b"0123456789")
    rate = n / (time.perf_counter() - started)
    print(f"channels engine: {rate:,.0f} publishes/s, nobody listening")
    assert rate > 100_000, rate
    assert eng.status()["bytes"] == 0  # nobody listened: nothing kept


# ---------------------------------------------------------------------------- CHAN-02


# contract: CHAN-02
async def test_slow_subscriber_gets_prefetch_then_exact_missed_then_the_rest() -> None:
    eng = engine(channel_log=100)
    slow = FakePeer(eng)
    fast = FakePeer(eng, auto_grant=True)
    s_slow = slow.subscribe("ch", ("b",), credit=64).sub
    s_fast = fast.subscribe("ch", ("b",), credit=64).sub
    for i in range(1, 251):
        eng.publish("ch", ("b",), b"%d" % i)  # a publisher never waits for anyone
        await asyncio.sleep(0)
    await turn()
    assert slow.seqs(s_slow) == list(range(1, 65))  # the prefetch window, then it stopped reading
    assert slow.missed == {}
    slow.grant(s_slow, 1000)  # a credit is at most the prefetch window (64): the rest of the grant is ignored
    await turn()
    assert slow.notices[s_slow] == [86]  # told before its next message, exactly
    last = slow.deliveries[-1]
    assert last.items[0] == MissedItem(BEHIND, 86)
    assert slow.seqs(s_slow) == list(range(1, 65)) + list(range(151, 215))
    slow.grant(s_slow, 64)
    await turn()
    assert slow.seqs(s_slow) == list(range(1, 65)) + list(range(151, 251))
    assert slow.count(s_slow) == 250  # delivered + missed == published
    assert fast.seqs(s_fast) == list(range(1, 251))  # one slow subscriber costs the others nothing
    assert fast.missed == {}


# contract: CHAN-02
async def test_credit_is_never_exceeded_and_missed_takes_none() -> None:
    eng = engine(channel_log=10)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", credit=3).sub
    for i in range(30):
        eng.publish("ch", (), b"%d" % i)
    await turn()
    # 30 published in one turn: the log holds 21..30, so 20 missed, then 3 messages (the credit)
    assert peer.notices[sub] == [20]
    assert peer.seqs(sub) == [21, 22, 23]
    peer.grant(sub, 2)
    await turn()
    assert peer.seqs(sub) == [21, 22, 23, 24, 25]
    peer.grant(sub, 0)
    await turn()
    assert len(peer.deliveries) == 2
    peer.grant(sub, 100)
    await turn()
    assert peer.count(sub) == 30
    assert len(peer.deliveries) == 3


# contract: CHAN-02
async def test_zero_credit_subscription_is_told_at_its_first_grant() -> None:
    eng = engine(channel_log=5)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", ("q",), credit=0).sub
    for i in range(12):
        eng.publish("ch", ("q",), b"%d" % i)
        await asyncio.sleep(0)
    assert peer.deliveries == []
    peer.grant(sub, 1)
    await turn()
    assert peer.notices[sub] == [7]
    assert peer.seqs(sub) == [8]
    peer.grant(sub, 10)
    await turn()
    assert peer.seqs(sub) == [8, 9, 10, 11, 12]
    assert peer.count(sub) == 12


# contract: CHAN-02
async def test_log_byte_bound_drops_oldest_and_counts_them() -> None:
    eng = engine(channel_log=1000, channel_log_bytes=1000)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", credit=0).sub
    for _ in range(10):
        eng.publish("ch", (), b"x" * 300)
    assert eng.status()["bytes"] == 900
    assert eng.status()["messages"] == 3
    peer.grant(sub, 100)
    await turn()
    assert peer.notices[sub] == [7]
    assert peer.seqs(sub) == [8, 9, 10]


# ---------------------------------------------------------------------------- CHAN-04 at engine level


# contract: CHAN-04
async def test_resume_after_an_id_is_exact_and_unknown_when_it_cannot_tell() -> None:
    eng = engine(channel_log=5)
    peer = FakePeer(eng)
    first = peer.subscribe("ch", ("r",))
    assert first.missed is None and first.last_id is None
    ids = [eng.publish("ch", ("r",), b"%d" % i).id for i in range(1, 13)]
    await turn()
    eng.drop_peer(peer)  # the connection went away after it handled message 3, say
    again = FakePeer(eng)
    resumed = again.subscribe("ch", ("r",), after=ids[2])
    assert resumed.missed == 4  # 4..7 are gone: the log holds 8..12
    assert resumed.last_id == ids[-1]
    await turn()
    assert again.seqs(resumed.sub) == [8, 9, 10, 11, 12]
    assert again.missed == {}  # the count came with the reply, not again as "behind"

    caught_up = again.subscribe("ch", ("r",), after=ids[-1])
    assert caught_up.missed == 0
    other_epoch = again.subscribe("ch", ("r",), after=f"{EPOCH - 1}-3")
    assert other_epoch.missed is None
    from_the_future = again.subscribe("ch", ("r",), after=f"{EPOCH}-99")
    assert from_the_future.missed is None
    await turn()
    for s in (caught_up.sub, other_epoch.sub, from_the_future.sub):
        assert again.messages[s] == []
    eng.publish("ch", ("r",), b"13")
    await turn()
    for s in (resumed.sub, caught_up.sub, other_epoch.sub, from_the_future.sub):
        assert again.seqs(s)[-1] == 13
    with pytest.raises(InvalidError):
        again.subscribe("ch", ("r",), after="not-an-id")
    with pytest.raises(InvalidError):
        again.subscribe("ch", ("r",), after={("r",): ids[0]})  # a mapping needs recursive=True


# ---------------------------------------------------------------------------- CHAN-06


# contract: CHAN-06
async def test_a_branch_hears_only_its_own_messages() -> None:
    eng = engine()
    peer = FakePeer(eng)
    a = peer.subscribe("ch", ("a",)).sub
    root = peer.subscribe("ch", ()).sub
    other_channel = peer.subscribe("other", ("a",)).sub
    eng.publish("ch", ("a",), b"a1")
    eng.publish("ch", ("a", "b"), b"ab1")
    eng.publish("ch", ("ab",), b"x")
    eng.publish("ch", (), b"root1")
    eng.publish("other", ("a",), b"o1")
    await turn()
    assert peer.payloads(a) == [b"a1"]
    assert peer.payloads(root) == [b"root1"]
    assert peer.payloads(other_channel) == [b"o1"]


# contract: CHAN-06
async def test_recursive_hears_branches_below_including_new_ones_in_order() -> None:
    eng = engine(channel_log=4)
    eng.publish("ch", ("org", "1"), b"before")
    peer = FakePeer(eng)
    rec = peer.subscribe("ch", ("org",), recursive=True, credit=0).sub
    everything = peer.subscribe("ch", (), recursive=True, credit=1000).sub
    expected: dict[tuple[str, ...], list[bytes]] = {}
    for i in range(10):
        for parts in [("org",), ("org", "1"), ("org", "2", str(i % 2)), ("orgs",)]:
            payload = b"%s/%d" % ("/".join(parts).encode(), i)
            eng.publish("ch", parts, payload)
            expected.setdefault(parts, []).append(payload)
        await asyncio.sleep(0)  # one message per branch per turn: the reading subscriber keeps up
    await turn()
    got: dict[tuple[str, ...], list[bytes]] = {}
    for m in peer.messages[everything]:
        got.setdefault(tuple(m.branch), []).append(m.payload)
    assert got == expected  # in order within each branch, branches made after the subscription too
    assert peer.missed.get(everything, 0) == 0

    peer.grant(rec, 1000)
    await turn()
    under_org = [p for p in expected if p[:1] == ("org",)]
    published = sum(len(expected[p]) for p in under_org)
    assert peer.count(rec) == published  # the missed counts add up over the branches
    assert peer.missed[rec] == published - 4 * len(under_org)
    assert all(tuple(m.branch)[:1] == ("org",) for m in peer.messages[rec])
    for parts in under_org:
        seqs = [m.seq for m in peer.messages[rec] if tuple(m.branch) == parts]
        assert seqs == sorted(seqs)


# contract: CHAN-06
async def test_recursive_resume_per_branch() -> None:
    eng = engine(channel_log=3)
    peer = FakePeer(eng)
    peer.subscribe("ch", ("t",), recursive=True)
    a = [eng.publish("ch", ("t", "a"), b"a%d" % i).id for i in range(6)]
    b = [eng.publish("ch", ("t", "b"), b"b%d" % i).id for i in range(2)]
    await turn()
    eng.drop_peer(peer)
    again = FakePeer(eng)
    resumed = again.subscribe("ch", ("t",), recursive=True, after={("t", "a"): a[0], ("t", "b"): b[1]})
    assert resumed.missed == 2  # a1, a2 are gone (the log holds a3..a5)
    await turn()
    assert again.payloads(resumed.sub) == [b"a3", b"a4", b"a5"]
    unsure = again.subscribe("ch", ("t",), recursive=True, after={("t", "a"): a[-1]})
    assert unsure.missed is None  # ("t", "b") has messages and no resume point: cannot tell


# contract: CHAN-08
async def test_a_recursive_listener_does_not_keep_idle_branches_forever() -> None:
    clock = Clock(START)
    eng = engine(clock, channel_linger=10.0)
    peer = FakePeer(eng, auto_grant=True)
    rec = peer.subscribe("ch", (), recursive=True).sub
    slow = FakePeer(eng)
    behind = slow.subscribe("ch", ("late",), recursive=True, credit=0).sub
    for i in range(200):
        eng.publish("ch", ("chat", str(i)), b"%d" % i)
        if i % 32 == 31:
            await asyncio.sleep(0)
    eng.publish("ch", ("late",), b"unread")
    await turn()
    assert eng.status()["branches"] == 202  # the root, 200 chats, "late"
    clock.advance(10)
    clock.advance(10)  # two sweeps: each branch went a whole linger without a publish
    assert eng.status()["branches"] == 1  # only "late" stays: its recursive listener has not read it yet
    eng.publish("ch", ("chat", "7"), b"again")  # made again: heard from its first message
    await turn()
    assert peer.payloads(rec)[-1] == b"again"
    assert peer.count(rec) == 202
    slow.grant(behind, 1)
    await turn()
    assert slow.payloads(behind) == [b"unread"]


# contract: CHAN-06
async def test_linger_keeps_the_log_for_a_reconnect_then_forgets() -> None:
    clock = Clock(START)
    eng = engine(clock, channel_linger=60.0)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", ("l",)).sub
    first = eng.publish("ch", ("l",), b"1")
    await turn()
    assert eng.unsubscribe(peer, sub) is True
    assert eng.unsubscribe(peer, sub) is False
    clock.advance(30)
    eng.publish("ch", ("l",), b"2")  # nobody listens, but the branch lingers: kept
    assert eng.status()["bytes"] == 2
    back = peer.subscribe("ch", ("l",), after=first.id)
    assert back.missed == 0
    await turn()
    assert peer.payloads(back.sub) == [b"2"]
    eng.drop_peer(peer)

    clock.advance(59)
    assert eng.status()["bytes"] == 2
    clock.advance(2)  # past the linger: the log goes, then the branch's state
    assert eng.status() == {
        "branches": 0,
        "subscriptions": 0,
        "peers": 0,
        "bytes": 0,
        "messages": 0,
        "bytes_limit": Limits().channel_total_bytes,
        "tombstones": 1,  # where the forgotten branch's seqs stopped
        "unheard_kept": 0,
    }
    late = FakePeer(eng).subscribe("ch", ("l",), after=first.id)
    assert late.missed is None  # the branch was forgotten: cannot tell
    assert late.last_id is None


# contract: CHAN-06
async def test_a_branch_nobody_listened_to_keeps_nothing() -> None:
    clock = Clock(START)
    eng = engine(clock, channel_linger=10.0)
    for i in range(100):
        eng.publish("ch", ("nobody",), b"x" * 100)
        eng.publish("ch", ("n", str(i)), b"y")
    assert eng.status()["bytes"] == 0
    assert eng.status()["messages"] == 0
    # a branch nobody listens to is not even made: publishing to it keeps no state at all
    assert eng.status()["branches"] == 0
    assert not eng.has_listeners("ch", ("nobody",))
    assert eng.newest_id("ch", ("nobody",)) is None
    peer = FakePeer(eng)
    late = peer.subscribe("ch", ("nobody",), after=f"{EPOCH}-50")
    assert late.missed is None  # nothing was kept, so nobody can tell how many
    assert eng.has_listeners("ch", ("nobody",))
    eng.drop_peer(peer)
    assert eng.status()["branches"] == 1  # kept for the linger after its listener left
    clock.advance(11)
    assert eng.status()["branches"] == 0  # idle state is forgotten: memory stays bounded


async def test_seqs_of_a_remade_branch_never_repeat_an_id() -> None:
    clock = Clock(START)
    eng = engine(clock, channel_linger=1.0)
    old = [eng.publish("ch", ("z",), b"") for _ in range(5)]
    clock.advance(2)
    assert eng.status()["branches"] == 0
    new = [eng.publish("ch", ("z",), b"") for _ in range(5)]
    assert [p.seq for p in new] == list(range(6, 11))  # one by one, above every seq given before
    assert not {p.id for p in old} & {p.id for p in new}
    fresh = eng.publish("ch", ("fresh",), b"")
    assert fresh.seq > 5


# ---------------------------------------------------------------------------- CHAN-08


# contract: CHAN-08
async def test_total_bound_drops_the_oldest_of_the_longest_log() -> None:
    eng = engine(channel_total_bytes=5500)
    peer = FakePeer(eng)
    sx = peer.subscribe("ch", ("x",), credit=0).sub
    sy = peer.subscribe("ch", ("y",), credit=0).sub
    for _ in range(5):
        eng.publish("ch", ("x",), b"x" * 1000)
    eng.publish("ch", ("y",), b"y" * 1000)
    eng.publish("ch", ("y",), b"y" * 1000)  # 7000 bytes: the longest log (x) gives its two oldest
    assert eng.status()["bytes"] == 5000
    peer.grant(sx, 100)
    peer.grant(sy, 100)
    await turn()
    assert peer.notices[sx] == [2]
    assert peer.seqs(sx) == [3, 4, 5]
    assert peer.seqs(sy) == [1, 2]


# contract: CHAN-08
async def test_memory_stays_bounded_over_many_branches_and_counts_stay_exact() -> None:
    clock = Clock(START)
    bound = 20_000
    eng = engine(clock, channel_total_bytes=bound, channel_log=50, channel_linger=5.0)
    peers = [FakePeer(eng) for _ in range(20)]
    subs = [p.subscribe("ch", ("b", str(i)), credit=0).sub for i, p in enumerate(peers)]
    published = [0] * 20
    for k in range(4000):
        i = (k * 7) % 20
        eng.publish("ch", ("b", str(i)), b"z" * (10 + i * 5))
        published[i] += 1
        assert eng.status()["bytes"] <= bound
        if k % 100 == 0:
            await asyncio.sleep(0)
    for p, s in zip(peers, subs, strict=True):
        p.grant(s, 10_000)
    await turn()
    for i, (p, s) in enumerate(zip(peers, subs, strict=True)):
        assert p.count(s) == published[i]
        assert p.seqs(s) == sorted(p.seqs(s))
    for p in peers:
        eng.drop_peer(p)
    clock.advance(6)
    assert eng.status()["bytes"] == 0
    assert eng.status()["branches"] == 0


# ---------------------------------------------------------------------------- limits and errors


# contract: CHAN-07
async def test_a_message_over_the_limit_is_refused_and_nothing_is_published() -> None:
    eng = engine(channel_message_bytes=100)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", ("a",)).sub
    eng.publish("ch", ("a",), b"ok")
    with pytest.raises(LimitError) as err:
        eng.publish("ch", ("a",), b"x" * 101)
    assert err.value.limit == 100 and err.value.wanted == 101
    assert "channel ch" in str(err.value)
    with pytest.raises(LimitError):
        eng.publish_many([("ch", ("a",), b"fine"), ("ch", ("a",), b"x" * 101)])
    with pytest.raises(InvalidError):
        eng.publish_many([("ch", ("a",), b"fine"), ("BAD", ("a",), b"")])
    with pytest.raises(LimitError):
        eng.publish("ch", ("never",), b"x" * 101)
    assert eng.newest_id("ch", ("never",)) is None
    assert eng.newest_id("ch", ("a",)) == f"{EPOCH}-1"
    out = eng.publish_many([("ch", ("a",), b"2"), ("ch", ("a",), b"3")])
    assert [p.seq for p in out] == [2, 3]
    await turn()
    assert peer.payloads(sub) == [b"ok", b"2", b"3"]


async def test_names_branches_and_payloads_are_checked() -> None:
    eng = engine()
    peer = FakePeer(eng)
    for bad_channel in ["", "Chat", "a b", "x" * 65]:
        with pytest.raises(InvalidError):
            eng.publish(bad_channel, (), b"")
        with pytest.raises(InvalidError):
            peer.subscribe(bad_channel)
    for bad_branch in [("",), ("x" * 257,), (7,), (["a"],), "abc", None]:
        with pytest.raises(InvalidError):
            eng.publish("ch", bad_branch, b"")  # type: ignore[arg-type]
        with pytest.raises(InvalidError):
            peer.subscribe("ch", bad_branch)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        eng.publish("ch", (), "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        eng.subscribe(peer, "ch", (), credit=-1)
    with pytest.raises(InvalidError):
        eng.grant(peer, 1, -5)
    assert eng.publish("ch", ["x" * 256], bytearray(b"ok")).seq == 1  # type: ignore[arg-type]
    assert eng.status()["subscriptions"] == 0


async def test_subscriptions_per_store_are_bounded() -> None:
    eng = engine(subscriptions=3)
    peer = FakePeer(eng)
    subs = [peer.subscribe("ch", (str(i),)).sub for i in range(3)]
    with pytest.raises(LimitError) as err:
        peer.subscribe("ch", ("more",))
    assert err.value.limit == 3 and err.value.wanted == 4
    eng.unsubscribe(peer, subs[0])
    peer.subscribe("ch", ("more",))


# ---------------------------------------------------------------------------- ending subscriptions


# contract: CHAN-08
async def test_drop_peer_and_closed_peers_free_everything() -> None:
    clock = Clock(START)
    eng = engine(clock, channel_linger=1.0)
    gone = FakePeer(eng)
    stays = FakePeer(eng)
    for i in range(5):
        gone.subscribe("ch", (str(i),))
    s_stays = stays.subscribe("ch", ("0",)).sub
    gone.subscribe("ch", (), recursive=True)
    assert eng.status()["subscriptions"] == 7
    assert eng.status()["peers"] == 2
    gone.closed = True  # the engine notices at its next delivery and cleans it
    eng.publish("ch", ("0",), b"m")
    await turn()
    assert eng.status()["subscriptions"] == 1
    assert stays.payloads(s_stays) == [b"m"]
    eng.drop_peer(gone)  # idempotent
    eng.grant(stays, 999, 1)  # an unknown subscription: ignored
    assert eng.unsubscribe(gone, s_stays) is False  # not its subscription
    eng.drop_peer(stays)
    clock.advance(2)
    assert eng.status()["subscriptions"] == 0
    assert eng.status()["branches"] == 0
    with pytest.raises(ClosedError):
        eng.subscribe(gone, "ch", ())


async def test_close_stops_everything() -> None:
    eng = engine()
    peer = FakePeer(eng)
    peer.subscribe("ch")
    eng.publish("ch", (), b"x")
    eng.close()
    await turn()
    assert peer.deliveries == []
    with pytest.raises(ClosedError):
        eng.publish("ch", (), b"x")
    with pytest.raises(ClosedError):
        peer.subscribe("ch")


# ---------------------------------------------------------------------------- wire shape


async def test_bodies_round_trip_through_msgpack() -> None:
    eng = engine(channel_log=2)
    peer = FakePeer(eng)
    sub = peer.subscribe("ch", ("a", "b")).sub
    for i in range(4):
        eng.publish("ch", ("a", "b"), b"\x00%d" % i)
    await turn()
    delivery = peer.deliveries[0]
    wire = msgspec.msgpack.encode(delivery)
    assert msgspec.msgpack.decode(wire) == [
        sub,
        [
            ["missed", "behind", 2, None],  # skipped: None (not a recursive subscription)
            ["msg", 3, f"{EPOCH}-3", ["a", "b"], b"\x002"],
            ["msg", 4, f"{EPOCH}-4", ["a", "b"], b"\x003"],
        ],
    ]
    assert msgspec.msgpack.decode(wire, type=Delivery) == delivery
    published = eng.publish("ch", ("a", "b"), b"")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(published), type=Published) == published
    subscribed = eng.subscribe(peer, "ch", ("a", "b"), after=published.id)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(subscribed), type=Subscribed) == subscribed


# ---------------------------------------------------------------------------- properties (CHAN-02, CHAN-08)

BRANCHES: list[Branch] = [(), ("a",), ("a", "b"), ("a", "c"), ("d",)]
PROP_LIMITS = {
    "channel_log": 4,
    "channel_log_bytes": 40,
    "channel_total_bytes": 70,
    "channel_linger": 10.0,
    "channel_message_bytes": 16,
}

op = st.one_of(
    st.tuples(st.just("pub"), st.integers(0, len(BRANCHES) - 1), st.integers(0, 16)),
    st.tuples(st.just("pubmany"), st.integers(0, len(BRANCHES) - 1), st.integers(1, 6)),
    st.tuples(st.just("sub"), st.integers(0, len(BRANCHES) - 1), st.booleans(), st.integers(0, 5)),
    st.tuples(st.just("grant"), st.integers(0, 30), st.integers(0, 6)),
    st.tuples(st.just("unsub"), st.integers(0, 30)),
    st.tuples(st.just("drop"), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 3.0, 11.0])),
)


def covers(sub_branch: Branch, recursive: bool, branch: Branch) -> bool:
    return branch == sub_branch or (recursive and branch[: len(sub_branch)] == sub_branch)


# contract: CHAN-02
# contract: CHAN-08
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=80))
def test_property_delivered_plus_missed_equals_published(ops: list[tuple[Any, ...]]) -> None:
    # no running loop here: the engine flushes before each call returns
    clock = Clock(START)
    eng = engine(clock, **PROP_LIMITS)
    peers = [FakePeer(eng) for _ in range(3)]
    live: list[tuple[FakePeer, int, Branch, bool]] = []
    published_after: dict[int, int] = {}
    for step, o in enumerate(ops):
        kind = o[0]
        if kind in ("pub", "pubmany"):
            branch = BRANCHES[o[1]]
            count = o[2] if kind == "pubmany" else 1
            if kind == "pub":
                eng.publish("ch", branch, b"p" * o[2])
            else:
                eng.publish_many([("ch", branch, b"%d" % step)] * count)
            for _, s, sb, rec in live:
                if covers(sb, rec, branch):
                    published_after[s] += count
        elif kind == "sub":
            peer = peers[len(live) % 3]
            branch, rec, credit = BRANCHES[o[1]], o[2], o[3]
            s = peer.subscribe("ch", branch, recursive=rec, credit=credit).sub
            live.append((peer, s, branch, rec))
            published_after[s] = 0
        elif kind == "grant" and live:
            peer, s, _, _ = live[o[1] % len(live)]
            peer.grant(s, o[2])
        elif kind == "unsub" and live:
            peer, s, _, _ = live.pop(o[1] % len(live))
            assert eng.unsubscribe(peer, s)
        elif kind == "drop":
            gone = peers[o[1]]
            eng.drop_peer(gone)
            live = [x for x in live if x[0] is not gone]
        elif kind == "advance":
            clock.advance(o[1])
        status = eng.status()
        assert status["bytes"] <= PROP_LIMITS["channel_total_bytes"]
        assert status["subscriptions"] == len(live)
        for peer, s, _, _ in live:
            assert peer.count(s) <= published_after[s]
            assert len(peer.messages[s]) <= peer.granted[s]
    for peer, s, _, _ in live:
        while peer.count(s) < published_after[s]:  # one credit at a time: each grant must bring something
            before = peer.count(s)
            peer.grant(s, 1)
            assert peer.count(s) > before, "a grant with messages pending delivered nothing"
        peer.grant(s, 10_000)
    for peer, s, _, _ in live:
        assert peer.count(s) == published_after[s], (s, peer.messages[s], peer.missed.get(s))
        per_branch: dict[tuple[str, ...], list[int]] = {}
        for m in peer.messages[s]:
            per_branch.setdefault(tuple(m.branch), []).append(m.seq)
        for seqs in per_branch.values():
            assert seqs == sorted(set(seqs))  # in order, none twice
    for peer in peers:
        eng.drop_peer(peer)
    clock.advance(25)
    assert eng.status()["branches"] == 0
    assert eng.status()["bytes"] == 0
    assert eng.status()["messages"] == 0


# ---------------------------------------------------------------------------- grant_many, malformed ids


async def test_grant_many_applies_each_grant_as_grant_does() -> None:
    eng = engine()
    a = FakePeer(eng)
    other = FakePeer(eng)
    s1 = a.subscribe("ch", ("1",), credit=0).sub
    s2 = a.subscribe("ch", ("2",), credit=0).sub
    s3 = a.subscribe("ch", ("3",), credit=0).sub
    foreign = other.subscribe("ch", ("1",), credit=0).sub
    for branch in ("1", "2", "3"):
        for i in range(5):
            eng.publish("ch", (branch,), str(i).encode())
    await turn()
    assert a.deliveries == [] and other.deliveries == []
    # one call for several subscriptions; one listed twice adds up; unknown and foreign ones are ignored
    grants = [(s1, 2), (s2, 5), (s1, 1), (999, 7), (foreign, 4)]
    for sub, n in grants:
        if sub in a.granted:
            a.granted[sub] += n
    eng.grant_many(a, grants)
    await turn()
    assert a.payloads(s1) == ints(range(3))
    assert a.payloads(s2) == ints(range(5))
    assert a.payloads(s3) == []
    assert other.payloads(foreign) == []  # a's grant for other's subscription did nothing
    assert len(a.deliveries) == 2  # one delivery per subscription


async def test_grant_many_with_a_bad_credit_applies_none() -> None:
    eng = engine()
    peer = FakePeer(eng)
    s1 = peer.subscribe("ch", ("1",), credit=0).sub
    s2 = peer.subscribe("ch", ("2",), credit=0).sub
    eng.publish("ch", ("1",), b"x")
    eng.publish("ch", ("2",), b"y")
    for bad in (-1, 1.5, "3", None):
        with pytest.raises(InvalidError, match="credit is an int >= 0"):
            eng.grant_many(peer, [(s1, 1), (s2, bad)])  # type: ignore[list-item]
    await turn()
    assert peer.deliveries == []  # nothing of the refused calls was applied
    peer.granted[s1] += 1
    eng.grant_many(peer, [(s1, 1)])
    await turn()
    assert peer.payloads(s1) == [b"x"] and peer.payloads(s2) == []


def test_grant_many_without_a_loop_delivers_before_it_returns() -> None:
    eng = engine()
    peer = FakePeer(eng)
    s = peer.subscribe("ch", credit=0).sub
    eng.publish("ch", (), b"a")
    peer.granted[s] += 1
    eng.grant_many(peer, [(s, 1)])
    assert peer.payloads(s) == [b"a"]


@pytest.mark.parametrize(
    "bad",
    [
        "9" * 5000 + "-1",  # past Python's int-conversion digit limit: was a ValueError
        "1-" + "9" * 5000,
        "9" * 31 + "-1",  # one digit too many
        "1-" + "9" * 31,
        "-".join(["1"] * 3000),
        "1-",
        "-1",
        "",
        "x-1",
        "١-٢",  # non-ASCII digits
        "1_000-1",
        " 1-1",
        7,
        ["1-1"],
    ],
)
def test_a_malformed_or_huge_after_id_is_invalid_naming_channel_and_id(bad: object) -> None:
    eng = engine()
    peer = FakePeer(eng)
    with pytest.raises(InvalidError) as err:
        eng.subscribe(peer, "chat-events", ("7",), after=bad)  # type: ignore[arg-type]
    text = err.value.message
    assert "channel chat-events" in text and "after" in text
    assert len(text) < 200, text  # the id is cut short, never copied whole into the message
    if isinstance(bad, str) and len(bad) > 100:
        assert f"({len(bad)} characters)" in text
    with pytest.raises(InvalidError) as err:
        eng.subscribe(peer, "chat-events", (), recursive=True, after={("7",): bad})  # type: ignore[dict-item]
    assert "channel chat-events" in err.value.message and len(err.value.message) < 200
    if not isinstance(bad, str):
        with pytest.raises(InvalidError) as err:
            eng.subscribe(peer, "chat-events", (), recursive=True, after=bad)  # type: ignore[arg-type]
        assert "channel chat-events" in err.value.message
    assert eng.status()["subscriptions"] == 0


def test_well_formed_ids_up_to_30_digits_are_accepted() -> None:
    eng = engine()
    peer = FakePeer(eng)
    eng.publish("ch", (), b"a")  # no listener: keeps nothing
    other_epoch = peer.subscribe("ch", after="9" * 30 + "-" + "9" * 30)
    assert other_epoch.missed is None  # from another epoch: cannot tell
    far = peer.subscribe("ch", after=f"{EPOCH}-" + "0" * 29 + "1")
    assert far.missed in (0, None)


# contract: CHAN-08
# contract: CHAN-02
async def test_a_full_peer_is_sent_nothing_until_it_can_take_more_then_told_exactly() -> None:
    eng = engine(channel_log=100)
    full = FakePeer(eng, auto_grant=True)
    other = FakePeer(eng, auto_grant=True)
    subs = [full.subscribe("ch", ("b",)).sub for _ in range(3)]
    s_other = other.subscribe("ch", ("b",)).sub
    eng.publish("ch", ("b",), b"0")
    await turn()
    eng.peer_full(full, True)  # its connection's buffer passed the high-water mark
    for i in range(1, 251):
        eng.publish("ch", ("b",), b"%d" % i)
        await asyncio.sleep(0)
    await turn()
    assert all(full.seqs(s) == [1] for s in subs), "a full peer was pushed more"
    assert other.seqs(s_other) == list(range(1, 252))  # the others get everything meanwhile
    eng.peer_full(full, False)
    await turn()
    for s in subs:
        assert full.notices[s] == [150]  # the log of 100 kept 152..251 of 2..251
        assert full.seqs(s) == [1, *range(152, 252)]
        assert full.count(s) == 251


async def test_a_branch_part_over_the_limit_is_named_by_its_start_and_length() -> None:
    # trial CX: a part of 10,000 characters was echoed whole in the error
    e = engine()
    with pytest.raises(InvalidError) as caught:
        e.publish("c", ("ok", "x" * 10_000), b"1")
    message = caught.value.message
    assert len(message) < 300 and "a part of 10000 characters" in message, message
    assert "'" + "x" * 40 + "…'" in message
