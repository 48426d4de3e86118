"""``tinystore channels DIR publish NAME[/BRANCH…] JSON`` and ``tinystore channels DIR subscribe NAME[/BRANCH…]``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import select
import stat
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ..durations import seconds
from ..errors import InvalidError, TinystoreError
from . import (
    Address,
    DirGroup,
    Target,
    UserPath,
    connect_address,
    fail,
    open_for_cli,
    pass_store_dir,
    run_async,
    silence_stdout,
    to_json,
)


def _no_constant(name: str) -> Any:
    """``json.loads``' ``parse_constant``: ``NaN``, ``Infinity`` and ``-Infinity`` are no JSON (RFC 8259)."""
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or infinities)")


def split_target(target: str) -> tuple[str, list[str]]:
    """``"chat-events/7/typing"`` → ``("chat-events", ["7", "typing"])``. A part is percent-decoded as a URL's
    path segment is (RFC 3986): ``%2F`` for a ``/`` inside a part (an SDK's ``under("a/b")``: trial EF, the
    command line could not reach it), ``%25`` for a ``%``. Raises ``InvalidError`` for an empty branch part
    (``"a//b"``, a trailing ``/``) or a ``%`` not followed by two hex digits."""
    name, *parts = target.split("/")
    if any(not p for p in parts):
        raise InvalidError(f"channel {target!r}: a branch part is empty (write NAME/BRANCH/...)")
    return name, [_unescape(target, p) for p in parts]


def _unescape(target: str, part: str) -> str:
    if "%" not in part:
        return part
    if re.search(r"%(?![0-9A-Fa-f]{2})", part):
        raise InvalidError(
            f"channel {target!r}: branch part {part!r}: a % begins an escape of two hex digits (%2F for a /, "
            "%25 for a %)"
        )
    try:
        return urllib.parse.unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise InvalidError(f"channel {target!r}: branch part {part!r}: its escapes are not UTF-8") from None


@contextlib.contextmanager
def when_stdout_reader_gone(on_gone: Callable[[], None]) -> Iterator[None]:
    """While the block runs, call ``on_gone`` (on the running loop) once the reader of stdout closed it, when
    stdout is a pipe: `subscribe | head -1` ends when `head` has its line, even if nothing more is published
    (so that no write finds the pipe closed).

    A thread waits in ``poll`` on the pipe's write end for POLLERR, which comes when its last reader closed it
    and only then (it asks for no event, so a FIFO this process also reads from never wakes it). Not the loop's
    ``add_reader``: uvloop would make stdout non-blocking, for every process that shares it."""
    try:
        fd = sys.stdout.fileno()
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):
        is_pipe = False
    if not is_pipe:
        yield
        return
    loop = asyncio.get_running_loop()
    wake_r, wake_w = os.pipe()

    def watch() -> None:
        try:
            poller = select.poll()
            poller.register(fd, 0)
            poller.register(wake_r, select.POLLIN)
            ready = dict(poller.poll())
        finally:
            os.close(wake_r)
        if ready.get(fd, 0) & select.POLLERR:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                loop.call_soon_threadsafe(on_gone)

    watcher = threading.Thread(target=watch, daemon=True, name="tinystore-stdout-watch")
    watcher.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # the watcher already ended (and closed its end)
            os.write(wake_w, b"x")
        os.close(wake_w)
        watcher.join()


