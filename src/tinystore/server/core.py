"""The store without its sockets: the owned directory, the clock, the engines and the method table.

A :class:`Core` is what a server process runs and what an embedded store runs inside the application.
Each client is a :class:`Session` (the engines' :class:`~tinystore.engines.base.Peer`); the listeners turn
frames into :meth:`Core.invoke` calls, and the embedded store calls it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from .. import __version__
from ..clock import Clock
from ..engines.descriptors import LOCAL_KEPT, open_descriptors, open_files_limit
from ..engines.sql import HALT_WAIT as HALT_JOIN
from ..engines.sql import SqlDatabase, SqlEngine
from ..errors import ClosedError, InvalidError, PermissionDeniedError, TinystoreError, UnavailableError
from ..limits import Limits
from . import paths
from .dirlock import DirLock, next_epoch
from .output_budget import OutputBudget

log = logging.getLogger("tinystore.server")

Handler = Callable[["Session", Any], Any]


READ_FACTS_EACH = 8
READ_FACTS_MAX = 10_000
"""``Core.read_facts`` keeps the newest 8 of each client, of 10,000 clients at most."""


@dataclass(frozen=True, slots=True)
class Method:
    """One callable method: its request body type, its handler, whether it writes, and who may call it."""

    name: str
    request: Any
    handler: Handler
    write: bool = False
    admin: bool = False
    # ``undo(session, result)``: gives back what a result hands the client (a transaction's id), when its answer
    # is dropped: the client cancelled the call after the handler had returned (see Listener's ``cancel``)
    undo: Callable[[Session, Any], None] | None = None


@dataclass(eq=False)
class Session:
    """One client: a connection, or the embedded process itself. Implements the engines' ``Peer``."""

    id: int
    core: Core
    local: bool
    capability: str
    push_fn: Callable[[str, Any], None]
    name: str = ""
    closed: bool = False
    transactions: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    calls: int = 0

    def push(self, method: str, body: Any) -> None:
        if not self.closed:
            self.push_fn(method, body)

    def full(self, full: bool) -> None:
        """The client cannot take more pushes for now (``full``: the bytes waiting to be written to its
        connection passed the high-water mark), or can again: every engine that pushes may hold back
        (``Core.session_full_hooks``) hears it."""
        if self.closed:
            return
        for hook in self.core.session_full_hooks:
            try:
                hook(self, full)
            except Exception:
                log.exception("session %s: telling an engine the client is %s", self.id, "full" if full else "ready")

    def close(self) -> None:
        """The client is gone: roll back its transactions and let every engine drop what it held."""
        if self.closed:
            return
        self.closed = True
        self.core.sessions.pop(self.id, None)
        for hook in self.core.session_close_hooks:
            try:
                hook(self)
            except Exception:
                log.exception("closing session %s", self.id)


