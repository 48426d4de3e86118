"""``tinystore lock DIR hold LOCK KEY [--ttl 30s] [--wait 10s] -- COMMAND…``: run a command while holding a key.

For a cron job that must never run twice at once. The command gets the lease's fence in ``TINYSTORE_FENCE``
(decimal; ``TINYSTORE_FENCE_PADDED`` is the 40-digit text that sorts as text), and ``TINYSTORE_LOCK`` and
``TINYSTORE_KEY``. When the lease is lost (its renewals failed for its ttl: this process froze, or the store
went away; or the store is stopping, or restarted), the command is stopped: SIGTERM, then SIGKILL after
``--grace``. On Linux, the kernel kills the command (SIGKILL) when this process dies, even by SIGKILL: it never
runs on without the lease. Only the command's own process is covered, not the processes it starts.

Exit status: the command's own (128 + N when a signal N ended it); 1 with ``error[code] message`` on stderr
when the key stayed held for all of the wait (``in_use``), when the lease was lost (``lost``, after the command
was stopped), or when the store could not be reached; 127 when the command cannot be started.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click

from ..durations import seconds
from ..errors import InvalidError
from . import Address, DirGroup, Target, UserPath, connect_address, err_console, pass_store_dir, run_async

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the kernel sends this process when its parent (the thread that forked it) dies."""


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux's
    ``PR_SET_PDEATHSIG``), even by SIGKILL, when nothing of it is left to stop the command; ``None`` where
    there is no ``prctl``.

    Safe in a process with threads (the SDK's executor threads are there): everything is looked up here, in
    the parent, so between fork and exec the child only calls ``prctl`` and ``getppid`` through objects made
    beforehand (no import, no lock, no I/O). The signal comes when the *thread* that forked exits: spawn from
    the loop's thread (the main thread, which lives as long as the process), never from a worker thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    getppid, get_errno, kill = os.getppid, ctypes.get_errno, int(signal.SIGKILL)

    def set_parent_death_signal() -> None:
        if prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0:
            raise OSError(get_errno(), "prctl(PR_SET_PDEATHSIG) failed")  # the command does not run
        if getppid() != parent:  # this process died before the prctl: the kernel will not tell
            os._exit(1)

    return set_parent_death_signal


async def stop_process(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM ``proc``, then SIGKILL it when it is still running after ``grace`` seconds; wait for it."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


async def hold_and_run(
    directory: Target, lock: str, key: str, command: list[str], ttl: float, wait: float, grace: float
) -> int:
    """Hold ``key`` of ``lock`` in the store of ``directory`` (its server, or a sidecar started for it) while
    ``command`` runs; return its exit status. Raises ``InUseError`` (held for all of ``wait``), ``LostError``
    (the lease was lost: the command was stopped first), ``InvalidError``, ``UnavailableError``."""
    import tinystore

    if isinstance(directory, Address):
        store = await connect_address(directory, reconnect_timeout=30.0)  # (a server restarting: the lease lives on)
    else:
        store = await tinystore.open(directory)
    try:
        async with store.lock(lock, ttl=ttl).hold(key, wait=wait) as lease:
            env = dict(os.environ)
            env["TINYSTORE_FENCE"] = str(lease.fence)
            env["TINYSTORE_FENCE_PADDED"] = f"{lease.fence:040d}"
            env["TINYSTORE_LOCK"] = lock
            env["TINYSTORE_KEY"] = lease.key
            # from this (the loop's, main) thread: the parent-death signal follows the thread that forks
            starting = asyncio.ensure_future(
                asyncio.create_subprocess_exec(*command, env=env, preexec_fn=dies_with_this_process())
            )
            try:
                proc = await asyncio.shield(starting)
            except asyncio.CancelledError:
                # the lease was lost (or this command is ending) as the command started: it is stopped as a running
                # one is, SIGTERM then SIGKILL after the grace (a cancelled start kills it outright: CI 12-02, its
                # process running already, its SIGTERM trap never ran)
                await asyncio.wait([starting])
                if not starting.cancelled() and starting.exception() is None:
                    await asyncio.shield(stop_process(starting.result(), grace))
                raise
            except (OSError, subprocess.SubprocessError) as exc:
                # one line, as every error of the command line (the status is a shell's for a command it
                # cannot run)
                err_console.print(f"error[invalid] cannot run {command[0]!r}: {exc}", highlight=False)
                return 127
            loop = asyncio.get_running_loop()
            forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            for sig in forwarded:  # the command decides what a signal to this command means

                def forward(sig: int = sig) -> None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)

                loop.add_signal_handler(sig, forward)
            try:
                return exit_status(await proc.wait())
            except asyncio.CancelledError:  # the lease was lost (LostError follows), or this command is ending
                await asyncio.shield(stop_process(proc, grace))
                raise
            finally:
                for sig in forwarded:
                    loop.remove_signal_handler(sig)
    finally:
        await store.close()


def register(main: click.Group) -> None:
    """Add the ``lock`` group to the ``tinystore`` command."""

    @main.group(cls=DirGroup)
    @click.argument("directory", type=UserPath(file_okay=False, path_type=Path, remote=True))
    @click.pass_context
    def lock(ctx: click.Context, directory: Target) -> None:
        """Hold a key of a lock of DIRECTORY, which must exist (`tinystore serve DIRECTORY` makes a store
        there), through the directory's server, starting one when none runs (a sidecar, which exits once idle).
        DIRECTORY may be a server's tcp://HOST:PORT or tls://HOST:PORT, with its token in $TINYSTORE_TOKEN."""
        ctx.obj = directory

    @lock.command(context_settings={"ignore_unknown_options": True})
    @click.argument("name", metavar="LOCK")
    @click.argument("key")
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
    @click.option("--ttl", default="30s", show_default=True, help="The lease's ttl (1s .. 1h).")
    @click.option("--wait", default="10s", show_default=True, help="How long to wait for the key (0: now or never).")
    @click.option("--grace", default="10s", show_default=True, help="SIGTERM to SIGKILL when the lease is lost.")
    @pass_store_dir
    def hold(directory: Target, name: str, key: str, command: tuple[str, ...], ttl: str, wait: str, grace: str) -> None:
        """Run COMMAND while holding KEY of LOCK: `tinystore lock DIR hold LOCK KEY -- COMMAND ARGS...`.

        The command gets TINYSTORE_FENCE (the lease's fence, decimal; TINYSTORE_FENCE_PADDED: 40 digits, which sort
        as text), and is stopped when the lease is lost
        (SIGTERM, then SIGKILL after --grace). On Linux it is also killed (SIGKILL) if this `tinystore` process
        dies, even by SIGKILL, so it never runs on without the key. Only the command's own process is covered: processes
        it starts itself (in the background, or the commands of a script that does not `exec` them) are not.
        Exits with the command's status; 1 when the key stayed held for all of --wait or the lease was lost.
        """
        args = list(command)
        if args and args[0] == "--":
            args = args[1:]
        if not args:
            raise click.UsageError("a COMMAND to run is needed after --")

        async def go() -> int:
            try:
                ttl_s, wait_s, grace_s = seconds(ttl, "--ttl"), seconds(wait, "--wait"), seconds(grace, "--grace")
            except InvalidError as exc:
                # (worded as the store words a ttl it refuses, "lock NAME: ttl ...": trial DT)
                raise InvalidError(f"lock {name}: {exc.message}") from None
            where = directory if isinstance(directory, Address) else directory.resolve()
            return await hold_and_run(where, name, key, args, ttl_s, wait_s, grace_s)

        sys.exit(run_async(go))
