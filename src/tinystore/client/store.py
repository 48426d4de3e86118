"""Opening a store: :func:`open` (sidecar, private, embedded) and :func:`connect` (TCP/TLS)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import re
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar, Unpack, overload

from ..addresses import parse_address
from ..clock import LATEST, Clock
from ..durations import Duration, format_seconds, seconds
from ..engines.sql_text import check_migrations
from ..errors import (
    ClosedError,
    InUseError,
    InvalidError,
    PermissionDeniedError,
    TinystoreError,
    UnavailableError,
    error_from,
)
from ..limits import Limits
from ..names import a_or_an, check_name
from ..protocol.frames import TOKEN_MAX
from ..protocol.messages import Welcome
from ..protocol.store import Advance, Backup, Empty, Stop
from ..protocol.values import shown
from ..server import paths
from ..server.dirlock import (
    LOCK,
    held_here,
    lock_holders,
    owned_by_command,
    socket_gone,
    started_by_sdk,
    unreachable_owner,
    unserved_here,
)
from ..server.dirlock import _alive as pid_alive
from .sql import Database, SqlTx, read_migrations

if TYPE_CHECKING:
    from .channels import Channel
    from .jobs import Queue, QueueOptions
    from .locks import Lock, Semaphore
from . import attempt_guard
from .transport import (
    CLOSE_WRITES_WAIT,
    RECONNECT_TIMEOUT,
    LocalTransport,
    RemoteTransport,
    Transport,
    another_store,
)

T = TypeVar("T")
Durability = Literal["full", "os"]
"""``"full"``: each commit on disk (fsync) before it returns; ``"os"``: handed to the OS (survives a crash of
the process, not of the machine)."""


class StoreClock:
    """The store's clock as the SDK sees it. ``advance`` works on a test clock only
    (``open(..., clock=datetime)``); it returns an awaitable (embedded: already applied)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        # a private server's test clock, as this process moved it: started at ``_base`` (epoch seconds) at
        # ``_mono0`` (time.monotonic), advanced by ``_advanced`` since. A private server that is started again
        # after a crash starts its clock there, not at open()'s ``clock=`` (which would undo every advance)
        self._base: float | None = None
        self._mono0 = 0.0
        self._advanced = 0.0

    def _start_test(self, start: datetime, mono0: float) -> None:
        self._base = (start if start.tzinfo is not None else start.replace(tzinfo=UTC)).timestamp()
        self._mono0 = mono0  # (taken before the server started: its clock, if anything, runs behind this one)

    def _test_now(self) -> datetime | None:
        """Where a private server's test clock is now, as this process moved it (None: a real clock)."""
        if self._base is None:
            return None
        return datetime.fromtimestamp(self._base + (time.monotonic() - self._mono0) + self._advanced, UTC)

    def advance(self, by: Duration) -> asyncio.Future[float]:
        """Move every engine's time forward by ``by`` (a duration: seconds, a timedelta or text such as ``"1h"``);
        the future gives the store's time after the move (epoch seconds). Embedded, the move is made before this
        returns; over a socket (``private=True``) every call made after this one waits until the move is made,
        so the future need not be awaited. Raises ``InvalidError`` (a real clock; ``by`` no duration or below
        0; a move past the end of year 9999). A cancel of the future leaves the move to happen."""
        secs = seconds(by, "clock advance")
        if self._base is not None and self._base + (time.monotonic() - self._mono0) + self._advanced + secs > LATEST:
            raise InvalidError(f"clock advance: {by!r} would take the test clock past the end of year 9999")
        loop = asyncio.get_running_loop()
        core = self._store._core
        if core is not None:
            core.clock.advance(by)  # (its refusal names ``by`` as given, as a private server's does)
            fut: asyncio.Future[float] = loop.create_future()
            fut.set_result(core.clock.now())
            return fut
        if self._base is not None:
            self._advanced += secs
        moving: asyncio.Future[Any]
        if self._store._dead is not None:
            moving = asyncio.ensure_future(self._store._call("clock.advance", Advance(secs), float, write=True))
        else:
            moving = self._store.transport.call_first("clock.advance", Advance(secs), float, write=True)
        # (a cancel of what the caller holds does not reach the call: trial EN, a cancelled advance, or one awaited
        # under asyncio.timeout(0), was never made, though this process counted it)
        return asyncio.shield(moving)

    def __repr__(self) -> str:
        core = self._store._core
        test = core.clock.is_test if core is not None else self._base is not None
        return f"<tinystore.StoreClock of {self._store!r}: {'a test clock' if test else 'real time'}>"

    async def now(self) -> float:
        """The store's time: seconds since the Unix epoch."""
        now: float = await self._store._call("clock.now", Empty(), float)
        return now


