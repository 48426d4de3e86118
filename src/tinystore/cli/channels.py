"""``tinystore channels DIR publish NAME[/BRANCH…] JSON`` and ``tinystore channels DIR subscribe NAME[/BRANCH…]``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from ..durations import seconds
from ..errors import InvalidError, TinystoreError
from . import fail, open_for_cli, run_async, to_json


def split_target(target: str) -> tuple[str, list[str]]:
    """``"chat-events/7/typing"`` → ``("chat-events", ["7", "typing"])``. Raises ``InvalidError`` for an
    empty branch part (``"a//b"``, a trailing ``/``)."""
    name, *parts = target.split("/")
    if any(not p for p in parts):
        raise InvalidError(f"channel {target!r}: a branch part is empty (write NAME/BRANCH/...)")
    return name, parts


def register(main: click.Group) -> None:
    @main.group()
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @click.pass_context
    def channels(ctx: click.Context, directory: Path) -> None:
        """Publish on and listen to the channels of DIRECTORY. `subscribe` reaches the directory's server (started
        when none runs, as a sidecar that stops once idle); `publish` reaches it when one runs (else nobody can
        be listening: the message is published on a store embedded in the command)."""
        ctx.obj = directory

    @channels.command()
    @click.argument("target", metavar="NAME[/BRANCH...]")
    @click.argument("value", metavar="JSON")
    @click.pass_obj
    def publish(directory: Path, target: str, value: str) -> None:
        """Publish the JSON VALUE on channel NAME (under BRANCH...); prints {"id": ..., "seq": ...}."""
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="JSON") from None

        async def go() -> str:
            name, parts = split_target(target)
            store = await open_for_cli(directory)
            try:
                mid: str = await store.channel(name).under(*parts).publish(data)
                return mid
            finally:
                await store.close()

        mid = run_async(go)
        click.echo(to_json({"id": mid, "seq": int(mid.rpartition("-")[2])}))

    @channels.command()
    @click.argument("target", metavar="NAME[/BRANCH...]")
    @click.option("--for", "for_", default=None, help="Stop after this long (30s, 1m, ...); default: until Ctrl-C.")
    @click.option("--recursive", is_flag=True, help="Also hear every branch below.")
    @click.option("--after", default=None, help="Resume after this message id.")
    @click.pass_obj
    def subscribe(directory: Path, target: str, for_: str | None, recursive: bool, after: str | None) -> None:
        """Print each message of channel NAME (under BRANCH...) as one JSON line
        ({"id", "seq", "branch", "value"}), and each missed notice as {"missed": {"reason", "count"}}."""
        try:
            limit = seconds(for_, "--for") if for_ else None
        except TinystoreError as exc:
            fail(exc)

        def out(obj: Any) -> None:
            sys.stdout.write(to_json(obj) + "\n")
            sys.stdout.flush()

        async def go() -> None:
            import tinystore

            name, parts = split_target(target)
            # the directory's server, started when none runs (as `tinystore lock hold` does): a listener that
            # owned the directory itself would shut out the publishers it waits for
            store = await tinystore.open(directory)
            try:
                branch = store.channel(name).under(*parts)
                sub = await branch.subscribe(
                    lambda m: out({"id": m.id, "seq": m.seq, "branch": m.branch, "value": m.value}),
                    on_missed=lambda m: out({"missed": {"reason": m.reason, "count": m.count}}),
                    recursive=recursive,
                    after=after,
                )
                try:
                    if limit is None:
                        await asyncio.Event().wait()
                    else:
                        await asyncio.sleep(limit)
                finally:
                    await sub.stop()
            finally:
                await store.close()

        try:
            run_async(go)
        except KeyboardInterrupt:
            pass