def register(main: click.Group) -> None:
    @main.group(cls=DirGroup)
    @click.argument("directory", type=UserPath(file_okay=False, path_type=Path, remote=True))
    @click.pass_context
    def channels(ctx: click.Context, directory: Target) -> None:
        """Publish on and listen to the channels of DIRECTORY, which must exist (`tinystore serve DIRECTORY`
        makes a store there). `subscribe` reaches the directory's server, starting one when none runs (a
        sidecar, which exits once idle); `publish` reaches the server when one runs, else publishes on the
        store opened in this command, where nobody can be listening. DIRECTORY may be a server's tcp://HOST:PORT
        or tls://HOST:PORT, with its token in $TINYSTORE_TOKEN."""
        ctx.obj = directory

    @channels.command()
    @click.argument("target", metavar="NAME[/BRANCH...]")
    @click.argument("value", metavar="JSON")
    @pass_store_dir
    def publish(directory: Target, target: str, value: str) -> None:
        """Publish the JSON VALUE on channel NAME (under BRANCH...); prints {"id": ..., "seq": ...}. A branch part
        with a / in it is written with %2F (and a % as %25).

        Through the directory's server when one runs; else on the store opened in this command, where nobody
        hears it (no server is started)."""
        try:
            data = json.loads(value, parse_constant=_no_constant)  # (NaN is no JSON: a usage error, exit 2)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="JSON") from None

        alone = False

        async def go() -> str:
            nonlocal alone
            name, parts = split_target(target)
            store = await open_for_cli(directory)
            try:
                alone = store._core is not None
                mid: str = await store.channel(name).under(*parts).publish(data)
                return mid
            finally:
                await store.close()

        mid = run_async(go)
        click.echo(to_json({"id": mid, "seq": int(mid.rpartition("-")[2])}))
        if alone:
            # (trial HT: it said nothing, as if someone heard it)
            click.echo(
                "no server runs: published on the store this command opened itself, where nobody hears it (a "
                "subscriber, such as `tinystore channels DIR subscribe NAME`, starts the directory's server)",
                err=True,
            )

    @channels.command()
    @click.argument("target", metavar="NAME[/BRANCH...]")
    @click.option("--for", "for_", default=None, help="Stop after this long (30s, 1m, ...); default: until Ctrl-C.")
    @click.option("--recursive", is_flag=True, help="Also hear every branch below.")
    @click.option("--after", default=None, help="Resume after this message id.")
    @pass_store_dir
    def subscribe(directory: Target, target: str, for_: str | None, recursive: bool, after: str | None) -> None:
        """Print each message of channel NAME (under BRANCH...) as one JSON line
        ({"id", "seq", "branch", "value"}), and each missed notice as {"missed": {"reason", "count"}}. A branch part
        with a / in it is written with %2F (and a % as %25).

        Reaches the directory's server, starting one when none runs (a sidecar, which exits once idle), so that
        `publish` in other commands reaches it. Ends after --for, on Ctrl-C, or once its output is closed (as
        `| head -1` does), with status 0; when the store ends it (its directory gone, another store there now),
        with status 1 and why."""
        try:
            limit = seconds(for_, "--for") if for_ else None
        except TinystoreError as exc:
            fail(exc)

        async def go() -> None:
            import tinystore

            name, parts = split_target(target)
            output_gone = asyncio.Event()
            failed: list[OSError] = []

            def reader_gone() -> None:
                silence_stdout()
                output_gone.set()

            def out(obj: Any) -> None:
                if output_gone.is_set():
                    return
                try:
                    sys.stdout.write(to_json(obj) + "\n")
                    sys.stdout.flush()
                except BrokenPipeError:  # the reader is gone: the subscription ends, quietly
                    reader_gone()
                except OSError as exc:
                    # (trial DU: a full disk was logged, with a traceback, at each message, and the subscription
                    # went on, dropping them): it ends, told as any command's output that cannot be written
                    failed.append(exc)
                    silence_stdout()
                    output_gone.set()

            # the directory's server, started when none runs (as `tinystore lock hold` does): a listener that
            # owned the directory itself would shut out the publishers it waits for
            if isinstance(directory, Address):
                store = await connect_address(directory, reconnect_timeout=30.0)  # (told of a restart: "reconnect")
            else:
                store = await tinystore.open(directory)
            try:
                branch = store.channel(name).under(*parts)
                sub = await branch.subscribe(
                    lambda m: out({"id": m.id, "seq": m.seq, "branch": m.branch, "value": m.value}),
                    on_missed=lambda m: out({"missed": {"reason": m.reason, "count": m.count}}),
                    recursive=recursive,
                    after=after,
                )

                async def ended() -> None:
                    # the store ended it (gone from its path, another store there now: trial EE, the command said
                    # so in its log and went on waiting for ever)
                    while sub.active:
                        await asyncio.sleep(0.2)

                watch = asyncio.ensure_future(ended())
                gone = asyncio.ensure_future(output_gone.wait())
                try:
                    with when_stdout_reader_gone(reader_gone), contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(limit):  # None: until Ctrl-C
                            await asyncio.wait([watch, gone], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (watch, gone):
                        task.cancel()
                    await asyncio.gather(watch, gone, return_exceptions=True)
                    await sub.stop()
            finally:
                await store.close()
            if failed:
                raise failed[0]
            if sub._failure is not None:
                raise sub._failure

        try:
            run_async(go)
        except KeyboardInterrupt:
            pass
