"""The channels SDK beyond the contracts: warnings, stop, publish batching, limits, recursive resume, the CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError, LimitError, Limits, Message, Missed

from ..helpers import open_store
from .support import Heard, cli_subscriber, drop, eventually, publish_all, second_store, subscriptions


async def test_missed_without_on_missed_is_a_rate_limited_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="tinystore.channels")
    # each burst of publishes in one turn of the loop, however slow the machine (an embedded store's calls let the
    # loop turn after 5 ms of one: the subscriber then takes some of a burst, and misses fewer)
    import tinystore.client.transport as transport_module

    monkeypatch.setattr(transport_module, "INLINE_TURN_SECONDS", 60.0)
    async with open_store("embedded", tmp_path / "s", limits=Limits(channel_log=5)) as store:
        ch = store.channel("n", int)
        heard = Heard()
        sub = await ch.subscribe(heard.on_message)
        for burst in range(1, 4):  # three bursts, each past the log: three gaps
            await publish_all(ch, range(100), chunk=100)
            await eventually(lambda n=100 * burst: sub.handled + sub.missed == n)  # type: ignore[misc]
        warnings = [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
        assert len(warnings) == 1 and "behind" in warnings[0]
        assert sub.missed == 3 * 95
        await sub.stop()


async def test_a_miss_of_unknown_size_is_told_in_words(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # trial U: the warning read "missed None messages (behind)"
    caplog.set_level(logging.WARNING, logger="tinystore.channels")
    async with open_store("embedded", tmp_path / "s") as store:
        sub = await store.channel("n", int).subscribe(lambda m: None)
        await sub._tell_missed(Missed("behind", None))
        warnings = [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
        assert len(warnings) == 1 and "missed an unknown number of messages (behind)" in warnings[0], warnings
        await sub.stop()


@pytest.mark.parametrize("bad", ["no", 0, None])
async def test_recursive_takes_only_a_bool(tmp_path: Path, bad: Any) -> None:
    # trial U: an embedded store went by the truthiness of recursive="no"; a private one refused it with a
    # decoder's message that named no channel
    async with open_store("embedded", tmp_path / "s") as store:
        ch = store.channel("n", int)
        with pytest.raises(InvalidError, match=rf"^channel n: subscribe: recursive {bad!r}: expected True or False"):
            await ch.subscribe(lambda m: None, recursive=bad)
        with pytest.raises(InvalidError, match=rf"^channel n: each: recursive {bad!r}: expected True or False"):
            ch.each(recursive=bad)
        assert (await store.status())["channels"]["subscriptions"] == 0


async def test_stop_from_inside_the_handler_and_from_outside(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        ch = store.channel("n", int)
        seen: list[int] = []
        holder: list[tinystore.Subscription[int]] = []

        async def handler(m: Message[int]) -> None:
            seen.append(m.value)
            if m.value == 2:
                await holder[0].stop()  # from inside: this call finishes, nothing follows
                seen.append(-1)

        holder.append(await ch.subscribe(handler))
        for v in range(1, 6):
            await ch.publish(v)
        await eventually(lambda: -1 in seen)
        await asyncio.sleep(0.05)
        assert seen == [1, 2, -1]
        assert not holder[0].active

        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def forever(m: Message[int]) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        sub = await ch.subscribe(forever)
        await ch.publish(9)
        await started.wait()
        await asyncio.wait_for(sub.stop(), 5)  # from outside: the running handler is cancelled
        assert cancelled.is_set()
        assert await subscriptions(store) == 0


async def test_a_batch_refused_by_the_server_fails_only_the_bad_publish(tmp_path: Path) -> None:
    """The SDK checks with its own limits; a server with a smaller bound refuses, and only that one fails."""
    async with open_store("sidecar", tmp_path / "s", limits=Limits(channel_message_bytes=100)) as small:
        async with second_store(small) as store:  # this one believes the limit is 64 KiB
            ch = store.channel("n")
            heard = Heard()
            sub = await small.channel("n").subscribe(heard.on_message)
            results = await asyncio.gather(
                ch.publish("a"), ch.publish("x" * 500), ch.publish("b"), return_exceptions=True
            )
            assert isinstance(results[1], LimitError)
            assert isinstance(results[0], str) and isinstance(results[2], str)
            await eventually(lambda: heard.values == ["a", "b"])
            await sub.stop()


async def test_subscriptions_per_store_are_bounded(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", limits=Limits(subscriptions=3)) as store:
        ch = store.channel("n")
        subs = [await ch.subscribe(lambda m: None) for _ in range(3)]
        with pytest.raises(LimitError):
            await ch.subscribe(lambda m: None)
        await subs[0].stop()
        subs[0] = await ch.subscribe(lambda m: None)
        for s in subs:
            await s.stop()


async def test_tx_channel_of_another_store_and_subscribe_misuse(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "a") as a, open_store("embedded", tmp_path / "b") as b:
        db = await a.database("app")

        async def fn(tx: tinystore.SqlTx) -> None:
            with pytest.raises(InvalidError):
                tx.with_(b.channel("x"))

        await db.tx(fn)
        with pytest.raises(InvalidError):
            await a.channel("x").subscribe(lambda m: None, after={("a",): "1-1"})  # a mapping needs recursive


async def test_recursive_subscription_resumes_after_a_reconnect(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "s") as store:
        ch = store.channel("org")
        heard = Heard()
        sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed, recursive=True)
        await ch.under("a").publish(1)
        await ch.under("b").publish(2)
        await eventually(lambda: len(heard.values) == 2)
        await drop(store)
        await ch.under("a").publish(3)
        await ch.under("b", "c").publish(4)
        await eventually(lambda: len(heard.values) == 4, what="the messages after the reconnect")
        assert heard.values[:2] == [1, 2]
        assert sorted(heard.values[2:]) == [3, 4]
        assert len(heard.notices) == 1 and heard.notices[0].reason == "reconnect"
        # no duplicates; the count is exact or, when a branch it never heard from has messages, None
        assert heard.notices[0].count in (0, None)
        assert sub.reconnects == 1
        await sub.stop()


async def test_messages_and_missed_are_values() -> None:
    m = Message(value={"a": 1}, branch=["7"], seq=3, id="1-3")
    assert m == Message({"a": 1}, ["7"], 3, "1-3")
    assert Missed("behind", 2) == Missed("behind", 2) != Missed("reconnect", 2)
    assert "Missed" in repr(Missed("reconnect", None))


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinystore", "channels", *args], capture_output=True, text=True, timeout=timeout
    )


async def test_cli_publish_and_subscribe(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:  # serves its socket: the CLI connects to it
        directory = str(store.directory)
        async with cli_subscriber(store, "chat-events/7") as listener:
            done = await asyncio.to_thread(_cli, directory, "publish", "chat-events/7", '{"kind": "message", "id": 1}')
            assert done.returncode == 0, done.stderr
            published = json.loads(done.stdout)
            assert published["seq"] == 1 and published["id"].endswith("-1")
            await store.channel("chat-events").under(7).publish("héllo\nworld")
            bad = await asyncio.to_thread(_cli, directory, "publish", "Bad/7", "1")
            assert bad.returncode == 1 and "error[invalid]" in bad.stderr
            not_json = await asyncio.to_thread(_cli, directory, "publish", "chat-events/7", "{nope")
            assert not_json.returncode != 0
            assert listener.stdout is not None
            lines: list[Any] = []
            for _ in range(2):
                line = await asyncio.wait_for(asyncio.to_thread(listener.stdout.readline), 20)
                lines.append(json.loads(line))
            assert lines[0] == {"id": published["id"], "seq": 1, "branch": ["7"], "value": {"kind": "message", "id": 1}}
            assert lines[1]["value"] == "héllo\nworld" and lines[1]["seq"] == 2


# contract: CHAN-01
async def test_a_publish_cancelled_before_its_batch_went_is_not_published(tmp_path: Path) -> None:
    # trial IV: a publish of a loop turn's batch, cancelled before the batch was sent, was published all the same
    async with open_store("private", tmp_path / "s") as store:
        ch = store.channel("events", dict)
        heard: list[str] = []
        sub = await ch.subscribe(lambda m: heard.append(m.value["v"]))
        try:
            first = asyncio.ensure_future(ch.publish({"v": "first"}))  # (in flight: the next go in a batch)
            await asyncio.sleep(0)
            batched = [asyncio.ensure_future(ch.publish({"v": v})) for v in ("a", "cancelled", "b")]
            await asyncio.sleep(0)  # (each in the batch, which goes a turn later)
            batched[1].cancel()
            await first
            ids = [await batched[0], await batched[2]]
            last = await ch.publish({"v": "last"})
            await eventually(lambda: "last" in heard)
        finally:
            await sub.stop()
        assert heard == ["first", "a", "b", "last"], heard
        assert batched[1].cancelled() and len({*ids, last}) == 3
