"""`tinystore channels DIR subscribe` in one terminal, `publish` in another, with no server running first."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import tinystore

from ..helpers import ServerProcess, stop_sidecar


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinystore", *args]


async def test_subscribe_then_publish_from_two_commands_without_a_server(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    # the command line refuses a directory that holds no store: make one (and let it go)
    made = await tinystore.open(directory, embedded=True, serve=False)
    await made.close()
    listener = subprocess.Popen(
        _cli("channels", str(directory), "subscribe", "c/7", "--for", "30s"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the listener starts the directory's server (a sidecar) and subscribes; a publish from another command
        # reaches it (a listener owning the directory itself would refuse the publisher with InUseError)
        assert listener.stdout is not None
        line_task = asyncio.ensure_future(asyncio.to_thread(listener.stdout.readline))
        for _ in range(100):
            done = await asyncio.to_thread(
                subprocess.run, _cli("channels", str(directory), "publish", "c/7", '{"id": 1}'),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if done.returncode != 0:  # the listener's sidecar is starting: it owns the directory already
                assert "error[in_use]" in done.stderr, done.stderr
                await asyncio.sleep(0.2)
                continue
            try:
                line = await asyncio.wait_for(asyncio.shield(line_task), 0.5)
                break
            except TimeoutError:
                assert listener.poll() is None, listener.stderr.read() if listener.stderr else ""
        else:
            raise AssertionError("the subscriber heard nothing")
        got = json.loads(line)
        assert got["branch"] == ["7"] and got["value"] == {"id": 1}
    finally:
        listener.terminate()
        await asyncio.to_thread(listener.wait, 20)
        await stop_sidecar(directory)


async def test_subscribe_for_ends_on_time_when_its_server_went_away(tmp_path: Path) -> None:
    """`subscribe --for 3s` on a `tinystore serve` that stops a second in: the command waits for the server
    (it may come back) until --for ends, then ends at once; it used to wait out the SDK's reconnect (30 s more)
    to tell a server that is not there to forget the subscription."""
    import time

    from ..helpers import ServerProcess

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        started = time.monotonic()
        listener = subprocess.Popen(
            _cli("channels", str(directory), "subscribe", "c/7", "--for", "3s"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        await asyncio.sleep(1.0)
        server.stop()
        _out, err = await asyncio.to_thread(listener.communicate, timeout=60)
        took = time.monotonic() - started
        assert listener.returncode == 0, err
        assert took < 10, f"ended {took:.1f}s after it started, for --for 3s"
    finally:
        server.stop()


async def test_a_subscription_stopped_while_its_store_is_away_stops_at_once(tmp_path: Path) -> None:
    from ..helpers import ServerProcess

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        store = await tinystore.open(directory)
        try:
            sub = await store.channel("c").subscribe(lambda m: None)
            server.stop()
            async with asyncio.timeout(3):  # not reconnect_timeout (30 s): the store ended it with the connection
                await sub.stop()
            assert not sub.active
        finally:
            async with asyncio.timeout(3):
                await store.close()
    finally:
        server.stop()


def test_publish_refuses_nan_as_text_that_is_not_json(tmp_path: Path) -> None:
    # (trial CR: Python's json reads NaN, and the store refused it later: exit 1, where text that is not JSON is a
    # usage error, exit 2, sending nothing)
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    for text in ("NaN", "[1, Infinity]", '{"a": -Infinity}'):
        done = subprocess.run(
            _cli("channels", str(directory), "publish", "news", text), capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 2, done.stderr
        assert "is not JSON (RFC 8259 has no NaN or infinities)" in done.stderr


async def test_a_branch_part_with_a_slash_is_reached_escaped(tmp_path: Path) -> None:
    """Trial EF: the SDK's under("a/b") could not be reached from the command line (c/a/b is under("a", "b"))."""
    from tinystore.cli.channels import split_target
    from tinystore.errors import InvalidError

    assert split_target("c/a%2Fb/x%25y") == ("c", ["a/b", "x%y"])
    assert split_target("c/a/b") == ("c", ["a", "b"])
    for bad in ("c/a%2", "c/a%zz", "c/%ff"):
        try:
            split_target(bad)
        except InvalidError as exc:
            assert "escape" in exc.message or "UTF-8" in exc.message
        else:
            raise AssertionError(bad)
    directory = tmp_path / "s"
    server = ServerProcess(directory).start()
    store = await tinystore.open(directory)
    try:
        heard: list[tuple[list[str], object]] = []
        sub = await store.channel("c").under("a/b").subscribe(lambda m: heard.append((m.branch, m.value)))
        done = await asyncio.to_thread(
            subprocess.run,
            _cli("channels", str(directory), "publish", "c/a%2Fb", '"cli"'),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        async with asyncio.timeout(10):
            while not heard:
                await asyncio.sleep(0.01)
        assert heard == [(["a/b"], "cli")]
        await sub.stop()
    finally:
        await store.close()
        server.stop()


# contract: CHAN-01
def test_a_publish_with_no_server_says_nobody_heard_it(tmp_path: Path) -> None:
    """Trial HT: with no server running, `publish` printed its id and said nothing, as if someone had heard it."""
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    done = subprocess.run(
        _cli("channels", str(directory), "publish", "news", '{"a": 1}'), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["seq"] == 1
    assert "no server runs" in done.stderr and "nobody hears it" in done.stderr, done.stderr
