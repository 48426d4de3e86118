"""Running a store server: ``tinystore serve DIR`` (and the sidecar and private child servers)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .. import __version__
from ..clock import Clock
from ..errors import InvalidError
from ..limits import Limits
from ..protocol.frames import PROTOCOL_VERSION
from . import paths
from .core import Core
from .listener import Listener, load_tokens

log = logging.getLogger("tinystore.server")


@dataclass
class ServeOptions:
    """How to run a server. ``listen``: extra ``tcp://HOST:PORT`` / ``tls://HOST:PORT`` addresses."""

    directory: Path
    listen: list[str] = field(default_factory=list)
    tokens: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    idle: float | None = None  # exit after this long without connections (sidecar)
    parent_pid: int | None = None  # exit when this process is gone (private)
    clock: Clock | None = None
    limits: Limits | None = None
    durability: str = "full"
    mode: str = "serve"  # serve | sidecar | private | embedded


async def start_listeners(core: Core, opts: ServeOptions) -> list[Listener]:
    """Listen on the directory's Unix socket and on each ``--listen`` address; write ``DIR/server/address``."""
    listeners: list[Listener] = []
    paths.server_dir(core.directory)
    sock = paths.socket_path(core.directory)
    paths.prepare_socket_dir(sock)
    unix = Listener(core)
    await unix.start_unix(sock)
    listeners.append(unix)
    tcp: list[str] = []
    if opts.listen:
        if not opts.tokens:
            raise InvalidError("--listen needs --tokens FILE: a TCP listener refuses every client without a token")
        tokens = load_tokens(opts.tokens)
        for addr in opts.listen:
            u = urlparse(addr)
            if u.scheme not in ("tcp", "tls") or not u.hostname or u.port is None:
                raise InvalidError(f"listen address {addr!r}: use tcp://HOST:PORT or tls://HOST:PORT")
            ctx = None
            if u.scheme == "tls":
                if not (opts.tls_cert and opts.tls_key):
                    raise InvalidError(f"listen address {addr}: tls:// needs --tls-cert and --tls-key")
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
            lst = Listener(core, tokens)
            port = await lst.start_tcp(u.hostname, u.port, ctx)
            tcp.append(f"{u.scheme}://{u.hostname}:{port}")
            listeners.append(lst)
    paths.write_address(
        core.directory,
        {
            "pid": os.getpid(),
            "socket": str(sock),
            "tcp": tcp,
            "version": __version__,
            "protocol": PROTOCOL_VERSION,
            "mode": opts.mode,
            "started": time.time(),
        },
    )
    return listeners


def remove_address(core: Core) -> None:
    info = paths.read_address(core.directory)
    if info and info.get("pid") == os.getpid():
        try:
            paths.address_file(core.directory).unlink()
        except OSError:
            pass


async def serve(opts: ServeOptions, ready: Any = None) -> int:
    """Run a server until SIGTERM/SIGINT, ``tinystore stop``, idle exit, or the parent's exit. Returns 0.

    Raises ``InUseError`` when another process owns the directory.
    """
    core = Core(opts.directory, clock=opts.clock, limits=opts.limits, durability=opts.durability)
    core.mode = opts.mode
    await core.start()
    try:
        listeners = await start_listeners(core, opts)
    except BaseException:
        await core.stop()
        raise
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, core.stop_requested.set)
        except (NotImplementedError, RuntimeError):
            pass
    if ready is not None:
        ready(listeners)
    watchers: list[asyncio.Task[Any]] = []
    if opts.idle:
        watchers.append(asyncio.ensure_future(_idle_watch(core, listeners, opts.idle)))
    if opts.parent_pid:
        watchers.append(asyncio.ensure_future(_parent_watch(core, opts.parent_pid)))
    try:
        await core.stop_requested.wait()
    finally:
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await core.stop(core.stop_grace)
        remove_address(core)
    return 0


async def _idle_watch(core: Core, listeners: list[Listener], idle: float) -> None:
    while True:
        await asyncio.sleep(min(idle / 4, 1.0))
        if any(lst.connections for lst in listeners):
            continue
        last = max(lst.last_activity for lst in listeners)
        if time.monotonic() - last >= idle:
            log.info("no connections for %.1fs: stopping", idle)
            core.stop_requested.set()
            return


async def _parent_watch(core: Core, pid: int) -> None:
    while True:
        await asyncio.sleep(0.25)
        if os.getppid() != pid:
            core.stop_requested.set()
            return


def run(opts: ServeOptions, ready: Any = None) -> int:
    """Run :func:`serve` on uvloop when available."""
    try:
        import uvloop

        return uvloop.run(serve(opts, ready))
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(opts, ready))


def announce_ready(listeners: list[Listener]) -> None:
    """Tell a parent waiting on our stdout that we serve (one line, then stdout is closed)."""
    try:
        sys.stdout.write("ready " + " ".join(lst.description for lst in listeners) + "\n")
        sys.stdout.flush()
        # Put /dev/null in place of the pipe in one step (dup2 closes the pipe): fd 1 must never be free, or
        # the next connection accepted gets it, and the event loop (libuv) never closes fds 0-2 — a connection
        # it "closed" (a GOAWAY, a stop) would stay open, and its client would wait for ever.
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    except OSError:
        pass