class Core:
    """Everything a store is, minus the sockets.

    ``directory``: the store's folder (created). ``clock``: the one clock every engine reads. ``limits``:
    bounds and defaults. ``durability``: ``"full"`` (fsync at each commit) or ``"os"``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        limits: Limits | None = None,
        durability: str = "full",
        existing: bool = False,
        expect_id: str = "",
    ) -> None:
        self.directory = Path(directory).resolve()
        self.existing = existing  # open only a store that ran before: make no directory, no new store
        self.expect_id = expect_id  # with existing: and only the store of this id (paths.STORE_ID; trial EE)
        self.clock = clock or Clock()
        self.limits = limits or Limits()
        self.limits_json = self.limits.to_json()  # told to each client in its Welcome
        # (all listeners' connections; made here, in the loop that runs them)
        self.output_budget = OutputBudget(
            self.limits.client_output_bytes,
            later=lambda delay, fn: asyncio.get_running_loop().call_later(delay, fn),
            stall=self.limits.client_output_stall,
        )
        self.durability = durability
        self.methods: dict[str, Method] = {}
        self.sessions: dict[int, Session] = {}
        self.session_close_hooks: list[Callable[[Session], None]] = []
        # (session, full): a session's client cannot take more pushes for now, or can again (Session.full)
        self.session_full_hooks: list[Callable[[Session, bool], None]] = []
        self.status_hooks: dict[str, Callable[[], Any]] = {}
        self.stop_hooks: list[Callable[[], Awaitable[None]]] = []
        # run once, as the store begins to stop (see begin_stopping)
        self.stopping_hooks: list[Callable[[], None]] = []
        self._stopping_begun = False
        self._ids = itertools.count(1)
        self._lock = DirLock(self.directory)
        self.epoch = 0
        self._releaser: threading.Thread | None = None  # (see stop)
        self.store_id = ""  # (see paths.store_id)
        self._file_work: list[threading.Event] = []  # (see file_work)
        self.started = 0.0
        self.running = False
        self.stopping = asyncio.Event()
        self.stopped = asyncio.Event()
        self.stop_requested = asyncio.Event()
        self.stop_grace = 10.0
        self.grace_ends = math.inf  # (time.monotonic(): the stop's grace ends then; see stop and grace_ended)
        self.grace_over = asyncio.Event()  # (see end_grace)
        #: the server process's exit status: 0 for a stop asked for (SIGTERM, ``tinystore stop``, idle, its
        #: parent's exit), :data:`~tinystore.server.paths.EXIT_LOST_PLACE` when it stopped because its directory or
        #: socket went away (a private server's SDK starts another for a removed socket)
        self.exit_status = 0
        self.mode = "serve"  # serve | sidecar | private | embedded
        self.sql: SqlEngine
        self.engines: dict[str, Any] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.listeners: list[Any] = []
        self.instances: dict[str, Any] = {}  # SDK transport → its connection now (see ServerConnection.supersede)
        #: what servers of this directory read of SDK transports' connections that ended without telling their
        #: client (a graceful stop's GOAWAY the client did not read: trial BW, its loop blocked, the GOAWAY behind
        #: 32 MiB of answers; a connection the network cut, ended as the client's next one came): instance →
        #: ``(server epoch, connection number, last stream read)``, told each client as it connects
        #: (``Welcome.last_reads``): a request after the last one read was never run, a write too. Facts, each
        #: naming its connection, so told any number of times; kept across restarts (``DIR/server/last-read``),
        #: the newest few of each client and of the store
        self.read_facts: paths.ReadFacts = {}

    async def start(self) -> None:
        """Own the directory and start the engines. Raises ``InUseError`` when another process owns it."""
        if durability_bad(self.durability):
            raise InvalidError(f'durability {self.durability!r}: use "full" or "os"')
        if self.existing:
            self._check_ran()
        else:
            paths.make_directory(self.directory, "serve")
        paths.check_store_dir(self.directory, f"store {self.directory}")
        # (STARTED is written by every start once its EPOCH is: not its LOCK, made before, which a first
        # start that failed then leaves: trial DN, a full disk at the first start of SQLite files given to it)
        self._lock.acquire()
        try:
            paths.remove_unserved(self.directory)  # (left by an owner that was killed)
            self._note_unclean_end()
            ran_before = paths.started_before(self.directory)
            if self.existing:
                self._check_ran()  # (again, as the directory is owned: it may have moved meanwhile)
            self.epoch = next_epoch(self.directory, self.clock.now_ms(), ran_before)
            paths.mark_started(self.directory, self.epoch)
            self.store_id = paths.store_id(self.directory, ran_before)
            self.read_facts = paths.read_last_read(self.directory)
            self.started = time.time()
            self.sql = SqlEngine(self.directory, self.limits, self.durability)
            self.sql.connections = self.socket_connections
            self.sql.kept_local = self.kept_local
            from . import methods

            methods.install(self)
        except BaseException:
            self._lock.release()
            raise
        self.running = True

    def _note_unclean_end(self) -> None:
        """Log a warning when the directory's last server did not stop cleanly: its address file is still there
        (a clean stop removes it), and it is this process that owns the directory now, so that server is gone,
        killed (``kill -9``, out of memory) or crashed, or an embedded store whose process ended without
        ``close()``. An operator reading the log learns of it (trial IT: nothing said so); SQLite recovers each
        database from its write-ahead log, so nothing it acknowledged is lost."""
        try:
            last = paths.read_address(self.directory)
        except Exception:  # (a note only: never fails a start)
            return
        if not last:
            return
        started = last.get("started")
        when = ""
        if isinstance(started, (int, float)):
            with contextlib.suppress(ValueError, OverflowError, OSError):
                when = f", started {datetime.fromtimestamp(started).isoformat(sep=' ', timespec='seconds')}"
        log.warning(
            "the last process that owned %s (pid %s, %s%s) did not stop cleanly: it was killed or crashed, or its "
            "embedded store's program ended without close(); SQLite recovers each database from its write-ahead log",
            self.directory,
            _plain(last.get("pid", "?")),
            _plain(last.get("mode", "serve")),
            when,
        )

    def _check_ran(self) -> None:
        """With ``existing``: ``UnavailableError`` unless a store that ran is at the directory (a sidecar started
        in place of one whose store was then removed or moved: its clients' writes must not go to a new one)."""
        if not paths.holds_store(self.directory):
            raise UnavailableError(
                f"store {self.directory}: no store that ran is there any more (removed or moved?); not making a "
                "new, empty one in its place"
            )
        if self.expect_id and (found := paths.read_store_id(self.directory)[0]) != self.expect_id:
            # (trial EE: a backup restored in place while a client's sidecar was gone: started in its place, it
            # held the directory for its idle time, serving nobody, and `tinystore serve` was refused)
            raise UnavailableError(
                f"store {self.directory}: another store is there now (id {found or 'none'}, not {self.expect_id}); "
                "not serving it in place of the one that ran"
            )

    def read_fact(self, instance: str, connection: int, last: int) -> None:
        """Note that this server read up to stream ``last`` of connection ``connection`` of SDK transport
        ``instance``, which ended without telling it (see ``read_facts``)."""
        facts = self.read_facts.pop(instance, [])  # (re-inserted: the newest clients last)
        # (one fact a connection: a stop notes its connections, which end after)
        facts = [f for f in facts if f[0] != self.epoch or f[1] != connection]
        facts.append((self.epoch, connection, last))
        self.read_facts[instance] = facts[-READ_FACTS_EACH:]
        while len(self.read_facts) > READ_FACTS_MAX:
            del self.read_facts[next(iter(self.read_facts))]

    def register(self, method: Method) -> None:
        self.methods[method.name] = method

    def new_session(
        self, push: Callable[[str, Any], None], *, local: bool, capability: str = "admin", name: str = ""
    ) -> Session:
        if not self.running or self.stopping.is_set():
            raise ClosedError(f"store {self.directory} is stopping")
        s = Session(next(self._ids), self, local, capability, push, name)
        self.sessions[s.id] = s
        return s

    def invoke(self, session: Session, name: str, request: Any) -> Any:
        """Call method ``name`` for ``session``: returns a value, a future, or a coroutine to await.

        Raises ``InvalidError`` (unknown method), ``PermissionDeniedError`` (capability), ``ClosedError``
        (stopping), or whatever the method raises at once.
        """
        method = self.methods.get(name)
        if method is None:
            raise InvalidError(f"unknown method {name!r}")
        if method.admin and session.capability != "admin":
            raise PermissionDeniedError(f"{name}: needs the admin capability; this token has {session.capability!r}")
        if method.write and session.capability == "read":
            raise PermissionDeniedError(f"{name}: this token may only read")
        if session.closed:
            raise ClosedError("the session is closed")
        session.calls += 1
        return method.handler(session, request)

    async def call(self, session: Session, name: str, request: Any) -> Any:
        """:meth:`invoke` and await whatever it returned."""
        result = self.invoke(session, name, request)
        if inspect.isawaitable(result):
            return await result
        return result

    def spawn(self, coro: Awaitable[Any], name: str = "") -> asyncio.Task[Any]:
        """Start a task owned by the core: it is cancelled and awaited at stop."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def kept_local(self) -> int:
        """Descriptors kept for the command line's connections to the directory's own socket (``status`` and
        ``stop``): :data:`LOCAL_KEPT` when the server listens on it (trial IK: clients of that socket too took them
        all, beside a TCP listener or not), else none."""
        return LOCAL_KEPT if any(lst.description.startswith("unix:") for lst in self.listeners) else 0

    def socket_connections(self) -> int:
        """The connections this server's listeners hold or are making (each holds a descriptor)."""
        return sum(len(lst.connections) + len(lst.starting) + lst.accepting for lst in self.listeners)

    def status(self) -> dict[str, Any]:
        self.output_budget.refresh()
        out: dict[str, Any] = {
            "version": __version__,
            "sqlite_version": sqlite3.sqlite_version,  # (what the SQL of its databases is)
            "directory": str(self.directory),
            "pid": os.getpid(),
            "epoch": self.epoch,
            "started": self.started,
            "uptime": round(time.time() - self.started, 3),
            "test_clock": self.clock.is_test,
            "now": self.clock.now(),
            "durability": self.durability,
            # what this server holds to (trial IA: an operator could not see that a --limits had taken)
            "limits": msgspec.to_builtins(self.limits),
            # the descriptors open and the process's limit (RLIMIT_NOFILE; -1: none known), shared by the
            # connections and the databases' files (trial IE: clients waiting for want of them showed nowhere but
            # in the log)
            "files": {"open": open_descriptors(), "limit": open_files_limit()},
            "mode": self.mode,
            "connections": [
                {
                    "id": s.id,
                    "name": s.name,
                    "local": s.local,
                    "capability": s.capability,
                    "calls": s.calls,
                    "since": s.started,
                }
                for s in self.sessions.values()
            ],
            "databases": self.sql.status(),
            # bytes written for clients and not yet taken by them, all connections together (noted at each
            # write; see output_budget), the bound, and the connections closed for it
            "unsent": {
                "bytes": self.output_budget.total,
                "limit": self.output_budget.limit,
                "stall": self.output_budget.stall,
                "evicted": self.output_budget.evicted,
            },
        }
        for key, hook in self.status_hooks.items():
            try:
                out[key] = hook()
            except Exception as exc:
                out[key] = {"error": str(exc)}
        return out

    def begin_stopping(self) -> None:
        """The store begins to stop: the engines' ``stopping_hooks`` run (once): no lease is given to another client
        from now on (see ``LocksEngine.stop_granting``).
        What was given goes on, and calls are still served (an embedded store being closed waits first for what
        its own SDK runs: a lease's block, its clean-up, may still write). Never raises."""
        if self._stopping_begun:
            return
        self._stopping_begun = True
        for hook in self.stopping_hooks:
            try:
                hook()
            except Exception:
                log.exception("an engine's stopping hook failed")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop gracefully (STORE-05): no new calls; sessions closed (their transactions rolled back);
        engines stopped; SQLite files checkpointed and closed; the directory lock let go. Idempotent."""
        if self.stopping.is_set():
            await self.stopped.wait()
            return
        self.begin_stopping()
        ends = self.grace_ends = time.monotonic() + grace
        self.stopping.set()
        with contextlib.suppress(OSError):
            paths.mark_stopping(self.directory, time.time() + grace)
        try:
            if self.running:
                # open transactions are rolled back now, not left to hold the writer until tx_idle while their
                # statements are refused (STORE-05)
                self.sql.stop_transactions()
            await asyncio.gather(*(lst.close(grace) for lst in list(self.listeners)), return_exceptions=True)
            for s in list(self.sessions.values()):
                s.close()
            for hook in reversed(self.stop_hooks):
                try:
                    await hook()
                except Exception:
                    log.exception("stopping an engine")
            for task in list(self._tasks):
                task.cancel()
            tasks_end = time.monotonic() + grace  # (the tasks cancelled above are given a grace of their own)
            while (left := [t for t in self._tasks if not t.done()]) and time.monotonic() < tasks_end:
                if self.grace_over.is_set():
                    break
                await self.within_grace(left, tasks_end - time.monotonic())
            if self.running:
                # what the databases' threads still run past the grace is interrupted (trial DZ: a migration ran
                # on 30 s past it, and committed after the lock was let go; at least a second for the work
                # queued to end as it should, unless the grace was ended: a tenth)
                least = 0.1 if self.grace_over.is_set() else 1.0
                await self.sql.close(max(least, ends - time.monotonic()))
            self.clock.close()
        finally:
            sql = self.sql if self.running else None
            if self.running and self.read_facts:
                with contextlib.suppress(OSError):
                    paths.write_last_read(self.directory, self.read_facts)
            self.running = False
            # the address this process wrote, if it served, goes before the directory does (a stale one misleads)
            paths.remove_address(self.directory)
            paths.remove_unserved(self.directory)
            work = [e for e in self._file_work if not e.is_set()]
            if (sql is not None and sql.busy()) or work:
                # cancelled (or failed) while the databases' threads still run, or a backup's copy (trial EA: a
                # second Ctrl-C, a wait_for around an embedded store's close; a write then committed under the next
                # owner): what they run is interrupted, and the directory is let go once they have ended, not before
                # (or by the OS, as this process exits: the threads end with it, their transactions rolled back)
                dbs = sql.every_database() if sql is not None else []
                for db in dbs:
                    db.halt()
                self._releaser = threading.Thread(
                    target=self._release_after, args=(dbs, work), name="tinystore-let-go", daemon=True
                )
                self._releaser.start()
            else:
                self._lock.release()
            self.stopped.set()

    def end_grace(self) -> None:
        """End the stop's grace now (a second SIGINT or SIGTERM to the server): what the calls under way still run is
        interrupted (rolled back, and answered ``ClosedError``) as at the grace's end, rather than waited for. The
        directory is still let go only once the databases' threads have ended (see :meth:`stop`)."""
        self.grace_over.set()

    async def grace_ended(self) -> None:
        """Return once a stop's grace has ended (its time passed, or :meth:`end_grace`): for work the stop cannot
        cancel at once, a backup's copy in its thread, to stop at the grace's end as the calls under way are."""
        await self.stopping.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, self.grace_ends - time.monotonic())):
                await self.grace_over.wait()

    async def within_grace(self, aws: Sequence[asyncio.Future[Any]], timeout: float) -> None:
        """Wait until every one of ``aws`` is done, ``timeout`` seconds have passed, or :meth:`end_grace` was
        called, whichever comes first (nothing of ``aws`` is cancelled)."""
        if not aws or self.grace_over.is_set():
            return
        over = asyncio.ensure_future(self.grace_over.wait())
        try:
            await asyncio.wait([*aws, over], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            over.cancel()
            await asyncio.gather(over, return_exceptions=True)

    def file_work(self) -> threading.Event:
        """An event for a thread that reads or writes the store's files outside the engines (a backup's copy) to set
        as it ends: the directory is let go only once it is set (see :meth:`stop`)."""
        self._file_work = [e for e in self._file_work if not e.is_set()]
        ended = threading.Event()
        self._file_work.append(ended)
        return ended

    def _release_after(self, dbs: list[SqlDatabase], work: list[threading.Event]) -> None:
        """Let the directory go once no thread of ``dbs`` runs and every one of ``work`` is set (in a thread of its
        own: see :meth:`stop`)."""
        while not SqlEngine.join(dbs, HALT_JOIN) or not all(e.wait(HALT_JOIN) for e in work):
            log.warning("stopping: the directory is let go once the threads that have its files open have ended")
        self._lock.release()


def durability_bad(value: str) -> bool:
    return value not in ("full", "os")


def error_of(exc: BaseException) -> TinystoreError:
    """Any exception as a TinyStore error (an unexpected one is logged and becomes ``internal``)."""
    if isinstance(exc, TinystoreError):
        return exc
    log.error("internal error", exc_info=exc)
    return TinystoreError(f"internal error: {type(exc).__name__}: {exc}")


def _plain(value: object) -> str:
    """A value read from a file, for a log line: an int or a short word as it is, anything else (text with line
    breaks in it, a list) as its repr, cut short (trial IY: an address file's pid of text with a line break in it
    wrote a line of its own into the log)."""
    if isinstance(value, int) or (isinstance(value, str) and value.isidentifier() and len(value) <= 32):
        return str(value)
    return repr(value)[:64]
