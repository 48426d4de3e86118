"""Shared test helpers: start and stop stores in every way of reaching them, and server processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import tinystore
from tinystore.server import paths

ALL_MODES = ("embedded", "private", "sidecar", "tcp")


class ServerProcess:
    """A ``tinystore serve DIR`` in a child process, for crash, restart and TCP tests."""

    def __init__(self, directory: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "serve.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinystore", "serve", str(self.directory), *self.args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=self.env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = paths.read_address(self.directory)
            if info and info.get("pid") == self.proc.pid and Path(info["socket"]).exists():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.directory / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.02)
        raise RuntimeError("server did not start")

    @property
    def tcp(self) -> str:
        info = paths.read_address(self.directory) or {}
        return str(info["tcp"][0])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_tokens(directory: Path) -> tuple[Path, str, str]:
    """A tokens file with one admin and one data token; returns (path, admin, data)."""
    admin, data = secrets.token_hex(16), secrets.token_hex(16)
    path = directory / "tokens"
    path.write_text(f"admin {admin}\ndata {data}\n")
    path.chmod(0o600)  # (as docs/serving.md asks: a file others may read is warned of)
    return path, admin, data


async def gone(pid: int, within: float = 10.0) -> bool:
    """Wait until process ``pid`` is gone, ``within`` seconds at most; whether it is."""
    for _ in range(int(within / 0.025)):
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        await asyncio.sleep(0.025)
    return False


async def stop_sidecar(directory: Path) -> None:
    """Stop whatever server owns ``directory`` and wait until it let go."""
    info = paths.read_address(directory)
    if not info:
        return
    pid = int(info["pid"])
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    if not await gone(pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def open_store(
    mode: str, directory: Path, *, clock: datetime | None = None, limits: tinystore.Limits | None = None, **kw: Any
) -> AsyncIterator[tinystore.Store]:
    """Open a store in ``mode`` (embedded, private, sidecar, tcp) and stop every server it started."""
    server: ServerProcess | None = None
    if mode == "embedded":
        store = await tinystore.open(directory, embedded=True, clock=clock, limits=limits, **kw)
    elif mode == "private":
        store = await tinystore.open(directory, private=True, clock=clock, limits=limits, **kw)
    elif mode == "sidecar":
        assert clock is None, "a sidecar has no test clock"
        store = await tinystore.open(directory, idle="5s", limits=limits, **kw)
    elif mode == "tcp":
        assert clock is None
        tokens, admin, _ = write_tokens(directory.parent)
        args = ["--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)]
        if limits is not None:
            args += ["--limits", limits.to_json()]
        server = ServerProcess(directory, *args).start()
        store = await tinystore.connect(server.tcp, token=admin)
    else:
        raise ValueError(mode)
    try:
        yield store
    finally:
        await store.close()
        if mode == "sidecar":
            await stop_sidecar(directory)
        if server is not None:
            server.stop()


def drop_connection(store: tinystore.Store) -> None:
    """Cut the store's connection as a network fault would (not for embedded stores)."""
    abort = getattr(store.transport, "abort", None)
    assert abort is not None, "an embedded store has no connection to drop"
    abort()


def sqlite_file(path: Path, script: str) -> None:
    """A database made by plain sqlite3 at ``path`` (its folders made): an application's file brought into a
    store (foreign keys off, as sqlite3 has them unless asked)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(script)
        conn.commit()


def has_ipv6_loopback() -> bool:
    """Whether this machine can bind ``::1`` (tests of IPv6 addresses are skipped where it cannot)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


class LoopTurns:
    """``async with LoopTurns() as turns:`` counts, in ``turns.count``, the times another task got to run (it yields
    at each turn of the event loop): to see a caller that never awaits anything let the loop turn all the same."""

    def __init__(self) -> None:
        self.count = 0
        self._running = True
        self._task: asyncio.Future[None] | None = None

    async def _other(self) -> None:
        while self._running:
            self.count += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.ensure_future(self._other())
        await asyncio.sleep(0)
        self.count = 0
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._running = False
        if self._task is not None:
            await self._task