class Store:
    """An open store. Get one with :func:`open` or :func:`connect`; close it with :meth:`close` or
    ``async with``. ``mode`` is ``"embedded"``, ``"private"``, ``"sidecar"`` or ``"remote"``."""

    def __init__(
        self,
        transport: Transport,
        *,
        mode: str,
        directory: Path | None,
        core: Any = None,
        child: subprocess.Popen[bytes] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.transport = transport
        self.mode = mode
        self.directory = directory
        self._limits = limits or Limits()
        self._server_limits: tuple[str, Limits] | None = None  # the last Welcome's limits, read
        self._core = core
        self._child = child
        self._closed = False
        self._dead: UnavailableError | None = None
        self._child_cmd: list[str] = []
        self._child_exits: list[float] = []
        self._dead_task: asyncio.Future[None] | None = None
        self.clock = StoreClock(self)
        self._databases: dict[str, Database] = {}
        self._close_hooks: list[Any] = []
        # the workers' and run_due's stops, run at once before the other hooks: each lets its handlers run out a
        # grace (10 s), and one after another they took 10 s each (trial DB)
        self._stop_hooks: list[Any] = []
        # seconds the job handlers still running get at close (see close; None: jobs.CLOSE_GRACE, 10 s)
        self._close_grace: float | None = None
        self._close_shorteners: list[Callable[[float], None]] = []  # what a later close(grace=...) cuts short
        self._closer: asyncio.Task[Any] | None = None  # the task that called close() first
        self._undoing: set[asyncio.Task[Any]] = set()  # calls that give back what a cancelled call was handed
        self._open_txs: set[SqlTx] = set()  # the transactions of db.tx begun and not ended (see _close)
        self._abandoning = False  # the close rolls back the transactions open, and those begun from now on
        self._close_task: asyncio.Task[None] | None = None

    @property
    def limits(self) -> Limits:
        """The :class:`~tinystore.Limits` the store's server holds to: those it was started with (by this call's
        ``limits``, or by whoever started it), as its handshake tells them; the SDK checks values against them
        before it sends them (a job's value, a message, a lock's ttl)."""
        if self._core is not None:
            limits: Limits = self._core.limits
            return limits
        welcome = getattr(self.transport, "welcome", None)
        text = getattr(welcome, "limits", "")
        if not text:
            return self._limits
        known = self._server_limits
        if known is None or known[0] != text:
            try:
                known = (text, Limits.from_json(text))
            except InvalidError:  # (a server of another version: its fields differ)
                known = (text, self._limits)
            self._server_limits = known
        return known[1]

    async def _call(
        self,
        method: str,
        request: Any,
        response_type: Any = Any,
        *,
        write: bool = False,
        retry: bool = True,
        undo: Callable[[bytes], None] | None = None,
        sent: Callable[[float], None] | None = None,
    ) -> Any:
        if self._dead is not None:
            raise self._dead
        return await self.transport.call(method, request, response_type, write=write, retry=retry, undo=undo, sent=sent)

    def _gone_for_good(self) -> TinystoreError | None:
        """What every call raises now that the store will not be reached again (its private server stopped, its
        directory gone), else None (a store that may come back: a restart, a reconnect)."""
        return self._dead or getattr(self.transport, "_gone", None)

    def _undo_soon(self, method: str, request: Any) -> None:
        """Call ``method`` in the background to give back what a cancelled call was handed (its answer came
        after the cancel); its outcome is not awaited by anyone but :meth:`close`, and its failure is no news
        (the server gives it back by itself when the connection ends)."""
        if self._closed:
            return
        self._call_at_close(method, request)

    def _call_at_close(self, method: str, request: Any) -> None:
        """:meth:`_undo_soon`, also once the close has begun (before it closes the connection, it waits for
        these)."""
        task = attempt_guard.spawn(self._call(method, request, Any, retry=False))  # (giving back: never refused)
        self._undoing.add(task)
        task.add_done_callback(_undone)
        task.add_done_callback(self._undoing.discard)

    def _child_exited(self, child: subprocess.Popen[bytes], code: int) -> None:
        """The private server (our child) exited while the store is open. Stopped on purpose (``stop_server``,
        ``tinystore stop``, SIGTERM: it exits with status 0), it stays stopped, and every call fails at once with
        ``UnavailableError`` saying so. Its directory gone (removed, moved), every call says so. Otherwise (killed,
        crashed, its socket file removed) it is started again (the SDK then reconnects by itself, STORE-06); after
        5 exits within a minute, the store gives up and fails every call at once."""
        if self._closed or child is not self._child:
            return
        if code == 0:
            # (a server whose directory or socket went away exits with EXIT_LOST_PLACE: told below, or started again)
            self._dead = UnavailableError(
                f"store {self.directory}: its private server was stopped (stop_server, tinystore stop or SIGTERM); "
                "close this store, and open it again to start another"
            )
            self.transport.give_up(self._dead)  # (every call raises it, and the subscriptions end, told why)
            self._dead_task = asyncio.ensure_future(self.transport.close())
            return
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        if code == paths.EXIT_LOST_PLACE:
            how += ": its socket file or directory went away"
        now = time.monotonic()
        self._child_exits = [t for t in self._child_exits if now - t < 60.0] + [now]
        if len(self._child_exits) > 5 or not self._child_cmd:
            self._dead = UnavailableError(f"store {self.directory}: the private server exited ({how})")
            self.transport.give_up(self._dead)  # (every call raises it, and the subscriptions end, told why)
            self._dead_task = asyncio.ensure_future(self.transport.close())
            return
        if self.directory is not None and not (self.directory / LOCK).is_file():
            # the store is gone from its path (removed, or moved away: the server stopped for that): a new server
            # would make a new, empty store there, and this process's writes would go to it
            self._dead = _gone(self.directory)
            self.transport.give_up(self._dead)  # (every call raises it, and the subscriptions end, told why)
            self._dead_task = asyncio.ensure_future(self.transport.close())
            return
        logging.getLogger("tinystore.client").warning(
            "store %s: the private server exited (%s); starting it again", self.directory, how
        )
        self._dead_task = asyncio.ensure_future(self._restart_child())

    async def _restart_child(self) -> None:
        cmd = list(self._child_cmd)
        clock_now = self.clock._test_now()
        if clock_now is not None and "--clock" in cmd:
            cmd[cmd.index("--clock") + 1] = clock_now.isoformat()
        try:
            child = await _spawn_private(cmd)
        except Exception as exc:  # someone else may own the directory now: reconnect to it
            logging.getLogger("tinystore.client").warning(
                "store %s: restarting the private server: %s", self.directory, exc
            )
            return
        if self._closed:
            child.terminate()
            await asyncio.to_thread(_reap, child, 10.0)
            return
        self._child = child
        _watch_child(self, child)

    @property
    def epoch(self) -> int:
        """The server's epoch: an int that grows at each start of the store's server (its start time in
        milliseconds since the Unix epoch, or one more than the last epoch when the clock went back); message ids
        (``<epoch>-<seq>``) and fences start from it."""
        return self.transport.epoch

    async def database(
        self, name: str, migrations: str | os.PathLike[str] | Sequence[tuple[str, str]] | None = None
    ) -> Database:
        """Open (creating) the SQL database ``name`` (``DIR/sql/<name>.db``) and apply ``migrations``: a
        folder (a path, str or ``os.PathLike``) whose ``*.sql`` files apply in name order, or a sequence of
        ``(name, text)`` pairs applied in their names' order; each applies once, in its own transaction (SQL-05).
        ``None``: no migrations (those applied before stay). See docs/sql.md, "Opening a database and migrations".

        Names starting with ``tinystore-`` are the store's own databases (``tinystore-jobs``): they open for
        reading only (their ``exec`` of a statement that writes and their ``tx`` that is not ``read_only`` raise
        ``PermissionDeniedError``).

        Raises ``InvalidError`` (a bad name, a folder that cannot be read, a migration that fails),
        ``ConflictError`` (an applied migration whose text changed, a new one that sorts before one applied, or one
        with the text of an applied one no longer given: renamed), ``PermissionDeniedError`` (a ``data`` token
        that would run migrations; migrations for one of the store's own databases, or one of those the store has
        not made), ``LimitError`` (more databases than ``Limits.databases``). A cancel leaves the opening, and its
        migrations, going on in the server: a later call finds them applied.
        """
        check_name("database", name)
        pairs = read_migrations(migrations, name)
        check_migrations(name, [(m.name, m.text) for m in pairs])
        db = self._databases.get(name) or Database(self, name)
        await db._open(pairs)
        self._databases[name] = db
        return db

    @overload
    def channel(self, name: str, type: builtins.type[T]) -> Channel[T]: ...
    @overload
    def channel(self, name: str, type: Any = None) -> Channel[Any]: ...
    def channel(self, name: str, type: Any = None) -> Channel[Any]:
        """The channel ``name`` carrying values of ``type`` (a dataclass, msgspec Struct, TypedDict, or a
        plain JSON type; ``None`` for any JSON value). Raises ``InvalidError`` for a bad name."""
        from .channels import Channel

        return Channel(self, name, type)

    def lock(self, name: str, ttl: Duration | None = None, max_hold: Duration | None = None) -> Lock:
        """The lock ``name``: one holder of a key at a time (leases with fences). ``ttl``: 1 s .. 1 h,
        10 s unless given. Raises ``InvalidError`` for a bad name or ttl."""
        from .locks import Lock

        return Lock(self, name, ttl=ttl, max_hold=max_hold)

    def semaphore(
        self, name: str, limit: int, ttl: Duration | None = None, max_hold: Duration | None = None
    ) -> Semaphore:
        """The semaphore ``name``: at most ``limit`` holders of a key at a time. Raises ``InvalidError``."""
        from .locks import Semaphore

        return Semaphore(self, name, limit=limit, ttl=ttl, max_hold=max_hold)

    @overload
    def queue(self, name: str, type: builtins.type[T], **options: Unpack[QueueOptions]) -> Queue[T]: ...
    @overload
    def queue(self, name: str, type: Any = None, **options: Unpack[QueueOptions]) -> Queue[Any]: ...
    def queue(self, name: str, type: Any = None, **options: Unpack[QueueOptions]) -> Queue[Any]:
        """The job queue ``name`` carrying values of ``type`` (as :meth:`channel`); its options are those of
        :class:`~tinystore.client.jobs.Queue` (:class:`~tinystore.client.jobs.QueueOptions`: ``database``,
        ``attempts``, ``backoff``, ``lease``, ``timeout``, ``expected``, ``max_running``,
        ``max_running_per_tenant``, ``keep``). Raises ``InvalidError`` for a bad name or option value, and
        ``TypeError`` for an option that does not exist; sends nothing."""
        from .jobs import Queue

        return Queue(self, name, type, **options)

    async def status(self) -> dict[str, Any]:
        """What the server holds, as a dict: ``version``, ``directory``, ``pid``, ``epoch``, ``started`` and ``now``
        (epoch seconds), ``uptime`` (seconds), ``test_clock``, ``durability``, ``mode`` (how the server runs) and
        ``client`` (how this store reaches it), ``connections`` (a list, one dict each), ``databases`` (by name:
        its counts of writes, commits, reads and transactions), and one dict per engine: ``channels``, ``locks``,
        ``jobs``. Raises ``ClosedError`` (the store is closed), ``UnavailableError`` (the server cannot be
        reached)."""
        status: dict[str, Any] = await self._call("store.status", Empty(), Any)
        status.setdefault("mode", self.mode)
        status["client"] = self.mode
        return status

    async def stop_server(self, grace: Duration = 10.0) -> None:
        """Ask the server to stop gracefully (needs the admin capability): calls under way get ``grace`` (10 s)
        to finish. Raises ``InvalidError`` for a ``grace`` that is not a duration (negative, NaN), before
        anything stops, and for an embedded store (close it instead); ``PermissionDeniedError`` for a ``data``
        token. A cancel leaves the stop going on once it was sent."""
        grace_s = seconds(grace, f"store {self.directory or self.transport.description}: stop_server: grace")
        await self._call("store.stop", Stop(grace_s), Any, write=True)

    async def backup(self, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """Copy the store, while it runs, into the folder ``dest`` (made, mode 0700; it must not exist or be
        empty): a store directory of its own, which ``tinystore serve DEST`` or ``open(DEST)`` opens. Needs the
        admin capability. Returns ``{"dest": str, "databases": {name: bytes}, "skipped": {name: why},
        "seconds": float}``: ``skipped`` names the files of ``DIR/sql`` that are no database the store could open
        (a symbolic link, a file that is not SQLite's), which are not copied.

        Each database is copied with SQLite's online backup API as one read transaction sees it (writes go on
        meanwhile), one after another: each is consistent in itself, not at one instant with the others. The
        copy of ``EPOCH`` keeps fences and message ids growing on a store started from the copy (LOCK-02).
        ``dest`` is a path on the server's machine: a relative one is taken from this process's working folder,
        except over a URL (``connect``), where it must be absolute.

        Raises ``InvalidError`` (``dest`` inside the store, holding it, a symbolic link, an existing folder that
        is not empty, no path), ``PermissionDeniedError`` (not an admin token, ``dest`` a folder of another user or
        one that cannot be made), ``InUseError`` (another backup is under way), ``UnavailableError`` (a disk
        error; the connection dropped during the backup: ``dest`` may be incomplete, and is complete only with
        its ``LOCK``), ``ClosedError`` (the store stopped during the backup). After an error ``dest`` holds no ``LOCK``
        and no half-written database: remove it before trying again. A cancel leaves the copy going on in the
        server until it ends.
        """
        try:
            path = os.fspath(dest)
        except TypeError:
            raise InvalidError(f"backup: dest {dest!r}: expected a path (str or os.PathLike)") from None
        if not isinstance(path, str) or not path:
            # ("" would be this process's working folder, as os.path.abspath takes it; open refuses it too)
            raise InvalidError(f"backup: dest {path!r}: give the folder to copy the store into")
        if self.mode != "remote":
            path = os.path.abspath(path)
        try:
            result: dict[str, Any] = await self._call("store.backup", Backup(path), Any, retry=False)
        except ClosedError as exc:
            if not exc.extra.get("dropped"):
                raise
            # (trial DF: a server killed during a backup left DEST with NAME.db.partial files, and the error did
            # not say so, nor that the store was not closed)
            raise UnavailableError(
                f"backup: the connection to the store dropped during the backup into {path} (its server stopped, "
                f"or the network failed); {path} may be incomplete: a complete backup has its {LOCK} (made last); "
                "without one, remove it before trying again"
            ) from None
        return result

    async def close(self, grace: Duration | None = None) -> None:
        """Close the store: stop what this SDK runs (subscriptions, leases, workers), then the connection: the
        transactions still open are rolled back (a statement of theirs under way interrupted; their calls raise
        ``ClosedError``), the writes sent and not yet answered are waited for (10 s at most in all; one still
        unanswered then raises ``OutcomeUnknownError``, an embedded store's ``ClosedError``: it was interrupted and
        rolled back), the other calls under way raise ``ClosedError`` (a read's statement is interrupted).
        A private server stops; an embedded store stops its engines and lets the directory go. Idempotent.
        ``grace``: how long the job handlers still running (workers', ``run_due``'s) may take to finish before they
        are cancelled, their jobs handed back (a duration; 10 s unless given; ``0``: cancelled at once, as a test's
        teardown wants); a later call's shorter grace cuts a close's under way short. Raises ``InvalidError`` for
        a ``grace`` that is no duration, before anything stops.
        A cancel of ``close``, once it has begun, leaves the close going on; a later call waits for it to end (a
        task of ``close()`` cancelled before it first ran ran none of it, as any coroutine). Raises ``InvalidError``
        from another event loop than the one the store was opened on, as every call does."""
        grace_s = None if grace is None else seconds(grace, "store.close: grace")
        task = self._close_task
        if (task is None or not task.done()) and asyncio.get_running_loop() is not self.transport.loop:
            # trial BU: a bare RuntimeError ("Event loop is closed") from a later asyncio.run(); its grace is not
            # kept (trial FX: a refused call's grace cut the real close's short)
            raise self.transport.other_loop()
        if grace_s is not None and (self._close_grace is None or grace_s < self._close_grace):
            self._close_grace = grace_s
            if task is not None:
                for shorten in list(self._close_shorteners):
                    shorten(grace_s)
        if task is None:
            self._closed = True
            self._closer = asyncio.current_task()  # (a job's handler, perhaps: see the jobs runner's stop)
            task = self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(task)

    async def _close(self) -> None:
        self.transport.close_deadline = time.monotonic() + CLOSE_WRITES_WAIT
        if self._core is not None:
            # an embedded store: no lease given to another client from now on (trial DT: while a holder of this
            # process ran its block's clean-up, the key went to another client's waiter, told at once the store was
            # stopping)
            self._core.begin_stopping()
        try:
            await self._close_clients()
        except BaseException:
            if self._core is not None:
                # cancelled (asyncio.run ending, a second Ctrl-C) before the engines' stop began (waiting for the
                # writes under way, say): they stop all the same, what runs interrupted now, and the directory is
                # let go once their threads end (CI: a cancel in that wait left the directory held for good)
                self._core.end_grace()
                await self._core.stop(0.0)
            raise
        if self._core is not None:
            # (what is left of the close's bound: the writes under way were waited for within it already; trial IE,
            # a long write was given 10 s more by the engines' own grace)
            await self._core.stop(self.transport.close_left())
        if self._child is not None:
            await asyncio.to_thread(_reap, self._child, 10.0)

    async def _close_clients(self) -> None:
        """What :meth:`_close` does before the engines' stop (an embedded store's) or the child's reap: this SDK's
        workers, subscriptions, leases and transactions ended, then the connection closed."""
        if self._stop_hooks:
            await asyncio.gather(*(hook() for hook in list(self._stop_hooks)), return_exceptions=True)
        for hook in reversed(self._close_hooks):
            with contextlib.suppress(Exception):
                await hook()
        # the transactions still open: they can no longer commit (the connection's close, below, takes no new
        # call), and the writes it waits for may be queued behind one of them (trial IB): rolled back now
        self._abandoning = True
        for tx in list(self._open_txs):
            tx._abandon()
        if self._undoing:
            await asyncio.wait(list(self._undoing), timeout=self.transport.close_left(5.0))
        if self._child is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._call("store.stop", Stop(5.0), Any, write=True, retry=False)
        await self.transport.close()

    async def __aenter__(self) -> Store:
        """``async with await tinystore.open(dir) as store:``: the store itself (already open); the block's end
        closes it (:meth:`close`), whether the block returns or raises. Raises nothing."""
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<tinystore.Store {self.mode} {self.transport.description}{' closed' if self._closed else ''}>"


def _undone(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a call that could not give back is no news (see Store._undo_soon)


def _reap(child: subprocess.Popen[bytes], timeout: float, *pipes: IO[bytes] | None) -> None:
    """Wait up to ``timeout`` seconds for ``child`` to end, then kill it and wait; then close ``pipes`` (its
    ``stdout``/``stderr`` that nothing else reads: trial EN, a cancelled open left them to a garbage collection,
    a ``ResourceWarning``)."""
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    finally:
        for pipe in pipes:
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _server_cmd(directory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tinystore", "serve", str(directory), *extra]


async def _unix_endpoint(path: Path) -> tuple[str, Any]:
    return "unix", str(path)


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # a scheme (RFC 3986) and "//": an address, never a folder


async def open(
    directory: str | os.PathLike[str],
    *,
    private: bool = False,
    embedded: bool = False,
    idle: Duration = "30s",
    durability: Durability = "full",
    clock: datetime | None = None,
    limits: Limits | None = None,
    serve: bool | None = None,
    reconnect_timeout: Duration | None = None,
) -> Store:
    """Open the store in ``directory`` (a leading ``~`` is the user's home folder, as in a shell).

    - default: connect to the directory's server, or start one (a detached sidecar that exits after
      ``idle`` without connections; ``"0s"`` for never) and connect (STORE-02);
    - ``private=True``: start a server that is this process's child, stopped by :meth:`Store.close`;
    - ``embedded=True``: run the engines inside this process; with ``serve`` (default) also listen on the
      directory's socket so other processes and the command line can reach it.

    ``durability``: ``"full"`` (each commit on disk before it returns) or ``"os"``. ``clock``: a datetime
    to start a test clock at (private and embedded only; then ``await store.clock.advance("1h")``).
    ``limits``: :class:`~tinystore.Limits` (private and embedded, or a sidecar this call starts; a server found
    running keeps those it was started with, and so does its ``durability``: a warning on the ``tinystore.client``
    logger names what differs, and :attr:`Store.limits` shows what the server holds to). ``serve``
    (embedded only; default ``True``). ``reconnect_timeout``: how long a call waits for the server to come back
    (a duration: seconds, a timedelta or text such as ``"30s"``; sidecar and private only; default 30 s), as
    :func:`connect` takes it.

    Raises ``InUseError`` (private/embedded: another process owns the directory), ``UnavailableError``
    (the server could not be started or reached), ``InvalidError`` (bad options; an empty ``directory``, which
    is not taken to mean the current directory: pass ``"."`` for that; an address such as ``"tcp://host:port"``:
    :func:`connect` reaches those), ``PermissionDeniedError`` (this process
    may not write or enter the directory, or reach the socket of a server another user runs).

    Cancelled, it leaves no connection open; a private server it was starting is stopped, an embedded store's
    engines are closed; a sidecar it started stays, and exits after ``idle`` without connections.
    """
    try:
        text = os.fspath(directory)
    except TypeError:
        raise InvalidError(f"open: directory {directory!r}: expected a path (str or os.PathLike)") from None
    if not isinstance(text, str) or not text.strip():
        raise InvalidError(f'open: directory {directory!r}: give the store\'s directory (".", for the current one)')
    if "\0" in text:
        raise InvalidError(f"open: directory {text!r}: a path cannot hold a NUL character")
    if _URL.match(text):  # trial BU: "tcp://127.0.0.1:7611" made a folder "tcp:" and started a sidecar in it
        netloc = text.partition("://")[2].partition("/")[0]
        shown = text.replace(netloc.rpartition("@")[0], "…", 1) if "@" in netloc else text  # it may hold a password
        raise InvalidError(
            f"open: directory {shown!r}: an address, not a directory; to reach a server at an address, use "
            "tinystore.connect(url, token=...)"
        )
    path = Path(text).expanduser().resolve()  # "~/x" is the home folder's x, as a shell reads it
    for option, value in (("private", private), ("embedded", embedded), ("serve", serve)):
        if not isinstance(value, bool) and not (option == "serve" and value is None):
            raise InvalidError(f"open: {option} {value!r}: expected True or False")
    if clock is not None and not isinstance(clock, datetime):
        raise InvalidError(f"open: clock {clock!r}: expected a datetime to start the test clock at")
    if clock is not None and not 0 <= clock.timestamp() < 253402300800:
        raise InvalidError(
            f"open: clock {clock.isoformat()}: a test clock starts between 1970 and the end of 9999 (the times a "
            "job's row can hold)"
        )
    if limits is not None and not isinstance(limits, Limits):
        raise InvalidError(f"open: limits {limits!r}: expected a tinystore.Limits")
    if private and embedded:
        raise InvalidError("open: private and embedded cannot both be set")
    if durability not in ("full", "os"):
        raise InvalidError(f'open: durability {durability!r}: use "full" or "os"')
    if clock is not None and not (private or embedded):
        raise InvalidError("open: a test clock is only for private=True or embedded=True stores")
    if serve is not None and not embedded:
        raise InvalidError(
            "open: serve is for embedded=True stores (whether the engines in this process also listen on the "
            "directory's socket); a sidecar or private server always does"
        )
    if reconnect_timeout is not None:
        if embedded:
            raise InvalidError("open: reconnect_timeout is for a store reached over a socket, not embedded=True")
        reconnect_timeout = _checked_reconnect_timeout("open", reconnect_timeout)
    try:
        idle_s = seconds(idle, "open: idle")  # (trial BU: "idle: ...", where every other option's begins "open:")
    except InvalidError as exc:
        raise InvalidError(f'{exc.message}; idle "0s" keeps a sidecar until it is stopped') from None
    try:
        paths.make_directory(path, "open")
    except PermissionError as exc:
        raise _permission_denied(path, exc) from None
    try:
        if embedded:
            return await _open_embedded(path, durability, clock, limits, serve is not False)
        if private:
            held = held_here(path)
            if held is not None:
                raise held
            paths.server_dir(path)  # what the child would fail on: fail here, with the reason
            store = await _open_private(path, durability, clock, limits, reconnect_timeout)
        else:
            unserved = unserved_here(path)
            if unserved is not None:
                raise unserved
            store = await _open_sidecar(path, durability, limits, idle_s, reconnect_timeout)
    except PermissionError as exc:
        raise _permission_denied(path, exc) from None
    return store


def _checked_reconnect_timeout(who: str, value: Any) -> float:
    """``value`` (a duration: a number of seconds, a timedelta or text such as ``"30s"``) in seconds, above 0."""
    try:
        checked = seconds(value, f"{who}: reconnect_timeout")
    except InvalidError as exc:
        if "above 0" not in exc.message and "negative" not in exc.message:
            raise  # (what else is wrong with it, said as it is: over the longest duration, trial EK)
        checked = 0.0
    if not checked > 0:
        raise InvalidError(
            f"{who}: reconnect_timeout {shown(value)}: expected a duration above 0 (seconds, a timedelta, or text such "
            'as "30s")'
        )
    return checked


def _permission_denied(path: Path, exc: PermissionError) -> PermissionDeniedError:
    """The error of ``open`` when the OS refused this process something in the store's directory ``path``."""
    where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != str(path) else ""
    return PermissionDeniedError(
        f"open: store {path}: {exc.strerror or exc}{where}; this process (uid {os.getuid()}) must be able to "
        "write and enter the store's directory"
    )


async def _open_embedded(
    path: Path, durability: str, clock: datetime | None, limits: Limits | None, serve: bool
) -> Store:
    from ..server.core import Core
    from ..server.main import ServeOptions, start_listeners

    core = Core(path, clock=Clock(clock) if clock is not None else None, limits=limits, durability=durability)
    core.mode = "embedded"
    await core.start()
    try:
        if serve:
            await start_listeners(core, ServeOptions(directory=path, mode="embedded"))
        else:
            paths.mark_unserved(path)
        transport = LocalTransport(core)
    except BaseException:
        await core.stop()
        raise
    return Store(transport, mode="embedded", directory=path, core=core, limits=core.limits)


def _limits_args(limits: Limits | None) -> list[str]:
    return ["--limits", limits.to_json()] if limits is not None else []


async def _spawn_private(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start a private server and wait for its ``ready`` line; raise the error it printed otherwise. Cancelled
    meanwhile, it stops the child (which would own the directory until this process ends) before it re-raises."""
    # in a process group of its own: a terminal's Ctrl-C goes to this program, which may still use the store
    # while it stops (trial AS: the server stopped at the same moment, and the program's clean-up failed); the
    # server stops with the store, or when this process dies (--parent-pid)
    child = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0
    )
    try:
        line = await asyncio.to_thread(_read_ready, child)
    except BaseException:
        child.terminate()
        # (shielded: a second cancel does not leave the child unreaped; the thread goes on either way)
        await asyncio.shield(asyncio.to_thread(_reap, child, 10.0, child.stdout, child.stderr))
        raise
    if not line.startswith("ready"):
        raise await asyncio.to_thread(_child_error, child)
    threading.Thread(target=_drain_stderr, args=(child,), daemon=True).start()
    return child


def _watch_child(store: Store, child: subprocess.Popen[bytes]) -> None:
    """Tell ``store`` (on its loop) when ``child`` exits."""
    loop = asyncio.get_running_loop()

    def watch() -> None:
        code = child.wait()
        if child.stdout is not None:
            with contextlib.suppress(OSError):
                child.stdout.close()  # (its one line, "ready", was read long ago)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            loop.call_soon_threadsafe(store._child_exited, child, code)

    threading.Thread(target=watch, daemon=True, name="tinystore-private-watch").start()


async def _open_private(
    path: Path, durability: str, clock: datetime | None, limits: Limits | None, reconnect_timeout: float | None
) -> Store:
    cmd = _server_cmd(
        path, "--private", "--parent-pid", str(os.getpid()), "--durability", durability, *_limits_args(limits)
    )
    if clock is not None:
        cmd += ["--clock", clock.isoformat()]
    mono0 = time.monotonic()
    child = await _spawn_private(cmd)
    sock = paths.socket_path(path)
    transport = RemoteTransport(
        lambda: _unix_endpoint(sock),
        description=f"private:{path}",
        where=str(path),
        reconnect_timeout=RECONNECT_TIMEOUT if reconnect_timeout is None else reconnect_timeout,
    )
    try:
        await transport.connect()
    except BaseException:
        child.terminate()
        # (its stderr: closed by the thread that copies it, at its end)
        await asyncio.shield(asyncio.to_thread(_reap, child, 10.0, child.stdout))
        raise
    store = Store(transport, mode="private", directory=path, child=child, limits=limits)
    store._child_cmd = cmd
    if clock is not None:
        store.clock._start_test(clock, mono0)
    _watch_child(store, child)
    return store


def _read_ready(child: subprocess.Popen[bytes]) -> str:
    assert child.stdout is not None
    return child.stdout.readline().decode(errors="replace").strip()


def _drain_stderr(child: subprocess.Popen[bytes]) -> None:
    """Copy the child's log to ours until it ends, then close the pipe (trial AS: each private store's two pipes
    stayed open until a garbage collection)."""
    assert child.stderr is not None
    try:
        for line in child.stderr:
            sys.stderr.write(line.decode(errors="replace"))
    finally:
        with contextlib.suppress(OSError):
            child.stderr.close()


def _child_error(child: subprocess.Popen[bytes]) -> Exception:
    try:
        _, err = child.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
    text = err.decode(errors="replace").strip()
    last = text.splitlines()[-1] if text else f"exit status {child.returncode}"
    if last.startswith("error[") and "]" in last:
        code, _, msg = last[6:].partition("] ")
        return error_from(code, msg.lstrip(": "))
    return UnavailableError(f"the store server did not start: {last}")


class _ServedBy:
    """What kind of server ``open(dir)`` last reached, from ``DIR/server/address`` (its ``mode``) matched to the
    pid of the ``WELCOME``. Only a sidecar is started again when it is gone (API.md: "when the sidecar it used
    is gone, the SDK finds or starts one again"); a ``tinystore serve`` (or another process's embedded or
    private server) is waited for, up to the reconnect timeout, so that an operator can restart or stop it."""

    def __init__(self) -> None:
        self.sidecar = True  # before the first connection: find one, or start a sidecar
        self.mode = ""
        self.pid = 0
        self.found = False  # the last look for a server found one listening

    async def learn(self, directory: Path, welcome: Welcome) -> None:
        info: dict[str, Any] | None = None
        # the server writes its address file right after it starts listening: a client may be a little early
        for _ in range(50):
            info = paths.read_address(directory)
            if info is not None and info.get("pid") == welcome.pid:
                break
            await asyncio.sleep(0.02)
        else:
            return  # nothing tells: keep what was known
        assert info is not None
        self.mode = str(info.get("mode") or "")
        self.pid = welcome.pid
        self.sidecar = self.mode in ("sidecar", "")  # a server that wrote no mode: as before, a sidecar


QUICK_FAILURE = 2.0
"""Seconds: a connection to a sidecar that failed sooner was a race with its exit, and is tried again."""


async def _open_sidecar(
    path: Path, durability: str, limits: Limits | None, idle: float, reconnect_timeout: float | None
) -> Store:
    extra = ["--sidecar", "--idle", format_seconds(idle), "--durability", durability, *_limits_args(limits)]
    served = _ServedBy()

    async def endpoint() -> tuple[str, Any]:
        sock = await asyncio.to_thread(paths.served_socket, path)
        if served.pid and not (path / LOCK).is_file():
            # connected before, and the store is gone from its path (removed, or moved away): starting a sidecar
            # would make a new, empty store in its place, and the writes of this process would go there
            raise _gone(path)
        if served.sidecar:
            # (one that ran before: the sidecar started in its place opens that store only, never a new one)
            sock = await ensure_server(path, sock, extra, existing=bool(served.pid), store_id=transport.store_id)
        elif (state := await asyncio.to_thread(_can_connect, sock)) is not True:
            if state is None:
                raise _busy(path, sock)
            what = "tinystore serve" if served.mode == "serve" else f"{a_or_an(served.mode)} server"
            raise UnavailableError(
                f"store {path}: its server ({what}, pid {served.pid}) is gone; waiting for it to come back "
                "(the SDK starts a sidecar only in place of a sidecar)"
            )
        served.found = True
        return "unix", str(sock)

    async def connected(welcome: Welcome) -> None:
        await served.learn(path, welcome)

    # (the call's reconnect_timeout from the first connection on: the first handshake, a crowd waited out, were
    # given the default's, 15 s, to a client that had asked for 1: trial IK)
    transport = RemoteTransport(
        endpoint,
        description=str(path),
        where=str(path),
        on_connected=connected,
        reconnect_timeout=RECONNECT_TIMEOUT if reconnect_timeout is None else reconnect_timeout,
    )
    loop = asyncio.get_running_loop()
    for attempt in range(5):
        served.found = False
        began = loop.time()
        try:
            # a server crowded by a burst of clients connecting at once is waited out (trial GY)
            await transport.connect(crowd_wait=transport.reconnect_timeout)
            break
        except UnavailableError:
            # a server was found but the connection failed (it was exiting, idle or killed, as we came): the
            # next look starts a new sidecar. A server that could not be started or found is not looked for again,
            # nor one that took the connection and then did not answer (stopped or stuck: each try would wait out
            # the whole handshake, five of them over a minute, and the same server would be found each time).
            if not served.found or attempt == 4 or loop.time() - began >= QUICK_FAILURE:
                raise
            await asyncio.sleep(0.05 * 2**attempt)
    store = Store(transport, mode="sidecar", directory=path, limits=limits)
    _warn_if_not_as_asked(store, limits, durability)
    return store


def _warn_if_not_as_asked(store: Store, limits: Limits | None, durability: str) -> None:
    """Log a warning when the server this call found running holds to other limits or another durability than
    the call asked for: those of its start hold (``store.limits`` shows them), not this call's."""
    welcome = getattr(store.transport, "welcome", None)
    if welcome is None:
        return
    differ: list[str] = []
    if limits is not None and welcome.limits:
        held = store.limits
        differ += [
            f"{name} {getattr(held, name)!r} (asked {getattr(limits, name)!r})"
            for name in limits.__struct_fields__
            if getattr(held, name) != getattr(limits, name)
        ]
    if welcome.durability and welcome.durability != durability:
        differ.append(f"durability {welcome.durability!r} (asked {durability!r})")
    if differ:
        logging.getLogger("tinystore.client").warning(
            "store %s: its server (pid %s) was running already, started with other settings, which hold: %s; "
            "stop it (tinystore stop DIR) to start one with these",
            store.directory,
            welcome.pid,
            ", ".join(differ),
        )


def _check_same(directory: Path, store_id: str) -> None:
    """``UnavailableError`` (``gone``) when ``directory`` holds another store than the one of id ``store_id``
    (nothing when no id is known): a backup restored in its place, another store made there (trial EE: the sidecar
    started for it served nobody, and held the directory against `tinystore serve` for its idle time)."""
    if not store_id:
        return
    found, _ = paths.read_store_id(directory)
    if found != store_id:
        raise another_store(directory, found, store_id)


def _gone(path: str | Path, marks: bool = False) -> UnavailableError:
    """The error of a store whose directory went away while this process used it (``gone``: the transport
    stops trying to reconnect, and waiting calls fail at once). ``marks``: the directory is there, with neither
    ``STARTED`` nor ``EPOCH`` in it (trial EA: "gone", of a directory still there)."""
    if marks and os.path.isdir(path):
        return UnavailableError(
            f"store {path}: the directory holds no mark of a store that ran (neither its STARTED nor its EPOCH "
            "file: removed or moved with the store, or by hand?); not making a new, empty store in its place",
            gone=True,
        )
    return UnavailableError(
        f"store {path}: its directory is gone or holds no store any more (removed or moved while this process "
        "used it); not making a new, empty store in its place",
        gone=True,
    )


def _can_connect(sock: Path) -> bool | None:
    """Whether a server listens on ``sock``: ``True``, ``False`` (nothing listens there), or ``None`` when one
    listens but takes no connection now (its listen backlog is full: ``EAGAIN``, as Linux answers a Unix socket's
    connect then; or the connect timed out). Raises ``PermissionError`` when this process may not reach it."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(str(sock))
        return True
    except PermissionError:
        raise
    except (BlockingIOError, TimeoutError):
        return None
    except OSError:
        return False
    finally:
        s.close()


def _busy(directory: Path, sock: Path) -> UnavailableError:
    pid = (paths.read_address(directory) or {}).get("pid")
    who = f"its server (pid {pid})" if pid else "its server"
    return UnavailableError(
        f"store {directory}: {who} listens on {sock} but takes no connection: its queue of connections is full "
        "(a burst of clients connecting at once; or it is stopped, stuck, or out of file descriptors: see its "
        "ulimit -n)"
    )


async def ensure_server(
    directory: Path, sock: Path, extra: list[str], timeout: float = 20.0, *, existing: bool = False, store_id: str = ""
) -> Path:
    """Make sure someone serves ``directory``: connect, or start a detached sidecar and wait for it.
    Many processes racing here end on one server: only one sidecar gets the directory lock. Returns the socket
    that answered: ``sock``, or the one the server that came up says it serves (a long path's socket is under
    the runtime or temporary folder of that server's environment). ``existing``: the store ran before (this
    process used it); neither this call nor the sidecar it starts makes ``directory`` or a new store in it, and
    with ``store_id`` (the id its clients know, ``Welcome.store``) the sidecar serves that store only.

    Raises ``PermissionDeniedError`` when this process may not reach the socket (the server runs as another
    user: STORE-03) or not write the directory, ``UnavailableError`` when no sidecar came up (``gone``, when
    ``existing`` and the store is no longer at ``directory``: removed or moved, even as the sidecar started)."""
    try:
        state = await asyncio.to_thread(_can_connect, sock)
        if state:
            return sock
    except PermissionError as exc:
        raise PermissionDeniedError(
            f"store {directory}: cannot reach its server's socket {sock}: {exc.strerror}; only the user the "
            "server runs as may connect to it"
        ) from None
    deadline = time.monotonic() + timeout
    next_spawn = 0.0
    if existing:
        # (trial DY: `tinystore stop DIR`, then `mv DIR DIR.old` at once; the sidecar started in between came up
        # after the move, and made a new, empty store at DIR, where this process went on writing)
        extra = [*extra, "--existing", *(["--store-id", store_id] if store_id else [])]
        if not paths.holds_store(directory):
            raise _gone(directory, marks=True)
        _check_same(directory, store_id)
    try:
        log_path = paths.server_dir(directory, make_store=not existing) / "sidecar.log"
    except FileNotFoundError:
        raise _gone(directory) from None
    child: subprocess.Popen[bytes] | None = None
    start = 0
    busy = state is None
    spawning = _SpawnLock(directory, make_store=not existing)
    spawned = 0.0
    serve_seen: int | None = None  # the pid of a `tinystore serve` seen owning the directory as it started
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if existing and not paths.holds_store(directory):
                raise _gone(directory, marks=True)
            if existing:
                _check_same(directory, store_id)
            if busy:
                # a server listens and is overloaded: starting a sidecar would not help (the directory is owned);
                # keep trying to get in until the deadline
                next_spawn = now + 2.0
            elif now >= next_spawn and (until := _stopping_until(directory)) is not None:
                # its server is stopping: the directory is owned until it is done, and a sidecar started now would
                # only fail; wait for it (a grace longer than our deadline moves the deadline: trial AS)
                deadline = max(deadline, now + min(until - time.time(), MAX_STOP_WAIT) + 5.0)
                next_spawn = now + 0.1
            elif now >= next_spawn and serve_seen is not None:
                # a `tinystore serve` owned the directory as it started: one that ends before it serves (killed, or
                # failed) is waited for, never replaced by a sidecar, as a reconnect does (trial JI: a client that
                # had not reached it yet started a sidecar in its place, and the `serve` started again found the
                # directory taken, for as long as the clients kept that sidecar busy)
                next_spawn = now + 0.1
            elif now >= next_spawn and not spawning.may_spawn():
                if lock_holders(directory) and (unreachable := unreachable_owner(directory)) is not None:
                    raise unreachable  # (it serves nothing, and will not: say so now, not at the deadline)
                if owned_by_command(directory) == "serve":
                    owner = min(lock_holders(directory) or {0})
                    if owner and not started_by_sdk(owner):  # (a sidecar or private server: trials JK, JL)
                        serve_seen = owner
                # a process owns the directory (a sidecar starting, most likely), or another client is starting
                # one: one more would only lose the race, and on a busy machine slow the winner down (trial CG:
                # 24 processes that lost their sidecar started 175 between them, and all failed at 30 s)
                next_spawn = now + 0.1
            if now >= next_spawn and child is not None and child.returncode is None and now - spawned < CHILD_START:
                # the one this call started still starts (an interpreter is slow to start on a busy machine): one
                # more would only lose the race to it (trial CK: a "sidecar not needed" line after a stop)
                next_spawn = now + 0.1
            if now >= next_spawn:
                child, start = _spawn_sidecar(directory, extra, log_path)
                spawned = now
                next_spawn = now + 2.0
            await asyncio.sleep(0.02)
            # (the server that comes up may serve another socket than the one that was looked at first: a
            # stopping server under another runtime folder, then ours: trial AW)
            sock = await asyncio.to_thread(paths.served_socket, directory)
            state = await asyncio.to_thread(_can_connect, sock)
            if state:
                return sock
            busy = state is None
            if child is not None and child.returncode not in (None, 0):
                # it said why it could not start (a full disk, a read-only directory, a corrupt file): that will
                # not pass by starting it again. A busy directory may: another process's sidecar is starting.
                err = _sidecar_error(log_path, start)
                if existing and not paths.holds_store(directory):
                    raise _gone(directory, marks=True)  # (it refused to make a new store: none that ran is there)
                if err is not None and (not isinstance(err, InUseError) or socket_gone(directory) is not None):
                    raise err  # (a busy directory may pass, but not a server whose socket was removed)
                until = _stopping_until(directory)
                if until is not None:
                    # its server is stopping, its calls under way given a grace: the directory is free after it
                    # (trial AS: a grace of 25 s outlasted the 20 s, and open() failed as if another process kept
                    # it)
                    deadline = max(deadline, time.monotonic() + min(until - time.time(), MAX_STOP_WAIT) + 5.0)
                full = _disk_full(directory) if err is None else None
                if full is not None:  # (it could not even write why to its log)
                    raise UnavailableError(
                        f"store {directory}: the sidecar could not start: the disk is full ({full}); free some "
                        "space and open the store again"
                    )
    finally:
        spawning.release()
    if busy:
        raise _busy(directory, sock)
    info = paths.read_address(directory) or {}
    if _stopping_until(directory) is not None:
        raise UnavailableError(
            f"store {directory}: its server (pid {info.get('pid')}) is stopping and has not let the directory go "
            f"{time.time() - float(info['stopping_until']):.0f}s after its grace ended; open it again once it has"
        )
    owners = lock_holders(directory) or set()
    command = owned_by_command(directory)
    if serve_seen is not None and not owners:
        raise UnavailableError(
            f"store {directory}: the `tinystore serve` that was starting there (pid {serve_seen}) ended before it "
            f"served, and no server came up within {timeout:g}s; a client starts a sidecar only where no `tinystore "
            "serve` runs: start the server again"
        )
    if owners and command is not None and command != "serve":
        # (trial DE: a command still running past the wait was named as "a sidecar still starting")
        raise UnavailableError(
            f"store {directory}: the command `tinystore {command}` (pid {min(owners)}) has held the store for all "
            f"of the {timeout:g}s this waited (a command opens the store itself when no server runs); run "
            f"`tinystore serve {directory}` for applications and commands to share it at once"
        )
    if owners:
        # (trial CG: "the sidecar did not start within 20s (... the directory is owned by its sidecar server ...)")
        raise UnavailableError(
            f"store {directory}: no server answered within {timeout:g}s: process {min(owners)} owns the directory "
            f"(it holds {LOCK}) and does not serve it yet (a sidecar still starting on a busy machine, or a program "
            "that opened the store embedded)"
        )
    err = _sidecar_error(log_path, 0)
    why = err.message if err is not None else _last_line(log_path)
    raise UnavailableError(f"store {directory}: the sidecar did not start within {timeout:g}s ({why})")


SPAWNING = "spawning"
"""``DIR/server/spawning``: the client that starts a sidecar holds its lock (``flock``) while it waits for it, so
that the others wait with it rather than start their own (the kernel lets it go when that process dies)."""


CHILD_START = 10.0
"""Seconds a sidecar this process started is given to take the directory before another is started."""
SPAWN_STALL = 5.0
"""Seconds a client waits behind another that holds the lock of :data:`SPAWNING` while no process owns the
directory, before it starts a sidecar itself."""


class _SpawnLock:
    """The lock of ``DIR/server/`` :data:`SPAWNING`, for one :func:`ensure_server` call."""

    def __init__(self, directory: Path, make_store: bool = True) -> None:
        self.directory = directory
        self.make_store = make_store  # (see paths.server_dir)
        self.fd: int | None = None
        self.blocked_since: float | None = None  # (monotonic) since when another process holds it, nobody LOCK

    def may_spawn(self) -> bool:
        """Whether this process may start a sidecar now: no process owns the directory (holds its ``LOCK``), and
        this call holds the lock (taken now if it was free; kept until :meth:`release`)."""
        if lock_holders(self.directory):
            return False
        if self.fd is not None:
            return True
        import fcntl

        try:
            folder = paths.server_dir(self.directory, make_store=self.make_store)
            fd = os.open(folder / SPAWNING, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return True  # (no lock to take: start one, as before)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            # its holder starts a sidecar, which takes LOCK within moments: one held this long with no owner of
            # the directory is a client that froze or hangs (trial CK: every open() waited its 20 s behind it)
            now = time.monotonic()
            if self.blocked_since is None:
                self.blocked_since = now
            return now - self.blocked_since >= SPAWN_STALL
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _spawn_sidecar(directory: Path, extra: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start a detached sidecar for ``directory``, its stderr to the end of ``log_path``; returns it and where
    its lines start in the log."""
    with log_path.open("ab") as log:
        start = log.tell()
        child = subprocess.Popen(
            _server_cmd(directory, *extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    threading.Thread(target=child.wait, daemon=True).start()  # reap it when it exits
    return child, start


MAX_STOP_WAIT = 300.0
"""Seconds at most that ``open`` waits for a stopping server's grace to end."""


def _stopping_until(directory: Path) -> float | None:
    """When the grace of ``directory``'s stopping server ends (Unix time), or None: none is stopping (a server
    killed while it stopped leaves its address behind: its pid no longer holds the directory, trial AW)."""
    info = paths.read_address(directory) or {}
    until = info.get("stopping_until")
    pid = info.get("pid")
    if not isinstance(until, int | float) or not isinstance(pid, int):
        return None
    holders = lock_holders(directory)
    if holders is not None:
        return float(until) if pid in holders else None
    return float(until) if pid_alive(pid) else None


def _sidecar_error(log_path: Path, start: int) -> TinystoreError | None:
    """The last ``error[code] message`` line a sidecar wrote to its log from byte ``start`` on, as its error."""
    try:
        with log_path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        code, sep, message = line.partition("] ")
        if sep and code.startswith("error[") and message:
            # (a sidecar that lost the race to start says so first: docs/serving.md)
            return error_from(code.removeprefix("error["), message.removeprefix(SIDECAR_NOT_NEEDED))
    return None


SIDECAR_NOT_NEEDED = "sidecar not needed: "
"""How a sidecar that found the directory owned begins its error line in ``sidecar.log``."""


DISK_FULL_BYTES = 256 * 1024
"""Below this much free space (for this user), a sidecar that exited without a word is taken to have found the
disk full."""


def _disk_full(directory: Path) -> str | None:
    """How the file system holding ``directory`` is full (``"12 KiB free"``, ``"no free inodes"``), or None."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    if st.f_files and st.f_favail == 0:
        return "no free inodes"
    free = st.f_bavail * st.f_frsize
    return f"{free // 1024} KiB free" if free < DISK_FULL_BYTES else None


def _last_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError as exc:
        return f"its log {log_path} cannot be read: {exc.strerror}"
    return lines[-1] if lines else f"its log {log_path} is empty: is the disk full?"


async def connect(
    address: str, *, token: str = "", ssl_context: ssl.SSLContext | None = None, reconnect_timeout: Duration = 30.0
) -> Store:
    """Connect to a server over TCP (``tcp://host:port``) or TLS (``tls://host:port``, verified with
    ``ssl_context`` or the system's CAs before the token is sent) with ``token``.

    When the connection drops, the SDK reconnects by itself (exponential backoff, 50 ms doubling to 2 s, with
    "equal jitter": each wait drawn between half and all of it, as Marc Brooker's "Exponential Backoff And
    Jitter", AWS Architecture Blog, 2015, names it); calls made meanwhile
    wait for it up to ``reconnect_timeout`` (a duration; 30 s), then raise ``UnavailableError``. Reads are sent
    again; a write whose answer was lost raises ``OutcomeUnknownError`` (STORE-06).

    The first connection waits the same way for what passes: nothing listening yet (a worker started before its
    server, a server restarting), a connection reset, the server refusing it because too many connections wait
    for their handshake (a burst of clients), or not answering its handshake within 15 s (or what is left of
    ``reconnect_timeout``; a server out of file descriptors leaves new connections waiting in its listen queue);
    it is tried again with that backoff until ``reconnect_timeout`` has passed, then ``UnavailableError`` names the
    address, the time waited and the last failure.

    Raises ``UnauthenticatedError`` (token refused: at once), ``UnavailableError`` (cannot reach within
    ``reconnect_timeout``; at once for a certificate not trusted, a host that does not resolve), ``InvalidError``
    (a bad address or option, a
    token over 4096 bytes: before anything is tried). Cancelled, it leaves nothing behind: no connection open,
    nothing trying in the background.
    """
    scheme, host, port = _parse_address(address)
    if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
        raise InvalidError(f"connect: ssl_context {ssl_context!r}: expected an ssl.SSLContext")
    if ssl_context is not None and scheme == "tcp":
        raise InvalidError(
            f"connect: address {address!r}: an ssl_context was given but the address is tcp:// (plain text: the "
            "token would be sent in the clear); use tls://HOST:PORT"
        )
    if not isinstance(token, str):
        raise InvalidError(f"connect: token: expected a str, got {type(token).__name__}")
    try:
        size = len(token.encode())
    except UnicodeEncodeError as exc:  # the token is never shown
        raise InvalidError(
            f"connect: token: not valid Unicode text (a lone surrogate at character {exc.start}): a token is the "
            "text of a line of the server's tokens file"
        ) from None
    if size > TOKEN_MAX:
        raise InvalidError(
            f"connect: token: {size} bytes; a token holds at most {TOKEN_MAX} bytes (UTF-8), as the server's "
            "tokens file does"
        )
    reconnect_timeout = _checked_reconnect_timeout("connect", reconnect_timeout)
    ctx = None
    if scheme == "tls":
        ctx = ssl_context or _default_tls_context()

    async def endpoint() -> tuple[str, Any]:
        return "tcp", (host, port, ctx)

    transport = RemoteTransport(endpoint, token=token, description=address, reconnect_timeout=reconnect_timeout)
    await transport.connect(wait=True)
    return Store(transport, mode="remote", directory=None)


def _default_tls_context() -> ssl.SSLContext:
    """The system's CAs, or those of the file ``$SSL_CERT_FILE`` names (OpenSSL's rule). ``InvalidError`` when the
    variable names no file of certificates: OpenSSL skips such a file without a word, and the server's
    certificate would then fail to verify (or the system's CAs stand in for the ones meant)."""
    cafile = os.environ.get("SSL_CERT_FILE")
    if cafile and os.path.exists(cafile) and not os.path.isdir(cafile) and not os.path.isfile(cafile):
        # (a FIFO or a device: OpenSSL would read it, and connect() wait for ever on a FIFO nobody writes: trial CO)
        raise InvalidError(
            f"connect: SSL_CERT_FILE={cafile!r}: not a regular file; it should name a file of PEM CA certificates to "
            "verify tls:// servers with (unset it to use the system's)"
        )
    ctx = ssl.create_default_context()
    if cafile:
        try:
            ctx.load_verify_locations(cafile=cafile)
        except FileNotFoundError:
            problem = "no such file"
        except IsADirectoryError:
            problem = "a directory, not a file (SSL_CERT_DIR is for a directory of certificates)"
        except ssl.SSLError:  # (an OSError too: before it)
            problem = "it holds no PEM certificate"
        except OSError as exc:
            problem = exc.strerror or str(exc)
        else:
            return ctx
        raise InvalidError(
            f"connect: SSL_CERT_FILE={cafile!r}: {problem}; it should name a file of PEM CA certificates to verify "
            "tls:// servers with (unset it to use the system's)"
        )
    return ctx


def _parse_address(address: object) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``tcp://HOST:PORT`` / ``tls://HOST:PORT`` (see :func:`parse_address`)."""
    return parse_address(address, "connect: address")


__all__ = ["ClosedError", "InUseError", "Store", "connect", "open"]
