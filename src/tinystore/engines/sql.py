"""SQL databases: SQLite files in WAL mode, one writer thread each, a few reader threads, group commit.

The event loop never waits on SQLite longer than the inline read budget: a write or a long read is done by a
thread, which hands its result back to the loop (a future, or a :class:`Later` for the server's answers).

- Writes (:meth:`SqlDatabase.write`, :meth:`SqlDatabase.write_later`) go to the writer thread: what one
  turn of the loop queues is handed over in one piece. Independent single-statement writes that are queued
  together share one transaction and one fsync (group commit); one failure fails only its own statement
  (they run without savepoints; when one fails, the batch runs again with a savepoint each, see
  ``_group_commit``).
- Reads (:meth:`SqlDatabase.read`, :meth:`SqlDatabase.read_now`) run on read-only connections; WAL gives
  each a snapshot and the writer never blocks them. A read first runs on the loop's own connection under a
  time budget (``Limits.inline_read``, 0.5 ms): SQLite's progress handler interrupts it past the budget and
  it runs again on a reader thread. A point read so costs no thread hop, and the loop is never held longer
  than the budget. The inline reads of one loop turn share one read transaction (``_begin_snapshot``).
- Interactive transactions (:meth:`SqlDatabase.begin`) take the writer at their start (``BEGIN IMMEDIATE``)
  and hold it until commit, rollback, or until they stay idle past ``tx_idle`` or run past ``tx_max``.
  Read-only transactions hold one reader connection with a snapshot instead.
- A client's statements may not control transactions, nor attach files (SQLite's authorizer: ``sql_guard``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import operator
import os
import queue
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from ..errors import (
    ClosedError,
    ConflictError,
    CorruptError,
    InvalidError,
    LimitError,
    OutcomeUnknownError,
    PermissionDeniedError,
    TimeoutError_,
    TinystoreError,
    UnavailableError,
)
from ..limits import Limits
from ..names import NAME, RESERVED_DB_PREFIX, check_name, reserved_db_error
from ..protocol.sql import Done, Rows
from .descriptors import check_room, database_files
from .limited_log import LimitedLog
from .read_queue import FairReads
from .sql_errors import (
    autoincrement_spent,
    check_migration_order,
    check_migration_renames,
    error_name,
    interrupted,
    migration_error,
    rolled_back_by,
    sql_error,
    storage_error,
)
from .sql_guard import (
    DEFERRING_TAG,
    MOVE_OFF_LOOP,
    WRITER_ONLY,
    GuardedConnection,
    as_engine,
    check_own_objects,
    ctl,
    denial,
    names_own,
    own_execute,
    own_objects,
    own_sql,
    restrict,
    rollback_quietly,
    rowid_tables,
    set_rowid,
    statement_authorizer,
    unrestrict,
)
from .sql_text import (
    CACHED_SQL,
    INT_MAX,
    ParamsIn,
    SqlParams,
    changes_schema,
    check_migrations,
    check_params,
    defers_foreign_keys,
    has_deferred_constraint,
    holds_no_statement,
    insert_target,
    is_insert,
    is_vacuum,
    is_vacuum_itself,
    named_placeholder,
    names_last_rowid,
    no_statement,
    same_migration,
    sets_foreign_keys,
    split_sql,
)

log = logging.getLogger("tinystore.sql")

_first = operator.itemgetter(0)
MIGRATIONS_TABLE = "_tinystore_migrations"
BATCH_MAX = 512
"""At most this many single writes share one commit."""
_STORAGE_CODES = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY_")
"""SQLite's error codes of what the file system refused (see ``sql_errors.storage_error``)."""
LAZY_FILES = 2
"""Files an open database may still open (its connections' WAL, at their first reads): spoken for when another
database opens (see :func:`check_room`)."""
TX_FILES = 2
"""The descriptors a read-only transaction's own connection opens (its database file and its WAL)."""
STALL_SLACK = 0.1
"""Seconds a transaction's thread may wake past its idle wait before the wait is taken as the server's own stall
(the process stopped or starved), not the client's idleness: the idle wait then starts again."""
PLACE_CHECK_EVERY = 0.01
"""Seconds between two looks of a database's writer at its files (is the database file still the one opened, its
WAL still the one SQLite writes), each before a commit: see ``SqlDatabase._check_in_place``."""
IDLE_GRACE = 0.25
"""Seconds of a last look for a transaction's next call once its idle wait ended on time (a stop of the process
that ended just then: its loop has yet to read the call)."""
_NO_CALL: Any = object()


BUSY_TIMEOUT_MS = 60_000
"""How long a connection waits for a lock another holds (SQLite's busy timeout)."""
CHECKPOINT_WAIT_MS = 1_000
"""How long a checkpoint through exec waits for readers (see ``SqlDatabase._vacuum``)."""
WAL_BOUND = 64 * 1024 * 1024
"""Bytes of a database's WAL past which its writer checkpoints it whole and truncates it (see
``SqlDatabase._bound_wal``): SQLite's automatic checkpoint cannot reset a WAL while reads that overlap without a pause
keep snapshots in it, and it grew without end (trial EI: 5 MB/s, 337 MB, kept until the store stopped)."""
WAL_LOOK_EVERY = 1.0
"""Seconds between two looks of the writer at its WAL's size (and two tries to truncate it, when past the bound)."""
WAL_WAIT_MS = 250
"""How long such a checkpoint waits for the reads that still use the WAL, holding the writes meanwhile."""
_UNLIMITED = 86400.0 * 365
"""A migration's ``tx_max`` and ``tx_idle`` (a year: none)."""


def _take(calls: queue.SimpleQueue[Any], timeout: float) -> Any:
    """The next call of a transaction within ``timeout`` seconds, or ``_NO_CALL``."""
    try:
        return calls.get(timeout=timeout)
    except queue.Empty:
        return _NO_CALL


_DEFER_WHY = (
    "PRAGMA defer_foreign_keys is refused in exec: it lasts until its transaction ends, and an exec is a "
    "transaction of its own, committed with other clients' writes (whose foreign keys it would defer too); "
    "set it inside db.tx"
)


class Later:
    """A result the engine gives later, on the loop, without the cost of a future: :meth:`then` has a
    function called with ``(value, None)`` or ``(None, error)`` once it is known (the server answers the
    request from there); ``await`` gives the value or raises the error. Get one from
    :meth:`SqlDatabase.write_later`.
    """

    __slots__ = ("_fn", "_fut", "_loop", "_outcome")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fn: Callable[[Any, BaseException | None], None] | None = None
        self._fut: asyncio.Future[Any] | None = None
        self._outcome: tuple[Any, BaseException | None] | None = None

    def then(self, fn: Callable[[Any, BaseException | None], None]) -> None:
        """Call ``fn(value, error)`` on the loop once the result is known (at once when it is already)."""
        if self._outcome is not None:
            fn(*self._outcome)
        else:
            self._fn = fn

    def done(self) -> bool:
        return self._outcome is not None

    def future(self) -> asyncio.Future[Any]:
        """The result as a future (made on first use). Its error is taken as it comes (asyncio logs none as
        never retrieved): it mirrors the outcome, which :meth:`then` gives too (trial EC: a stop that waited on the
        future of an interrupted write, and then closed the connection, logged the write's error)."""
        fut = self._fut
        if fut is None:
            fut = self._fut = self._loop.create_future()
            fut.add_done_callback(_taken)
            if self._outcome is not None:
                _resolve(fut, *self._outcome)
        return fut

    def __await__(self) -> Generator[Any, None, Any]:
        return self.future().__await__()

    def deliver(self, value: Any, exc: BaseException | None) -> None:
        """Give the result: ``value``, or the error ``exc``. Only the first call counts."""
        if self._outcome is not None:
            return
        self._outcome = (value, exc)
        fn = self._fn
        if fn is not None:
            self._fn = None
            fn(value, exc)
        if self._fut is not None:
            _resolve(self._fut, value, exc)


def _taken(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _resolve(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


_Outcome = tuple["asyncio.Future[Any] | Later", Any, BaseException | None]
# arms a connection's progress handler before a statement: (start, the read's future or None)
_Arm = Callable[..., None]


class _Results:
    """Futures (or :class:`Later`) resolved from threads, handed to the loop in batches (one wake-up per
    batch)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[_Outcome] = []

    def put(self, fut: asyncio.Future[Any] | Later, value: Any, exc: BaseException | None) -> None:
        with self.lock:
            self.pending.append((fut, value, exc))
            first = len(self.pending) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # loop closed
                pass

    def put_many(self, items: list[_Outcome]) -> None:
        """:meth:`put` of each of ``items``, under one lock and at most one wake-up of the loop."""
        with self.lock:
            first = not self.pending
            self.pending.extend(items)
        if first and items:
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # loop closed
                pass

    def _flush(self) -> None:
        with self.lock:
            items, self.pending = self.pending, []
        for fut, value, exc in items:
            if isinstance(fut, Later):
                fut.deliver(value, exc)
            elif fut.done():
                continue
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)


@dataclass(slots=True)
class _Write:
    sql: str
    params: SqlParams
    fut: asyncio.Future[Done] | Later
    own: bool = False  # an engine's own statement (see own_sql): it may write the store's tables
    resend: bool = False  # a socket client's: unrun at a stop, it is answered refused, for the SDK to send again


@dataclass(slots=True)
class _Read:
    sql: str
    params: SqlParams
    mode: str
    fut: asyncio.Future[Rows]
    unlimited: bool = False  # an engine's own read of what it keeps (see SqlDatabase.read)


@dataclass(slots=True)
class _Call:
    """A command for a transaction's connection."""

    op: str  # "exec" | "query" | "commit" | "rollback"
    sql: str
    params: SqlParams
    mode: str
    fut: asyncio.Future[Any]
    own: bool = False  # an engine's own statement (see own_sql)


@dataclass(eq=False)
class SqlTx:
    """An interactive transaction: the writer (or a reader, when ``read_only``) held for one client."""

    id: int
    db: SqlDatabase
    read_only: bool
    owner: object
    calls: queue.SimpleQueue[_Call | None] = field(default_factory=queue.SimpleQueue)
    started: float = field(default_factory=time.monotonic)
    done: bool = False
    committed: bool = False
    error: TinystoreError | None = None
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    busy: int = 0
    held: int = 0
    """Calls for it that its client sent and the server holds before handing them over (its connection's line
    of calls whose answers may be large, see ``server.listener``): while any is held, it is not idle."""
    migration: bool = False
    """A migration of an open database: foreign keys off while it runs (see ``SqlDatabase._migrate``)."""
    doomed: bool = False
    """Its rollback was asked for (by its client, or as it was aborted): nothing it still runs can be of use, so its
    statement under way is interrupted (see :class:`_Doomed`); trial IE, a closing store waited for one."""
    on_end: list[Callable[[], None]] = field(default_factory=list)
    """Called on the loop once it ended (committed, rolled back, timed out, aborted), in order; after a commit,
    maybe before the ``after_commit`` hooks (see ``committed``)."""

    def _call(
        self, op: str, sql: str = "", params: SqlParams | None = None, mode: str = "all", own: bool = False
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.db.loop.create_future()
        if self.done:
            fut.set_exception(self.error or ClosedError(f"database {self.db.name}: transaction {self.id} has ended"))
            return fut
        self.busy += 1
        fut.add_done_callback(self._idle)
        self.calls.put(_Call(op, sql, params or [], mode, fut, own))
        return fut

    def _idle(self, _: object) -> None:
        self.busy -= 1

    def exec(self, sql: str, params: ParamsIn, *, own: bool = False) -> asyncio.Future[Done]:
        """Run a statement inside the transaction; it sees the transaction's own writes. ``own``: an engine's
        statement (:func:`own_sql`)."""
        if self.read_only:
            fut: asyncio.Future[Done] = self.db.loop.create_future()
            fut.set_exception(InvalidError(f"database {self.db.name}: exec inside a read-only transaction"))
            return fut
        values = check_params(self.db.name, sql, params)
        return self._call("exec", own_sql(sql) if own else sql, values, own=own)

    def query(self, sql: str, params: ParamsIn, mode: str = "all") -> asyncio.Future[Rows]:
        return self._call("query", sql, check_params(self.db.name, sql, params), mode)

    def commit(self) -> asyncio.Future[None]:
        """Commit; then the ``after_commit`` hooks run on the loop, in order, before the future resolves."""
        return self._call("commit")

    def rollback(self) -> asyncio.Future[None]:
        """Roll back; idempotent (a transaction that already ended resolves at once)."""
        if self.done:
            fut: asyncio.Future[None] = self.db.loop.create_future()
            fut.set_result(None)
            return fut
        self.doomed = True
        return self._call("rollback")

    def abort(self, reason: TinystoreError) -> None:
        """Roll back from any state without waiting (a dropped connection, a stop); a statement under way is
        interrupted."""
        if not self.done:
            self.error = reason
            self.doomed = True
            self.calls.put(None)


class _Doomed:
    """What a transaction's statement is armed with (see ``SqlDatabase._progress_guard``): done once the
    transaction is doomed (its rollback asked for), or, for a read, once its caller went away (``fut``)."""

    __slots__ = ("fut", "tx")

    def __init__(self, tx: SqlTx, fut: asyncio.Future[Any] | None) -> None:
        self.tx = tx
        self.fut = fut

    def done(self) -> bool:
        return self.tx.doomed or (self.fut is not None and self.fut.done())


ORPHANS_SHOWN = 5
"""The rows a migration left without their parent that its error names (``PRAGMA foreign_key_check``)."""


FK_TABLES = "select name from sqlite_schema where type = 'table'"
"""Every table of the database (to tell a migration's new tables and those it dropped or renamed)."""
FK_CHILDREN = (
    "select m.name from sqlite_schema m where m.type = 'table' "
    "and exists (select 1 from pragma_foreign_key_list(m.name))"
)
"""The tables that have a foreign key."""
FK_COUNT = "select count(*) from pragma_foreign_key_check(?)"
"""The orphans (rows whose foreign key finds no parent) of one table."""
FK_ROWS = 'select "table", rowid, parent, fkid from pragma_foreign_key_check(?) limit ?'
"""Some of them (``limit``): to tell a migration's own from those it found, in its error (only)."""
FK_ROWS_KEPT = 1000


@dataclass
class _FkState:
    """The orphans of a database, table by table (see :func:`_fk_state`)."""

    tables: frozenset[str]
    """Every table."""
    counts: dict[str, int]
    """Orphans by child table, for each table with a foreign key that SQLite can check."""
    unchecked: frozenset[str]
    """The tables with a foreign key SQLite cannot check (a "foreign key mismatch", see :func:`_fk_mismatch`)."""
    rows: list[tuple[Any, ...]]
    """Up to :data:`FK_ROWS_KEPT` orphans: (table, rowid, parent table, foreign key id)."""


T = TypeVar("T")
_FkQuery = tuple[str, list[Any]]
_FkSteps = Generator[_FkQuery, list[Any], _FkState]


def _fk_state(with_rows: bool = True) -> _FkSteps:
    """The queries that make a :class:`_FkState` (the caller runs each one it is given and sends its rows back, or
    throws its error in), so that the writer's connection and a transaction share them.

    Table by table, not one ``pragma_foreign_key_check`` for all: a table whose foreign key SQLite cannot check
    (a mismatch, which SQLite lets a schema have) stops the check of every other table (trial CH: a migration
    then left orphans in the tables declared well)."""
    tables = frozenset(r[0] for r in (yield FK_TABLES, []))
    counts: dict[str, int] = {}
    unchecked: set[str] = set()
    rows: list[tuple[Any, ...]] = []
    for (table,) in (yield FK_CHILDREN, []):
        try:
            n = int((yield FK_COUNT, [table])[0][0])
        except Exception as exc:
            if not _fk_mismatch(exc):
                raise
            unchecked.add(table)
            continue
        counts[table] = n
        if n and with_rows and len(rows) < FK_ROWS_KEPT:
            rows += [tuple(r) for r in (yield FK_ROWS, [table, FK_ROWS_KEPT - len(rows)])]
    return _FkState(tables, counts, frozenset(unchecked), rows)


def _fk_mismatch(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "foreign key mismatch" (a foreign key whose parent columns are no key): the
    schema's, and SQLite lets such a key be made. That table's orphans cannot be counted then; a migration is not
    refused for it (trial CE: the very migration that made the parent column unique was)."""
    return "foreign key mismatch" in str(getattr(exc, "message", exc))


def _migration_statements(text: str) -> list[str]:
    """The statements a migration runs: those of ``text`` but the empty ones (comments) and its own
    ``PRAGMA foreign_keys`` (see ``SqlDatabase._migrate``)."""
    return [s for s in split_sql(text) if not holds_no_statement(s) and not sets_foreign_keys(s)]


def _orphans_grown(before: _FkState, after: _FkState) -> list[str]:
    """The tables where a migration left more orphans (``after``, at its end) than it found (``before``, at its
    start), or ``[]``.

    Counted table by table, not matched row by row: a database brought from an application that ran with foreign
    keys off may hold orphans, and SQLite's own way of rebuilding a table moves them to other rowids, while a
    WITHOUT ROWID table's orphans have no rowid to tell them apart (trials CE and CF). Not in all (trial CH: a
    migration that deleted an old orphan could leave a new one elsewhere). A table the migration made may hold as
    many as the tables it dropped, renamed away or emptied of orphans held (trial CK: a table renamed to keep its
    rows, and a new one made under its name). A table SQLite could not check at the start is not judged."""
    grown = [
        t
        for t, n in after.counts.items()
        if t in before.tables and t not in before.unchecked and n > before.counts.get(t, 0)
    ]
    made = {t: n for t, n in after.counts.items() if t not in before.tables and n}
    moved = sum(n for t, n in before.counts.items() if t not in after.tables) + sum(
        max(0, n - after.counts[t]) for t, n in before.counts.items() if t in after.counts
    )
    return grown + (sorted(made) if sum(made.values()) > moved else [])


def _checks_lost(before: _FkState, after: _FkState) -> list[str]:
    """The tables whose foreign keys SQLite could check at a migration's start and not at its end (a "foreign key
    mismatch": the migration dropped the unique index or key their parent columns had): every write to them
    would fail, and their orphans could not be counted (trial CK)."""
    return sorted(t for t in after.unchecked if t in before.counts)


def _orphans_made(before: _FkState, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The orphans to name in the error of a migration whose orphans grew: up to :data:`ORPHANS_SHOWN` + 1 of
    ``rows`` (those of the tables where they grew, at its end), those not there ``before`` first."""
    old = set(before.rows)
    out = [r for r in rows if r not in old] or rows
    return out[: ORPHANS_SHOWN + 1]


def _orphans_check(before: _FkState, after: _FkState) -> Generator[_FkQuery, list[Any], None]:
    """Raise ``InvalidError`` (its text without the database's name: see :func:`_orphans_left`) when a migration
    left more orphans than it found, naming some (their rows queried as :func:`_fk_state`'s are)."""
    lost = _checks_lost(before, after)
    if lost:
        raise InvalidError(
            f'it leaves table {lost[0]} with a foreign key SQLite cannot check ("foreign key mismatch": its parent '
            "columns are no longer a primary key or unique), so every write to the table would fail; keep the "
            "parent's key or unique index, or change the foreign key in the migration; nothing of it was applied"
        )
    grown = _orphans_grown(before, after)
    if not grown:
        return
    rows: list[tuple[Any, ...]] = []
    for table in grown:
        rows += [tuple(r) for r in (yield FK_ROWS, [table, len(before.rows) + ORPHANS_SHOWN + 1])]
    raise InvalidError(_orphans_left(_orphans_made(before, rows)))


def _run_fk_sync(conn: sqlite3.Connection, steps: Generator[_FkQuery, list[Any], T]) -> T:
    """Run ``steps`` (:func:`_fk_state`, :func:`_orphans_check`) on ``conn``."""
    try:
        query = next(steps)
        while True:
            try:
                rows = conn.execute(*query).fetchall()
            except sqlite3.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
    except StopIteration as done:
        return cast(T, done.value)


async def _run_fk_in(tx: SqlTx, steps: Generator[_FkQuery, list[Any], T]) -> T:
    """Run ``steps`` (:func:`_fk_state`, :func:`_orphans_check`) through transaction ``tx``."""
    try:
        query = next(steps)
        while True:
            try:
                rows = (await tx.query(*query)).rows
            except TinystoreError as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
    except StopIteration as done:
        return cast(T, done.value)


def _orphans_left(rows: list[Any]) -> str:
    """The message of a migration whose foreign keys no longer hold: ``rows`` of ``PRAGMA foreign_key_check``
    (table, rowid, parent table, foreign key id). ``migration_error`` puts the database's name before it."""
    shown = ", ".join(
        (f"{table} row {rowid}" if rowid is not None else f"{table} (a WITHOUT ROWID table)") + f" -> {parent}"
        for table, rowid, parent, _ in rows[:ORPHANS_SHOWN]
    )
    more = " and more" if len(rows) > ORPHANS_SHOWN else ""
    return (
        f"it leaves rows whose foreign key finds no parent: {shown}{more}. Migrations run with "
        "foreign keys off (as SQLite's procedure for rebuilding a table asks) and are checked before they "
        "commit: delete or update the child rows in the migration itself (an ON DELETE or ON UPDATE action does "
        "not run in a migration); nothing of it was applied"
    )


def _empty_file(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


class SqlDatabase:
    """One SQLite file with its writer thread and reader threads. Create with :meth:`SqlEngine.open`."""

    def __init__(self, engine: SqlEngine, name: str, path: Path) -> None:
        self.engine = engine
        self.name = name
        self.path = path
        self.loop = engine.loop
        self.limits = engine.limits
        self.results = _Results(self.loop)
        self._writes: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # what the loop queued for the writer during this loop turn: handed over at the turn's end, in one
        # piece, so the writer thread wakes once for a batch (not at its first write, then contending for
        # the GIL while the loop decodes the rest)
        self._queued: list[Any] = []
        self._reads: FairReads[_Read] = FairReads()
        self._threads: list[threading.Thread] = []
        self._closed = False
        # the store's stop has run past its grace: statements still running are interrupted (see halt)
        self.halted = False
        # the store's stop has run past its grace while clients' calls ran: their statements are interrupted (see
        # cut_calls), the engines' own go on
        self.cut = False
        # each thread's connection, with its statement's ``own`` and whether it reads: what cut_calls and halt
        # interrupt at once (see _progress_guard)
        self._guards: dict[int, tuple[sqlite3.Connection, list[bool], bool]] = {}
        self._start_ended = threading.Event()  # set as start returns or raises (see join)
        self.active_tx: SqlTx | None = None
        self._storage_log = LimitedLog(log)  # (see _error)
        self.stats = {
            "writes": 0,
            "commits": 0,
            "reads": 0,
            "reads_moved": 0,
            "transactions": 0,
            "connections_recycled": 0,
        }
        # calls taken (on the loop), and what the engine's sweep saw of them: a database no call used for
        # ``Limits.database_idle`` is closed (see SqlEngine._sweep); ``pinned``: an engine holds it (a queue's jobs)
        self.uses = 0
        self.uses_seen = -1
        self.quiet_since = 0.0
        self.pinned = False
        self._writer_waiting = False  # the writer thread waits for work (it has none)
        self._spare: list[sqlite3.Connection] = []
        self._spare_lock = threading.Lock()
        self._inline: sqlite3.Connection | None = None
        self._off_loop: dict[str, None] = {}  # statements that call an OFF_LOOP function (oldest first, 256 kept)
        self.applied_before_failure = -1  # at start: the migrations applied before one failed (-1: none failed)
        self._inline_deadline = 0.0
        self._turn_reads = 0  # inline reads in this turn of the loop
        self._snapshot = False  # whether the inline connection holds a read transaction until the turn ends
        self.inline_budget = self.limits.inline_read
        self._schema_seen = -1  # the schema version _deferred was read at (writer thread)
        self._deferred = False  # whether the schema has INITIALLY DEFERRED constraints (see _deferred_constraints)
        self._schema_rowid = False  # whether a view or trigger of the schema calls last_insert_rowid() (same)
        # the schema's ordinary rowid tables (see _adds_rowid_rows), read again after a schema change (writer)
        self._rowid_tables: frozenset[str] | None = None
        self._rowid_stale = False  # a statement of the batch or transaction under way changed the schema
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the file at the open: _check_in_place
        self._wal_id: tuple[int, int] | None = None  # (device, inode) of its WAL at the first commit: _wal_kept
        self._place_due = 0.0  # (monotonic) when the writer looks at its files again: _check_in_place
        self._wal_due = False  # whether the commit under way looks at the WAL
        self._moved = False  # the database file was found removed or replaced (for good, until a restart)
        self._wal_moved = False  # the WAL was (each commit is then copied into the database file)
        self._wal = path.with_name(path.name + "-wal")
        self._wal_look_at = 0.0  # (see _bound_wal)
        self._wal_told = 0.0
        self._shm = path.with_name(path.name + "-shm")
        self._told_gone = False
        # why the database takes no more writes until the store restarts: a COMMIT the file system failed (see
        # _commit_failed); None while it takes them
        self.broken: str | None = None

    # -- connections -----------------------------------------------------------------------------

    def connect(self, *, readonly: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=60,
            cached_statements=256,
            factory=GuardedConnection,
        )
        conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
        if readonly:
            conn.execute("pragma query_only = 1")
        else:
            conn.execute("pragma journal_mode = wal")
            # "full": SQLite syncs the WAL in each COMMIT, before the commit's outcomes go back (SQL-02)
            sync = "full" if self.engine.durability == "full" else "normal"
            conn.execute(f"pragma synchronous = {sync}")
            conn.execute("pragma temp_store = memory")
            conn.execute("create temp table if not exists _tinystore_rowid (x)")
            c: Any = conn
            c.resets_rowid = c.writer = True
        conn.execute("pragma foreign_keys = on")
        # no value (string, blob, row) can be over what a result may be: SQLite stops making one there, rather than
        # at its own 1 GB (randomblob(1e9), zeroblob, replace), in a read and in a write alike (a read sent
        # through exec runs on the writer). printf and format give NULL past it, as SQLite's own limit
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(self.limits.sql_result_bytes, 1))
        conn.set_authorizer(statement_authorizer(conn))  # after the engine's own pragmas (it refuses query_only = ...)
        return conn

    def _own_files(self) -> None:
        """The database's file made when missing, readable by this user only (0600: SQLite gives its ``-wal``
        and ``-shm`` files the same mode); none of its three files may be a symbolic link, which SQLite would
        follow (out of the store's directory, turning whatever file is there into a database)."""
        wal, shm = self._wal, self._shm
        for path in (self.path, wal, shm):
            if path.is_symlink():
                raise PermissionDeniedError(
                    f"database {self.name}: {path} is a symbolic link; a database's files are the store's own, in "
                    "its directory (move the file there in place of the link)"
                )
            try:
                mode = path.stat().st_mode
            except OSError:
                continue  # none (made below), or SQLite says what is wrong
            if not stat.S_ISREG(mode):
                # (SQLite's "unable to open database file" was explained as out of descriptors: trial CW)
                kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, a socket or a device)"
                raise UnavailableError(
                    f"database {self.name}: {path} is {kind}; a database's files are regular files of the store's "
                    "directory (move it away for the database to start empty, or put the database file there)"
                )
        try:
            orphan_wal = not self.path.exists() and wal.stat().st_size > 0
        except OSError:
            orphan_wal = False
        if orphan_wal:
            # the database file was removed (or moved) while a server had it open, and that server then died: a
            # new, empty file here would have the WAL's commits applied to it, pages of another database
            raise CorruptError(
                f"database {self.name}: its WAL file {wal} holds commits but the database file {self.path} is gone "
                "(removed or moved while the store ran): put the database file back, or move the WAL and "
                f"{shm.name} away to start the database empty"
            )
        for path, create in ((self.path, os.O_CREAT), (wal, 0), (shm, 0)):
            try:
                fd = os.open(path, os.O_RDWR | create | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError:
                continue  # none, or SQLite says what is wrong in its own words (a full disk, a read-only system)
            try:
                os.fchmod(fd, 0o600)  # (a database made before files were 0600: its user's alone from now on)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _in_place(self) -> bool:
        """Whether the database file at its path is still the one opened (its device and inode)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return self._file_id is None or (st.st_dev, st.st_ino) == self._file_id

    def _check_in_place(self) -> None:
        """Before a commit (writer thread): raise ``UnavailableError`` when the database file is no longer the one
        opened (its device and inode), removed or renamed while the store ran. SQLite would go on writing into
        it: each commit acknowledged, and lost at the next start. The caller rolls back, so nothing of it is kept.

        It looks at most every :data:`PLACE_CHECK_EVERY` seconds (10 ms), the WAL too (:meth:`_wal_kept`): a
        ``stat`` lets go of the GIL, and taking it back from a busy loop cost a commit tens of microseconds (a
        tenth of the inserts with 32 callers, measured). Commits in the 10 ms after a removal are the window."""
        if not self._moved:
            now = time.monotonic()
            if now < self._place_due:
                return
            self._place_due = now + PLACE_CHECK_EVERY
            self._wal_due = True
            self._moved = not self._in_place()
        if self._moved:
            what = f"its file {self.path} was removed or replaced while the store ran"
            self._tell_once(what)
            raise UnavailableError(
                f"database {self.name}: {what}, so nothing more can be committed where the store will find it at "
                "its next start (nothing of this was committed); restart the store (tinystore stop DIR, or close "
                "an embedded store) to go on with the file in its place"
            )

    def _wal_kept(self, conn: sqlite3.Connection) -> TinystoreError | None:
        """After a commit (writer thread): ``None`` when it is kept, else the error to answer. The WAL must be the
        file SQLite writes: removed or replaced while the store ran (another program opening the database makes
        an empty one in its place), SQLite goes on writing into the removed file, lost at a crash. Then each
        commit is copied into the database file at once (a passive checkpoint, synced as the database's
        durability says), which keeps it; only when that cannot copy all of it (a read holds an older snapshot)
        is it ``OutcomeUnknownError``: kept if the store stops gracefully, lost if it dies. Looked at when
        :meth:`_check_in_place` looked (at most every 10 ms); the checkpoint copies the commits made since then
        too, so only a crash in those 10 ms loses any."""
        if not self._wal_moved:
            if not self._wal_due:
                return None
            self._wal_due = False
            try:
                st = os.stat(self._wal)
                ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
            except OSError:
                ident = None
            if ident is not None and self._wal_id is None:
                self._wal_id = ident  # (its first look: the WAL SQLite made at the open)
            if ident is not None and ident == self._wal_id:
                return None
            self._wal_moved = True
        self._tell_once(
            f"its WAL file {self._wal} was removed or replaced while the store ran: each commit is copied into the "
            "database file at once, to be kept"
        )
        try:
            busy, frames, copied = own_execute(conn, "pragma wal_checkpoint(passive)").fetchone()
        except sqlite3.Error:
            busy, frames, copied = 1, 1, 0
        if busy or copied < frames:
            return OutcomeUnknownError(
                f"database {self.name}: its WAL file {self._wal} was removed or replaced while the store ran, and "
                "this commit could not be copied into the database file (a read held an older snapshot): it is "
                "kept if the store stops gracefully, lost if it dies; restart the store (tinystore stop DIR)"
            )
        return None

    def _tell_once(self, what: str) -> None:
        if not self._told_gone:
            self._told_gone = True
            log.error("database %s: %s; restart the store (tinystore stop DIR)", self.name, what)

    def _commit_failed(self, exc: BaseException) -> TinystoreError:
        """The error a COMMIT that raised ``exc`` answers its writes with (writer thread).

        A COMMIT that the file system failed (``SQLITE_IOERR_*``; most often the fsync of the WAL) may have left
        the whole transaction in the WAL file: its frames are written, only their sync failed. SQLite goes on
        without it here, but the next start of the store finds those frames complete and keeps them. So its
        writes get ``OutcomeUnknownError``, and the database takes no more writes until the store restarts
        (:attr:`broken`), which settles it one way for good: a later commit would write over those frames, and
        a failed fsync cannot be tried again and trusted (the kernel may have dropped the pages it could not
        write: PostgreSQL stops at a failed fsync for that reason, "fsyncgate", 2018). Reads go on. Any other
        error (a deferred constraint, a file removed or replaced) is :meth:`_error`'s, and nothing of it was
        kept."""
        code = getattr(exc, "sqlite_errorname", "") or ""
        if not code.startswith("SQLITE_IOERR") or not self._in_place():
            return self._error(exc)
        if self.broken is None:
            self.broken = (
                f"database {self.name}: the file system failed a commit ({exc}, {code}), which may be kept or not "
                "at the store's next start: the database takes no more writes until then (restart the store: "
                "tinystore stop DIR, or close an embedded store); reads go on"
            )
            log.error("%s", self.broken)
        return OutcomeUnknownError(
            f"database {self.name}: the file system failed while this write was being committed ({exc}, {code}): "
            "it may have been kept or not, which the store's next start settles; the database takes no more "
            "writes until then (restart the store: tinystore stop DIR, or close an embedded store)"
        )

    def _refused(self) -> UnavailableError:
        """What a write gets once the database is :attr:`broken` (nothing of it ran)."""
        return UnavailableError(self.broken or f"database {self.name} takes no writes")

    def _writable(self) -> bool:
        """Whether this process may write the database's files and its folder (as SQLite needs, to write)."""
        paths = (self.path, self._wal, self._shm)
        if not os.access(self.path.parent, os.W_OK | os.X_OK):
            return False
        return all(os.access(p, os.W_OK) for p in paths if p.exists())

    def _error(self, exc: BaseException) -> TinystoreError:
        """:func:`sql_error` for this database; what the file system refused (a full disk, an I/O error, a file
        that cannot be opened) also logged, once a minute at most (trial IA: every write failed for a full disk,
        and the server's log said nothing)."""
        err = self._error_of(exc)
        if isinstance(err, UnavailableError) and error_name(exc).startswith(_STORAGE_CODES):
            self._storage_log.warning("%s", err.message)
        return err

    def _error_of(self, exc: BaseException) -> TinystoreError:
        if (self.halted or self.cut) and interrupted(exc):
            return ClosedError(
                f"database {self.name}: the store stopped while the statement ran (its grace ended): interrupted, "
                "and rolled back"
            )
        if isinstance(exc, MemoryError):
            # SQLITE_NOMEM, past the hard heap limit (Limits.sql_memory_bytes), or the process's own memory ran out
            # (a ulimit, a container's limit: trial EG), which neither SQLite nor Python tells apart
            limit = self.limits.sql_memory_bytes
            return LimitError(
                f"database {self.name}: out of memory running the statement (SQLite may use Limits.sql_memory_bytes, "
                f"{limit} bytes for all of the store's databases, and the server process what its own limits allow): "
                "the statement holds too much at once",
                limit=limit,
            )
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_TOOBIG":
            limit = self.limits.sql_result_bytes
            return LimitError(
                f"database {self.name}: a value (a string, a blob or a row) would be over {limit} bytes (the "
                f"limit sql_result_bytes: no value can be larger than a result may be); SQLite: {exc}",
                limit=limit,
            )
        code = getattr(exc, "sqlite_errorname", "") or ""
        if code.startswith("SQLITE_IOERR") and not self._in_place():
            return UnavailableError(
                f"database {self.name}: {exc} ({code}): its file {self.path} was removed or replaced while the store "
                "ran; restart the store (tinystore stop DIR, or close an embedded store) to go on with the file in "
                "its place"
            )
        if code == "SQLITE_READONLY" and not self._writable():
            # SQLite opened the file read-only, for want of permission, and says so with the code of a write on a
            # reader's connection: the file system refused, the statement is not at fault
            return storage_error(self.name, "SQLITE_READONLY", str(exc))
        err = sql_error(self.name, exc, self.limits.statement_timeout)
        if self.name.startswith(RESERVED_DB_PREFIX) and (
            WRITER_ONLY in err.message or str(exc) == "cannot VACUUM from within a transaction"
        ):
            # a VACUUM or a checkpoint read on the store's own database: refused, not "use db.exec" (refused too)
            return reserved_db_error(self.name, "a statement that writes is refused")
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL":
            table = autoincrement_spent(self.path)
            if table is not None:
                return ConflictError(
                    f"database {self.name}: {exc} (SQLITE_FULL): not the disk: table {table} is AUTOINCREMENT and "
                    f"its rowid has reached the largest, {INT_MAX}, so it takes no new row without an explicit id "
                    "(https://sqlite.org/autoinc.html)"
                )
        return err

    def start(self, migrations: Sequence[tuple[str, str]]) -> list[str]:
        """Open the file, apply migrations (in the calling thread), start the threads. Returns applied names.

        What SQLite or the file system refuses is raised as :func:`sql_error` maps it (a full disk, a file that
        cannot be opened: ``UnavailableError``); a file of the database that is a symbolic link:
        ``PermissionDeniedError``."""
        try:
            return self._start(migrations)
        finally:
            self._start_ended.set()

    def _start(self, migrations: Sequence[tuple[str, str]]) -> list[str]:
        self._own_files()
        try:
            writer = self.connect(readonly=False)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        w: Any = writer
        # (the migrations run with no time limit; only a stop past its grace interrupts them: see halt)
        writer.set_progress_handler(lambda: 1 if (self.halted or self.cut) and not w.control else 0, 10000)
        try:
            st = os.stat(self.path)
            self._file_id = (st.st_dev, st.st_ino)
        except OSError:
            self._file_id = None
        readers: list[sqlite3.Connection] = []
        try:
            applied = self._migrate(writer, migrations)
            # the readers' connections too, here: one that cannot open (out of file descriptors) fails the open,
            # rather than leave a reader thread dead and its share of the reads unanswered
            for _ in range(max(1, self.limits.readers)):
                readers.append(self.connect(readonly=True))
            if self.inline_budget > 0:
                self._inline = self.connect(readonly=True)
                self._inline.set_progress_handler(self._inline_check, 500)
                # what the progress handler cannot cut (one opcode making a large value; preparing a long text)
                # is kept small on the loop: past these, SQLite says "too big" and a reader thread runs the read
                self._inline.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, INLINE_VALUE_BYTES)
                self._inline.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, INLINE_SQL_BYTES)
                self._inline.set_authorizer(
                    statement_authorizer(cast(GuardedConnection, self._inline), inline=True)
                )  # (OFF_LOOP)
        except BaseException as exc:
            writer.close()
            for conn in readers:
                conn.close()
            if self._inline is not None:
                self._inline.close()
                self._inline = None
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from None
            raise
        started = 0  # threads started: the writer's, then the readers'
        try:
            t = threading.Thread(
                target=self._writer_main, args=(writer,), name=f"tinystore-sql-{self.name}-w", daemon=True
            )
            t.start()
            self._threads.append(t)
            started = 1
            for i, conn in enumerate(readers):
                r = threading.Thread(
                    target=self._reader_main, args=(conn,), name=f"tinystore-sql-{self.name}-r{i}", daemon=True
                )
                r.start()
                self._threads.append(r)
                started += 1
        except RuntimeError as exc:  # "can't start new thread": short of memory or of threads (trial EJ)
            # the threads started end (each closes its connection), the other connections are closed here
            if started:
                self._writes.put(None)
                self._reads.stop(started - 1)
            for conn in [writer, *readers][started:]:
                conn.close()
            if self._inline is not None:
                self._inline.close()
                self._inline = None
            raise UnavailableError(
                f"database {self.name}: the server could not start its threads ({exc}): it is short of memory or of "
                "threads; try again later"
            ) from None
        return applied

    def _migrate(self, conn: sqlite3.Connection, migrations: Sequence[tuple[str, str]]) -> list[str]:
        own_execute(
            conn,
            f"create table if not exists {MIGRATIONS_TABLE} (name text primary key, text text not null, "
            "applied_at integer not null)",
        )
        known = {r[0]: r[1] for r in conn.execute(f"select name, text from {MIGRATIONS_TABLE}")}
        # (a rename first: told as one, not as a new migration out of order, trial IH)
        check_migration_renames(self.name, known, migrations)
        check_migration_order(self.name, known, migrations)
        applied: list[str] = []
        for name, text in sorted(migrations, key=lambda m: m[0]):
            if name in known:
                if not same_migration(known[name], text):
                    raise ConflictError(
                        f"database {self.name}: migration {name} was applied with another text; "
                        "an applied migration must not change (add a new one instead)"
                    )
                continue
            # Foreign keys off while it runs (SQLite ignores the pragma inside a transaction: set before it), and
            # checked before it commits, as SQLite's procedure for what ALTER TABLE cannot do asks
            # (https://sqlite.org/lang_altertable.html#otheralter): a table rebuilt there (made anew, filled,
            # the old one dropped, the new one renamed) would otherwise take the rows of every ON DELETE CASCADE
            # child with its DROP (trial CC). A migration that leaves a child row without its parent (one that
            # counted on a cascade) fails whole, naming the rows. Its own PRAGMA foreign_keys statements (SQLite's
            # procedure has them) are passed over.
            statements = _migration_statements(text)
            try:
                ctl(conn, "pragma foreign_keys = off")
                ctl(conn, "begin immediate")
                before = _run_fk_sync(conn, _fk_state())
                stmt = ""
                for stmt in statements:
                    schema = own_objects(conn) if names_own(stmt) and changes_schema(stmt) else None
                    conn.execute(stmt)
                    if schema is not None:
                        check_own_objects(self.name, schema, conn)
                _run_fk_sync(conn, _orphans_check(before, _run_fk_sync(conn, _fk_state(with_rows=False))))
                own_execute(
                    conn,
                    f"insert into {MIGRATIONS_TABLE} (name, text, applied_at) values (?, ?, ?)",
                    (name, text, int(time.time() * 1000)),
                )
                ctl(conn, "commit")
            except (sqlite3.Error, InvalidError) as exc:
                if conn.in_transaction:
                    ctl(conn, "rollback")
                self.applied_before_failure = len(applied)
                why = exc if isinstance(exc, InvalidError) else self._error(exc)
                raise migration_error(self.name, name, _placeholder_named(why, stmt)) from None
            finally:
                ctl(conn, "pragma foreign_keys = on")
            applied.append(name)
        return applied

    # -- calls from the loop ---------------------------------------------------------------------

    def write(self, sql: str, params: ParamsIn, *, own: bool = False, resend: bool = False) -> asyncio.Future[Done]:
        """One statement that may write, committed before the future resolves (group commit). Never raises:
        a parameter SQLite cannot hold (``InvalidError``) or a closed database (``ClosedError``) is the
        future's exception, so a caller that gathered several calls' writes fails only the one. ``own``: an
        engine's statement, which may write the store's own tables (:func:`own_sql`)."""
        self.uses += 1
        if own:
            sql = own_sql(sql)
        fut: asyncio.Future[Done] = self.loop.create_future()
        if self._closed:
            fut.set_exception(ClosedError(f"database {self.name} is closed"))
            return fut
        if self.broken is not None:
            fut.set_exception(self._refused())
            return fut
        try:
            values = self._write_params(sql, params)
        except TinystoreError as exc:
            fut.set_exception(exc)
            return fut
        self._queue(_Write(sql, values, fut, own, resend))
        return fut

    def write_later(self, sql: str, params: ParamsIn, resend: bool = False) -> Later:
        """:meth:`write`, its result given through a :class:`Later` rather than a future (what the server
        uses: the answer goes out from the writer's batch of results, with no future in between).

        Raises ``InvalidError`` for a value SQLite cannot hold, or a ``PRAGMA defer_foreign_keys``; a closed
        database gives ``ClosedError``."""
        self.uses += 1
        later = Later(self.loop)
        if self._closed:
            later.deliver(None, ClosedError(f"database {self.name} is closed"))
        elif self.broken is not None:
            later.deliver(None, self._refused())
        else:
            self._queue(_Write(sql, self._write_params(sql, params), later, resend=resend))
        return later

    def _write_params(self, sql: str, params: ParamsIn) -> SqlParams:
        """:func:`check_params` of a single write, which may not be a ``PRAGMA defer_foreign_keys``."""
        values = check_params(self.name, sql, params)
        if defers_foreign_keys(sql):
            raise InvalidError(f"database {self.name}: {_DEFER_WHY}")
        return values

    def _queue(self, item: Any) -> None:
        if not self._queued:
            self.loop.call_soon(self._hand_over)
        self._queued.append(item)

    def _hand_over(self) -> None:
        items, self._queued = self._queued, []
        if items:
            self._writes.put(items)

    def _inline_check(self) -> int:
        return 1 if time.monotonic() > self._inline_deadline else 0

    def read(
        self, sql: str, params: ParamsIn, mode: str = "all", *, unlimited: bool = False, owner: object = None
    ) -> asyncio.Future[Rows]:
        """A read. ``mode``: "all", "one" (at most one row) or "scalar". It runs on the loop when it fits the
        inline budget (the future is then already resolved), else on a reader thread. ``unlimited``: an engine's
        read of what it keeps (a queue's jobs, loaded at its first use), on a reader thread and not held to
        ``sql_result_bytes``, which bounds what a client may ask for (a queue of millions of jobs is over it).
        ``owner``: whose read it is (a client's session), for the readers' turns (:class:`FairReads`)."""
        fut: asyncio.Future[Rows] = self.loop.create_future()
        try:
            values = check_params(self.name, sql, params)
            if unlimited:
                if self._closed:
                    raise ClosedError(f"database {self.name} is closed")
                self._reads.put(_Read(sql, values, mode, fut, True))
                return fut
            rows = self.read_now(sql, values, mode)
        except TinystoreError as exc:
            fut.set_exception(exc)
            return fut
        if rows is not None:
            fut.set_result(rows)
        else:
            self._reads.put(_Read(sql, values, mode, fut), owner)
        return fut

    def turn_full(self) -> bool:
        """Whether more than :data:`INLINE_TURN_READS` reads were answered inline in this turn of the loop: then the
        caller hands the next ones over in the loop's next turn, so that its await lets the loop turn (an embedded
        caller that read in a loop with no other await was answered inline for ever, and a big add of jobs never
        went on: trial HN)."""
        return self._turn_reads > INLINE_TURN_READS

    def read_now(self, sql: str, values: SqlParams, mode: str = "all") -> Rows | None:
        """A read run here, on the loop, under the inline budget: its rows, or ``None`` when it did not fit
        the budget (or reads never run inline): then :meth:`read_later` runs it on a reader thread.

        ``values`` must have passed :func:`check_params`. Raises ``ClosedError`` (the database is closed) and
        SQLite's errors as :func:`sql_error` maps them."""
        self.uses += 1
        if self._closed:
            raise ClosedError(f"database {self.name} is closed")
        conn = self._inline
        if conn is None or len(sql) > INLINE_SQL_BYTES or sql in self._off_loop:
            return None
        n = self._turn_reads
        self._turn_reads = n + 1
        if n == 0:
            self.loop.call_soon(self._end_turn)
        elif n == 1:
            self._begin_snapshot(conn)
        self._inline_deadline = time.monotonic() + self.inline_budget
        restricted = restrict(conn, sql)
        try:
            # what _query does, inline (the hot path of a point read)
            cur = conn.execute(sql, values)
            desc = cur.description
            if desc is None and holds_no_statement(sql):
                raise no_statement(self.name, sql)
            columns = list(map(_first, desc)) if desc else []
            if mode == "all":
                found = _fetch_checked(cur, self.name, self.limits.sql_result_bytes)
            else:
                try:
                    one = cur.fetchone()
                finally:
                    cur.close()
                if one is None:
                    found = []
                else:
                    found = [one]
                    # _check_size of one row, inline (about 0.1 µs): one row may be over the limit too
                    if len(_encode(one)) > self.limits.sql_result_bytes:
                        _check_size(self.name, found, self.limits.sql_result_bytes)
        except sqlite3.DatabaseError as exc:
            # past the inline budget (interrupted), a value or a text too big for the loop, or a function that
            # may not run on it (OFF_LOOP): a reader runs it
            if is_vacuum(sql) and conn.in_transaction:
                pass  # (SQLite said "cannot VACUUM from within a transaction", of this turn's snapshot: a reader
                # refuses it for what it is, a statement only the writer runs)
            elif getattr(denial, "why", None) == MOVE_OFF_LOOP:
                denial.why = None
                if len(sql) <= CACHED_SQL:  # (known: the next time it goes to a reader at once)
                    self._off_loop[sql] = None
                    if len(self._off_loop) > 256:
                        self._off_loop.pop(next(iter(self._off_loop)))
            elif not interrupted(exc) and getattr(exc, "sqlite_errorname", "") != "SQLITE_TOOBIG" and not _too_big(exc):
                # (an interrupt while SQLite read a column past the inline length is SQLITE_INTERRUPT that says
                # "string or blob too big": it was raised to the client, trial BQ)
                raise self._error(exc) from None
            self.stats["reads_moved"] += 1
            return None
        except BaseException as exc:
            raise self._error(exc) from None
        finally:
            if restricted:
                unrestrict(conn)
        self.stats["reads"] += 1
        return Rows(columns, found)

    def _begin_snapshot(self, conn: sqlite3.Connection) -> None:
        """A second inline read in one turn of the loop: the reads of the rest of the turn share one read
        transaction (it starts at the next read), ended by :meth:`_end_turn` at the start of the next turn.

        This spares each point read SQLite's taking and letting go of its WAL read lock (system calls that
        cost as much as the read itself), and it keeps every promise: a read sees whatever was committed
        before its request was read, and any write whose completion its caller saw. (A completion seen by
        a task runs in a later turn than the one that resolved it, after the ``_end_turn`` scheduled at
        this turn's first read; a request from a socket is read in a later turn still.)"""
        self._inline_deadline = (
            math.inf
        )  # the engine's own statements are never stopped (see GuardedConnection.control)
        try:
            ctl(conn, "begin")
        except sqlite3.Error:
            return
        self._snapshot = True

    def _end_turn(self) -> None:
        self._turn_reads = 0
        if self._snapshot:
            self._snapshot = False
            conn = self._inline
            if conn is not None and conn.in_transaction:
                # the last read's budget is over: the progress handler would stop the commit (a snapshot's
                # commit, over 500 instructions when the loop was slow)
                self._inline_deadline = math.inf
                try:
                    ctl(conn, "commit")
                except sqlite3.Error as exc:
                    # (a file that went bad under the read: the read's caller was told already, as CorruptError or
                    # UnavailableError; SQLite may have ended the transaction itself)
                    try:
                        if conn.in_transaction:
                            ctl(conn, "rollback")
                    except sqlite3.Error as again:
                        log.warning(
                            "database %s: the inline read transaction could not be ended (%s, then %s)",
                            self.name,
                            exc,
                            again,
                        )

    def read_later(self, sql: str, values: SqlParams, mode: str = "all", owner: object = None) -> asyncio.Future[Rows]:
        """A read on a reader thread (``values`` checked already, see :meth:`read_now`); ``owner``: whose read it
        is (a client's session): the readers take turns between owners (:class:`FairReads`)."""
        self.uses += 1
        fut: asyncio.Future[Rows] = self.loop.create_future()
        if self._closed:
            fut.set_exception(ClosedError(f"database {self.name} is closed"))
        else:
            self._reads.put(_Read(sql, values, mode, fut), owner)
        return fut

    def begin(self, owner: object, read_only: bool = False, migration: bool = False) -> asyncio.Future[SqlTx]:
        """Start an interactive transaction; resolves once it holds the writer (or a reader snapshot).
        ``migration``: with foreign keys off (see :meth:`_migrate`)."""
        self.uses += 1
        fut: asyncio.Future[SqlTx] = self.loop.create_future()
        if self._closed:
            fut.set_exception(ClosedError(f"database {self.name} is closed"))
            return fut
        if self.engine.stopping and owner is not None:
            fut.set_exception(
                UnavailableError(
                    f"database {self.name}: the store is stopping: the transaction was not begun", refused=True
                )
            )
            return fut
        if not read_only and self.broken is not None:
            fut.set_exception(self._refused())
            return fut
        if read_only and owner is not None:
            limit = self.limits.read_transactions
            open_now = sum(1 for t in self.engine.transactions.values() if t.read_only and not t.done)
            if open_now >= limit:
                fut.set_exception(
                    LimitError(
                        f"database {self.name}: {open_now} read-only transaction{'s are' if open_now != 1 else ' is'} "
                        "open in the store, the most "
                        f"it may have (Limits.read_transactions, {limit}: each holds a thread and a connection); "
                        "end one, or read outside a transaction",
                        limit=limit,
                        wanted=open_now + 1,
                    )
                )
                return fut
            with self._spare_lock:
                spare = bool(self._spare)
            if not spare:
                # (its own connection, two files: 150 read-only transactions of a server limited to 128 files took
                # every descriptor, and the reads of other clients failed "out of file descriptors": trial IK)
                try:
                    self.engine.check_descriptors(
                        self.name,
                        TX_FILES,
                        what="the read-only transaction was not begun",
                        takes="each holds a connection of its own (about {need})",
                        advice="end one, or read outside a transaction",
                    )
                except TinystoreError as exc:
                    fut.set_exception(exc)
                    return fut
        tx = SqlTx(self.engine.next_tx_id(), self, read_only, owner, migration=migration)
        self.engine.transactions[tx.id] = tx
        if read_only:
            t = threading.Thread(
                target=self._read_tx_main, args=(tx, fut), daemon=True, name=f"tinystore-sql-{self.name}-rtx"
            )
            t.start()
        else:
            self._queue((tx, fut))
        return fut

    # -- threads ---------------------------------------------------------------------------------

    def _progress_guard(self, conn: sqlite3.Connection, *, reads: bool = False) -> _Arm:
        """Install on ``conn`` SQLite's progress handler; ``arm(start, fut)`` gives the statements from now on
        until ``start + statement_timeout`` before SQLite interrupts them, and, when ``fut`` is given (a read's),
        until ``fut`` is done: a read whose caller went away (cancelled) stops within some 10,000 SQLite
        instructions rather than keeping its thread to the end. Writes are never given one: a write that was
        sent goes on (each write's docstring says so). ``until``: a moment no statement runs past, whatever its own
        limit (a transaction's ``tx_max``: trial CZ, a statement ran on past it, keeping the writer). On the writer's
        connection (not ``reads``), a statement armed with ``own=False`` (a client's) is also interrupted once
        :meth:`cut_calls` was called; a read is not (its client sends it again to the next server)."""
        limit = self.limits.statement_timeout
        deadline = [time.monotonic() + limit]
        current: list[Any] = [None]
        own_now = [False]
        monotonic = time.monotonic
        c: Any = conn

        def check() -> int:
            # SQLite counts a prepared statement's steps across its runs, so the handler also fires, now and
            # then, inside the engine's own BEGIN, COMMIT or ROLLBACK (cached, a few steps each): those run
            # under no statement's limit (an interrupted COMMIT may have committed all the same)
            if c.control:
                return 0
            if monotonic() > deadline[0] or self.halted or (self.cut and not own_now[0] and not reads):
                return 1
            fut = current[0]
            return 1 if fut is not None and fut.done() else 0

        conn.set_progress_handler(check, 10000)
        self._guards[threading.get_ident()] = (conn, own_now, reads)

        def arm(start: float, fut: Any = None, until: float = math.inf, own: bool = False) -> None:
            deadline[0] = min(start + limit, until)
            current[0] = fut
            own_now[0] = own

        return arm

    def _recycle(self, conn: sqlite3.Connection, *, readonly: bool) -> sqlite3.Connection:
        """``conn``, or a new connection in its place once it ran more than :data:`RECYCLE_BYTES` of long
        statements: sqlite3 keeps the last 256 statements of a connection prepared, with their texts, and a
        client's long texts (megabytes each) would stay in the server's memory for good. Called between
        transactions; when a new connection cannot be opened, ``conn`` goes on."""
        if conn.big <= RECYCLE_BYTES:  # type: ignore[attr-defined]
            return conn
        try:
            fresh = self.connect(readonly=readonly)
        except sqlite3.Error:
            conn.big = 0  # type: ignore[attr-defined]
            return conn
        conn.close()
        self.stats["connections_recycled"] += 1
        return fresh

    def _writer_main(self, conn: sqlite3.Connection) -> None:
        arm = self._progress_guard(conn)
        todo: collections.deque[Any] = collections.deque()  # writes and transactions, in the order queued
        writes = self._writes
        stopping = False

        def take(block: bool) -> None:
            # what is queued joins ``todo`` (waiting, when ``block``, only while there is nothing to do)
            nonlocal stopping
            while not stopping:
                try:
                    if block and not todo:
                        self._writer_waiting = True  # (see closable)
                        got = writes.get()
                        self._writer_waiting = False
                    else:
                        got = writes.get_nowait()
                except queue.Empty:
                    return
                if got is None:
                    stopping = True
                else:
                    todo.extend(got)

        def writes_next(room: int) -> list[_Write]:
            # the single writes at the head of ``todo`` (a transaction or a VACUUM waits its turn), at most ``room``
            out: list[_Write] = []
            while todo and len(out) < room and isinstance(todo[0], _Write) and not is_vacuum(todo[0].sql):
                w = todo.popleft()
                if not self._not_run(w):
                    out.append(w)
            return out

        def late(room: int) -> list[_Write]:
            take(False)
            return writes_next(room)

        while True:
            take(True)
            if not todo:
                break
            item = todo.popleft()
            if isinstance(item, _Write):
                if self._not_run(item):
                    continue
                if is_vacuum(item.sql):
                    self._vacuum(conn, item, arm)
                    continue
                batch = [item, *writes_next(BATCH_MAX - 1)]
                self._group_commit(conn, batch, arm, late)
            else:
                tx, fut = item
                self._run_tx(conn, tx, fut, arm)
            self._bound_wal(conn, arm)
            if self._rowid_stale:
                # a schema change in what just ran, committed or not: the tables are read again from what is now
                self._rowid_tables = None
                self._rowid_stale = False
            if conn.big > RECYCLE_BYTES:  # type: ignore[attr-defined]
                conn = self._recycle(conn, readonly=False)
                arm = self._progress_guard(conn)
        try:
            own_execute(conn, "pragma wal_checkpoint(truncate)")
        except sqlite3.Error:
            pass
        conn.close()

    def _bound_wal(self, conn: sqlite3.Connection, arm: _Arm) -> None:
        """After a commit (writer thread, outside a transaction), at most every :data:`WAL_LOOK_EVERY` seconds: a
        WAL past :data:`WAL_BOUND` is checkpointed whole and truncated (``wal_checkpoint(TRUNCATE)``), waiting
        :data:`WAL_WAIT_MS` at most for the reads still in it (new reads meanwhile read the database file), the
        writes held meanwhile; when reads keep it from finishing, it is tried again a second later, and logged
        (once a minute)."""
        now = time.monotonic()
        if now < self._wal_look_at or self._wal_moved or conn.in_transaction:
            return
        self._wal_look_at = now + WAL_LOOK_EVERY
        try:
            size = os.stat(self._wal).st_size
        except OSError:
            return
        if size <= WAL_BOUND:
            return
        arm(now, own=True)
        c: Any = conn
        c.internal = True
        try:
            conn.execute(f"pragma busy_timeout = {WAL_WAIT_MS}")
            busy = own_execute(conn, "pragma wal_checkpoint(truncate)").fetchone()[0]
        except sqlite3.Error:
            busy = 1
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
            c.internal = False
        key = "wal_busy" if busy else "wal_truncated"
        self.stats[key] = self.stats.get(key, 0) + 1
        if busy and now - self._wal_told > 60:
            self._wal_told = now
            log.warning(
                "database %s: its WAL is %d MB, and reads keep it from being checkpointed (reads that overlap "
                "without a pause, a read-only transaction held open, another program reading the file); it is "
                "tried again every second",
                self.name,
                size // (1024 * 1024),
            )

    def _not_run(self, w: _Write) -> bool:
        """Whether ``w``, queued, is not to run now that the store stopped past its grace (every write once
        :meth:`halt`, a client's once :meth:`cut_calls`): then it was answered unrun: a socket client's
        ``UnavailableError`` marked ``refused``, which the SDK sends to the next server as any call the stopping
        server had not begun (trial EP: it was ClosedError, and the application saw it); an engine's, or an
        embedded store's own (no next server: trial EQ), ``ClosedError``."""
        if not (self.halted or (self.cut and not w.own)):
            return False
        why = f"database {self.name}: the store stopped before the statement ran (its grace ended): not run"
        self.results.put(w.fut, None, UnavailableError(why, refused=True) if w.resend else ClosedError(why))
        return True

    def _group_commit(
        self,
        conn: sqlite3.Connection,
        batch: list[_Write],
        arm: _Arm,
        late: Callable[[int], list[_Write]] = lambda room: [],
    ) -> None:
        """Run ``batch`` in one transaction (one commit, one fsync); each write fails alone. Writes that arrive
        while its statements run join it (``late(room)`` gives them, up to :data:`BATCH_MAX` in all): a commit
        starts only once nothing more is waiting, so callers that answer the last commit's results at once
        share the next one instead of queueing behind a commit of a few.

        Optimistic first: the statements run one after another with no savepoint of their own (a savepoint
        and its release cost two more statements each). Should one fail, the whole transaction is rolled
        back (what the failed statement did before failing goes too) and the batch runs again, each
        statement in its own savepoint: the same outcome as savepoints all along, for the price of a rollback,
        and only when a write fails. A statement that failed on a constraint runs again too (what the statements
        before it did may differ the second time: ``random()``, the time); one that failed otherwise (a time or
        size limit), or that rolled the whole transaction back (``OR ROLLBACK``: the batch commits without it),
        keeps its error.

        A statement of the batch that makes a constraint ``INITIALLY DEFERRED`` (a ``CREATE TABLE``): the batch
        is rolled back and runs one write a commit (:meth:`_one_by_one`), as every batch after it.
        """
        results: list[_Outcome]
        if self.broken is not None:
            self.results.put_many([(w.fut, None, self._refused()) for w in batch])
            return
        if self._deferred_constraints(conn):
            self.results.put_many(self._one_by_one(conn, batch, arm))
            return
        committing = False
        try:
            ctl(conn, "begin immediate")
            done: list[Done] = []
            exec_ = self._exec
            monotonic = time.monotonic
            failure: BaseException | None = None
            rerun = False
            while failure is None:
                for w in batch[len(done) :]:
                    arm(monotonic(), own=w.own)
                    try:
                        done.append(exec_(conn, w.sql, w.params, w.own))
                    except BaseException as exc:
                        failure = self._error(exc) if isinstance(exc, sqlite3.Error) else exc
                        rerun = isinstance(exc, sqlite3.IntegrityError) and conn.in_transaction
                        break
                more = late(BATCH_MAX - len(batch)) if failure is None and len(batch) < BATCH_MAX else []
                if not more:
                    break
                batch.extend(more)
            if failure is None:
                results = [(w.fut, d, None) for w, d in zip(batch, done, strict=True)]
            else:
                results = self._batch_again(conn, batch, len(done), failure, arm, rerun)
            if self._schema_seen != conn.execute("pragma schema_version").fetchone()[0] and self._deferred_constraints(
                conn
            ):
                # the batch made a deferred constraint: the writes after it must not share its commit
                ctl(conn, "rollback")
                self.results.put_many(self._one_by_one(conn, batch, arm))
                return
            self._check_in_place()
            committing = True
            try:
                ctl(conn, "commit")
            except sqlite3.IntegrityError:
                # a deferred constraint (a DEFERRABLE foreign key, or PRAGMA defer_foreign_keys) that one of the
                # writes broke is checked only now, for all of them: find which, each write in a commit of its own
                if len(batch) < 2 or not conn.in_transaction:
                    raise
                ctl(conn, "rollback")
                self.results.put_many(self._one_by_one(conn, batch, arm))
                return
            committing = False
            # (the writes that failed, a full disk's, are not counted, nor a commit of none: trial IA, status counted
            # every failed insert as a write and a commit)
            kept = len(batch) if failure is None else sum(1 for r in results if r[2] is None)
            if kept:
                self.stats["commits"] += 1
                self.stats["writes"] += kept
            gone = self._wal_kept(conn)
        except BaseException as exc:
            rollback_quietly(conn)
            err = self._commit_failed(exc) if committing else self._error(exc)
            self.results.put_many([(w.fut, None, err) for w in batch])
            return
        if gone is not None:
            self.results.put_many([(w.fut, None, gone) for w in batch])
            return
        self.results.put_many(results)

    def _deferred_constraints(self, conn: sqlite3.Connection) -> bool:
        """Whether the schema declares a constraint checked only at COMMIT (``INITIALLY DEFERRED``). Then writes
        do not share a commit: one that broke such a constraint would pass, had another write of its group
        mended it before the shared COMMIT, though alone it fails. Looked at again when the schema changed."""
        try:
            version = conn.execute("pragma schema_version").fetchone()[0]
            if version != self._schema_seen:
                texts = [t for (t,) in conn.execute("select sql from sqlite_master where sql is not null")]
                self._deferred = has_deferred_constraint(texts)
                # a view or trigger that calls last_insert_rowid(): every statement may, whatever its words
                self._schema_rowid = any(names_last_rowid(t) for t in texts)
                self._schema_seen = version
                self._rowid_tables = None
        except sqlite3.Error:
            return self._deferred  # (what the writes then run into is theirs to report)
        return self._deferred

    def _one_by_one(self, conn: sqlite3.Connection, batch: list[_Write], arm: _Arm) -> list[_Outcome]:
        """Each write of ``batch`` in a transaction and a commit of its own (a commit that fails fails its write
        alone): what a group commit falls back to when its COMMIT finds a deferred constraint broken."""
        results: list[_Outcome] = []
        for w in batch:
            if self.broken is not None:
                results.append((w.fut, None, self._refused()))
                continue
            committing = False
            try:
                ctl(conn, "begin immediate")
                arm(time.monotonic(), own=w.own)
                done = self._exec(conn, w.sql, w.params, w.own)
                self._check_in_place()
                committing = True
                ctl(conn, "commit")
            except BaseException as exc:
                rollback_quietly(conn)
                results.append((w.fut, None, self._commit_failed(exc) if committing else self._error(exc)))
                continue
            self.stats["commits"] += 1
            self.stats["writes"] += 1
            gone = self._wal_kept(conn)
            results.append((w.fut, None, gone) if gone is not None else (w.fut, done, None))
        return results

    def _batch_again(
        self,
        conn: sqlite3.Connection,
        batch: list[_Write],
        failed: int,
        failure: BaseException,
        arm: _Arm,
        rerun: bool = False,
    ) -> list[_Outcome]:
        """After ``batch[failed]`` failed with ``failure``: roll back, begin again, run the others each in a
        savepoint (and the failed one too, when ``rerun``). A statement that takes the whole transaction with it
        (``raise(rollback)`` in a trigger, an interrupt) fails alone too: the batch starts over without it.
        Raises what fails the transaction itself (the caller fails the whole batch with it)."""
        errors: dict[int, BaseException] = {} if rerun else {failed: failure}
        while True:
            if conn.in_transaction:
                ctl(conn, "rollback")
            ctl(conn, "begin immediate")
            results: list[_Outcome] = []
            for i, w in enumerate(batch):
                error = errors.get(i)
                if error is not None:
                    results.append((w.fut, None, self._error(error)))
                    continue
                arm(time.monotonic(), own=w.own)
                ctl(conn, "savepoint g")
                try:
                    value = self._exec(conn, w.sql, w.params, w.own)
                except BaseException as exc:
                    if not conn.in_transaction:
                        errors[i] = self._error(exc) if isinstance(exc, sqlite3.Error) else exc
                        break
                    ctl(conn, "rollback to g")
                    ctl(conn, "release g")
                    results.append((w.fut, None, self._error(exc)))
                    continue
                ctl(conn, "release g")
                results.append((w.fut, value, None))
            else:
                return results

    def _vacuum(self, conn: sqlite3.Connection, w: _Write, arm: _Arm) -> None:
        """``VACUUM`` (or ``PRAGMA wal_checkpoint``): alone on the writer, outside any transaction (SQLite runs
        neither inside one). A VACUUM rewrites the whole file, so it takes as long as the database is large: it
        runs under no time limit, as a migration does (one of a few GB passed ``statement_timeout`` and rolled
        back; trial CF). A checkpoint keeps the limit (it waits a second at most for readers, below)."""
        checkpoint = not is_vacuum_itself(w.sql)
        arm(time.monotonic() if checkpoint else math.inf, own=w.own)
        c: Any = conn
        c.internal = True  # its own BEGIN and scratch database; VACUUM INTO a file stays refused (authorizer)
        try:
            if checkpoint:
                # a RESTART or TRUNCATE checkpoint waits for the readers' snapshots, holding every write: a second
                # at most, then it answers what it did (its "busy" column 1), rather than stall the writes for as
                # long as a read-only transaction stays open (trial CE: 12 s)
                conn.execute(f"pragma busy_timeout = {CHECKPOINT_WAIT_MS}")
            restrict(conn, w.sql)  # (before the engine's rights: see statement_authorizer)
            cur = conn.execute(w.sql, w.params)
            desc = cur.description
            rows = [list(r) for r in cur.fetchall()] if desc else []
        except BaseException as exc:
            self.results.put(w.fut, None, self._error(exc))
            return
        finally:
            unrestrict(conn)
            if checkpoint:
                conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
            c.internal = False
        self.stats["writes"] += 1
        self.results.put(w.fut, Done(0, 0, [d[0] for d in desc] if desc else [], rows), None)

    def _exec(
        self, conn: sqlite3.Connection, sql: str, params: SqlParams, own: bool = False, last_rowid: int = 0
    ) -> Done:
        """One statement on the writer; ``own``: an engine's (:func:`own_sql`), with the engine's rights. A
        client's never has them, whatever its text. ``last_rowid``: in a transaction, the rowid its last insert
        added (0 for none, and for an exec: a transaction of its own), which SQL's ``last_insert_rowid()`` gives
        while the statement runs, and after one that added no row."""
        if len(sql) > CACHED_SQL:
            conn.big += len(sql)  # type: ignore[attr-defined]
        inserts = is_insert(sql)
        if not inserts and changes_schema(sql):
            self._rowid_tables = None  # (read again when needed; and once the batch or transaction has ended)
            self._rowid_stale = True
        # (a view or trigger of the schema may call it, whatever the words; for an insert only its own words count,
        # so that one adding no rowid row still reports 0: a trigger it fires sees 0)
        names = names_last_rowid(sql) or (self._schema_rowid and not inserts)
        if conn.resets_rowid and (names or (inserts and not self._adds_rowid_rows(conn, sql))):  # type: ignore[attr-defined]
            # an insert starts from 0, so that one that adds no rowid row gives 0 (the writer's value is whatever
            # another client inserted last); a statement that calls last_insert_rowid() sees the transaction's own
            # (0 in an exec). (One that does both and adds no row gives the transaction's, as SQLite's does.)
            set_rowid(conn, last_rowid if names else 0)
        before = conn.total_changes
        schema = None if own or not names_own(sql) or not changes_schema(sql) else own_objects(conn)
        # an engine's own statement (own_sql) may write the store's tables
        restricted = not own and restrict(conn, sql)
        try:
            cur = as_engine(conn, sql, params) if own else conn.execute(sql, params)
            desc = cur.description
            rows = [] if desc is None else _fetch_checked(cur, self.name, self.limits.sql_result_bytes)
        finally:
            if restricted:
                unrestrict(conn)
        if schema is not None:
            check_own_objects(self.name, schema, conn)
        changes = cur.rowcount
        if changes < 0:
            # sqlite3 counts rows only for statements that begin with INSERT, UPDATE, DELETE or REPLACE; for one
            # under a WITH, SQLite's changes() (its own rows: not its triggers', as for the others). It counts
            # the last statement that changed rows, so it is asked only when this one changed some
            changes = conn.total_changes - before
            if changes:
                changes = conn.execute("select changes()").fetchone()[0]
            elif desc is None and holds_no_statement(sql):
                raise no_statement(self.name, sql)
        # (an insert that added no row leaves the writer's value as it was: a statement that reads it later in the
        # transaction has it set to the transaction's last insert first, above; set now, it would make SQL's
        # changes() 1 for the next statement: trial CO)
        rowid = (cur.lastrowid or 0) if changes and inserts else 0
        return Done(changes, rowid, list(map(_first, desc)) if desc else [], rows)

    def _adds_rowid_rows(self, conn: sqlite3.Connection, sql: str) -> bool:
        """Whether every row the insert ``sql`` changes is one it adds to an ordinary rowid table (see
        :func:`insert_target`, :func:`rowid_tables`): then, when it changed any, the connection's last insert rowid
        is its own last row's, and the writer need not set it to 0 first (a statement less per insert).

        Not after a schema change in the batch or transaction under way (its tables are read from a schema no
        statement of it changed), nor when a view or trigger calls ``last_insert_rowid()`` (a BEFORE INSERT
        trigger would see another client's rowid)."""
        if self._rowid_stale or self._schema_rowid:
            return False
        target = insert_target(sql)
        if target is None:
            return False
        tables = self._rowid_tables
        if tables is None:
            tables = self._rowid_tables = rowid_tables(conn)
        return target in tables

    def _exec_alone(
        self, conn: sqlite3.Connection, sql: str, params: SqlParams, own: bool = False, last_rowid: int = 0
    ) -> Done:
        """:meth:`_exec` inside a transaction, in a savepoint: a statement that fails after it ran (its
        ``returning`` rows over ``sql_result_bytes``) leaves nothing either, like one SQLite stopped."""
        ctl(conn, "savepoint s")
        try:
            done = self._exec(conn, sql, params, own, last_rowid)
        except BaseException:
            if conn.in_transaction:
                ctl(conn, "rollback to s")
                ctl(conn, "release s")
            raise
        ctl(conn, "release s")
        return done

    def _query(self, conn: sqlite3.Connection, sql: str, params: SqlParams, mode: str, unlimited: bool = False) -> Rows:
        if len(sql) > CACHED_SQL:
            conn.big += len(sql)  # type: ignore[attr-defined]
        restricted = restrict(conn, sql)
        try:
            cur = conn.execute(sql, params)
            desc = cur.description
            if desc is None and holds_no_statement(sql):
                raise no_statement(self.name, sql)
            columns = list(map(_first, desc)) if desc else []
            if unlimited:
                try:
                    rows = cur.fetchall()
                finally:
                    cur.close()
                if mode != "all":
                    rows = rows[:1]
            elif mode == "all":
                rows = _fetch_checked(cur, self.name, self.limits.sql_result_bytes)
            else:
                try:
                    one = cur.fetchone()
                finally:
                    cur.close()
                rows = [one] if one is not None else []
                _check_size(self.name, rows, self.limits.sql_result_bytes)
        finally:
            if restricted:
                unrestrict(conn)
        return Rows(columns, rows)

    def _reader_main(self, conn: sqlite3.Connection) -> None:
        arm = self._progress_guard(conn, reads=True)
        put = self.results.put
        reads = self._reads
        while True:
            got = reads.get()
            if got is None:
                break
            item, owner = got
            arm(time.monotonic(), item.fut)
            try:
                value = self._query(conn, item.sql, item.params, item.mode, item.unlimited)
                put(item.fut, value, None)
            except BaseException as exc:
                put(item.fut, None, self._error(exc))
            finally:
                reads.done(owner)
            if conn.big > RECYCLE_BYTES:  # type: ignore[attr-defined]
                conn = self._recycle(conn, readonly=True)
                arm = self._progress_guard(conn, reads=True)
        conn.close()

    def _run_tx(self, conn: sqlite3.Connection, tx: SqlTx, fut: asyncio.Future[SqlTx], arm: _Arm) -> None:
        put = self.results.put
        if tx.done or tx.error is not None:  # aborted before it began (its client went away, the store stops)
            tx.done = True
            err = tx.error or ClosedError(f"database {self.name}: transaction ended")
            if self.engine.stopping:
                # nothing of it ran: the client may begin it again at the next server
                err = UnavailableError(
                    f"database {self.name}: the store is stopping: the transaction was not begun", refused=True
                )
            put(fut, None, err)
            self._drain(tx)
            return
        if self.broken is not None:
            tx.done = True
            put(fut, None, self._refused())
            return
        try:
            if tx.migration:
                ctl(conn, "pragma foreign_keys = off")  # (before the transaction: SQLite ignores it inside one)
            try:
                ctl(conn, "begin immediate")
            except BaseException as exc:
                tx.done = True
                put(fut, None, self._error(exc))
                return
            self.active_tx = tx
            self.stats["transactions"] += 1
            self._deferred_constraints(conn)  # (which also tells whether the schema calls last_insert_rowid())
            put(fut, tx, None)
            self._serve_tx(conn, tx, arm, writer=True)
            self.active_tx = None
        finally:
            if tx.migration:
                ctl(conn, "pragma foreign_keys = on")

    def _loop_polled(self, tx: SqlTx, until: float) -> None:
        """Wait, on a database thread, until the store's loop has polled its sockets since this call (two turns of
        it: a callback scheduled by a callback runs a turn later, after a poll, in asyncio's loop and uvloop's
        alike), or ``tx`` has a call (or its abort), or until ``until`` (``time.monotonic()``); at once when the
        loop is closed."""
        polled = threading.Event()
        loop = self.loop

        def first() -> None:
            loop.call_soon(polled.set)

        try:
            loop.call_soon_threadsafe(first)
        except RuntimeError:
            return
        while not polled.wait(0.05):
            if not tx.calls.empty() or time.monotonic() >= until:
                return

    def _serve_tx(self, conn: sqlite3.Connection, tx: SqlTx, arm: _Arm, writer: bool) -> None:
        put = self.results.put
        limits = self.limits
        if tx.migration:
            # a migration (the engine's, its statements sent by the loop one after another) runs under no time
            # limit, as at a database's open: a rebuild of a big table given to a database open already failed at
            # statement_timeout or tx_max (trial CF). (A day each: a wait that SimpleQueue can take.)
            limits = msgspec.structs.replace(limits, tx_max=_UNLIMITED, tx_idle=_UNLIMITED)
        started = time.monotonic()
        ends = started + limits.tx_max  # no statement of the transaction runs past its tx_max (see arm)

        def past_tx_max() -> TimeoutError_:
            return TimeoutError_(
                f"database {self.name}: transaction {tx.id} ran past tx_max ({limits.tx_max:g}s) and was rolled back"
            )

        end_reason: TinystoreError | None = None
        quiet = False
        last_rowid = 0  # the rowid the transaction's last insert added (SQL's last_insert_rowid())
        deferring = False  # it ran PRAGMA defer_foreign_keys (see DEFERRING_TAG)
        while True:
            now = time.monotonic()
            wait = min(limits.tx_idle, started + limits.tx_max - now)
            if wait <= 0:
                end_reason = past_tx_max()
                break
            call = _take(tx.calls, wait)
            if call is _NO_CALL:
                woke = time.monotonic()
                in_time = woke - started < limits.tx_max
                if in_time and tx.held:
                    continue  # its next call came, and waits at the server behind others: not idle (trial AR)
                if in_time and woke - now - wait > STALL_SLACK:
                    # woken later than asked: the process was stopped (SIGSTOP, a suspended machine) or starved,
                    # and the client's next statement may be waiting unread in its socket. Idle is the client's
                    # doing, not the server's: the wait starts again, giving the loop the time to read it.
                    continue
                if in_time:
                    # woken on time, yet a stop may have ended just now, or the loop may be busy (trial DG: kept
                    # 6 s by one client's call, while another's transaction was never idle 0.3 s): it has not
                    # read yet what the client sent meanwhile. Once it has polled its sockets again, a last look
                    self._loop_polled(tx, ends)
                    call = _take(tx.calls, IDLE_GRACE)
            if call is _NO_CALL:
                if time.monotonic() - started >= limits.tx_max:
                    end_reason = past_tx_max()
                else:
                    end_reason = TimeoutError_(
                        f"database {self.name}: transaction {tx.id} stayed idle past tx_idle ({limits.tx_idle:g}s) "
                        "and was rolled back"
                    )
                break
            if call is None:  # aborted: its client went away, or the store is stopping (logged once there)
                end_reason = tx.error or ClosedError(f"database {self.name}: transaction {tx.id} was rolled back")
                quiet = True
                break
            if call.op == "commit":
                try:
                    if writer:
                        self._check_in_place()
                    ctl(conn, "commit")
                    tx.done = True
                    gone = None
                    if writer:
                        self.stats["commits"] += 1
                        gone = self._wal_kept(conn)
                    # (answered with an error, it is not committed for its hooks: the messages it published are
                    # dropped, not held for an after_commit that does not come: trial BD)
                    tx.committed = gone is None
                    put(call.fut, None, gone)
                except BaseException as exc:
                    err = self._commit_failed(exc) if writer else self._error(exc)
                    if conn.in_transaction:
                        ctl(conn, "rollback")
                    tx.done = True
                    tx.error = err
                    put(call.fut, None, err)
                self._drain(tx)
                return
            if call.op == "rollback":
                if conn.in_transaction:
                    ctl(conn, "rollback")
                tx.done = True
                tx.error = ClosedError(f"database {self.name}: transaction {tx.id} was rolled back")
                put(call.fut, None, None)
                self._drain(tx)
                return
            # a read in a transaction stops when its caller goes away; a write goes on (interrupting it would
            # roll back the whole transaction, which a caller that only gave up waiting may go on with); either
            # stops once the transaction's rollback was asked for
            arm(
                math.inf if tx.migration else time.monotonic(),
                _Doomed(tx, call.fut if call.op == "query" else None),
                ends,
                own=call.own,
            )
            sql = call.sql
            if deferring:
                sql = DEFERRING_TAG + sql  # (see DEFERRING_TAG: prepared apart from every other client's text)
            elif writer and defers_foreign_keys(sql):
                deferring = True
            try:
                if call.op == "exec":
                    value: Any = self._exec_alone(conn, sql, call.params, call.own, last_rowid)
                    if value.last_insert_rowid:
                        last_rowid = value.last_insert_rowid
                elif writer:
                    # tx.one/all/scalar only read, on the writer too: a write there would have none of tx.exec's
                    # care (its savepoint; never stopped when its caller goes away)
                    if self._schema_rowid or names_last_rowid(sql):
                        set_rowid(conn, last_rowid)
                    ctl(conn, "pragma query_only = 1")
                    try:
                        value = self._query(conn, sql, call.params, call.mode)
                    finally:
                        ctl(conn, "pragma query_only = 0")
                else:
                    value = self._query(conn, call.sql, call.params, call.mode)
                put(call.fut, value, None)
            except BaseException as exc:
                if interrupted(exc) and tx.doomed:
                    # its rollback was asked for, and it was interrupted for that: the transaction ends
                    end_reason = tx.error or ClosedError(f"database {self.name}: transaction {tx.id} was rolled back")
                    if self._closed:  # (the database closes as the store stops: say so, as a halt's interrupt does)
                        end_reason = ClosedError(
                            f"database {self.name}: the store stopped while the statement ran: interrupted, and "
                            "rolled back"
                        )
                    put(call.fut, None, end_reason)
                    quiet = True
                    break
                if interrupted(exc) and time.monotonic() >= ends:
                    # stopped at the transaction's tx_max (see arm): the transaction ends with it, rolled back
                    end_reason = past_tx_max()
                    put(call.fut, None, end_reason)
                    break
                err = self._error(exc)
                if not conn.in_transaction:
                    # SQLite rolled back the whole transaction (INSERT OR ROLLBACK, a trigger's RAISE(ROLLBACK), an
                    # interrupt): it is over; what follows must not run in autocommit
                    # (a migration's, or one the store began for a call, as a big add_many's, is not named by its
                    # number, which the client never saw: trial EG, EH)
                    which = "migration" if tx.migration else "own" if call.own else ""
                    end_reason = rolled_back_by(self.name, tx.id, err, which=which)
                    put(call.fut, None, rolled_back_by(self.name, tx.id, err, this=True, which=which))
                    quiet = True  # the application's own doing, not the store's: no warning in the log
                    break
                put(call.fut, None, err)
        # ended without commit
        rollback_quietly(conn)
        tx.done = True
        tx.error = end_reason
        if end_reason is not None and not isinstance(end_reason, ClosedError) and not quiet:
            log.warning("%s", end_reason.message)
        self._drain(tx)

    def _drain(self, tx: SqlTx) -> None:
        err = tx.error or ClosedError(f"database {self.name}: transaction {tx.id} has ended")
        while True:
            try:
                call = tx.calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                if call.op == "rollback":
                    self.results.put(call.fut, None, None)
                else:
                    self.results.put(call.fut, None, err)
        self.loop.call_soon_threadsafe(self.engine.ended, tx.id, tx.error)

    def _read_tx_main(self, tx: SqlTx, fut: asyncio.Future[SqlTx]) -> None:
        with self._spare_lock:
            conn = self._spare.pop() if self._spare else None
        if conn is None:
            try:
                conn = self.connect(readonly=True)
            except BaseException as exc:  # (out of file descriptors): the caller hears it
                tx.done = True
                self.results.put(fut, None, self._error(exc))
                return
        arm = self._progress_guard(conn, reads=True)
        try:
            ctl(conn, "begin")
            conn.execute(f"select count(*) from {MIGRATIONS_TABLE}").fetchone()  # pin the snapshot now
        except BaseException as exc:
            tx.done = True
            self.results.put(fut, None, self._error(exc))
            conn.close()
            return
        self.results.put(fut, tx, None)
        self._serve_tx(conn, tx, arm, writer=False)
        if conn.in_transaction:
            ctl(conn, "rollback")
        with self._spare_lock:
            if len(self._spare) < 4 and not self._closed and conn.big <= RECYCLE_BYTES:  # type: ignore[attr-defined]
                self._spare.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Stop the threads once queued work is done; the writer checkpoints the WAL and closes the file."""
        if self._closed:
            return
        self._closed = True
        for tx in list(self.engine.transactions.values()):
            if tx.db is self:
                tx.abort(ClosedError(f"database {self.name}: the store is stopping"))
        self._hand_over()
        self._writes.put(None)
        self._reads.stop(max(1, self.limits.readers))

    def cut_calls(self) -> None:
        """Interrupt the statements the threads run for clients' calls, now and from now on (rolled back; each call
        answered ``ClosedError``); the engines' own go on. The store's stop ran past its grace with calls still
        under way: their clients are told before their connections close, rather than left to guess
        (``OutcomeUnknownError``). A statement running now is interrupted at once (``sqlite3_interrupt``: a VACUUM
        of large rows runs fewer than 10,000 instructions, trial EH), the ones after it at their next 10,000
        instructions, and a client's write queued behind them is answered unrun (``ClosedError``). Reads are not
        cut (their clients send them again to the next server)."""
        self.cut = True
        self._interrupt(clients_only=True)

    def _interrupt(self, clients_only: bool) -> None:
        """``sqlite3_interrupt`` on the threads' connections running a statement now (a no-op on one running none):
        every one, or, with ``clients_only``, the writer's when its statement is a client's. Never one running the
        engine's own BEGIN, COMMIT or ROLLBACK (an interrupted COMMIT may have committed all the same)."""
        for conn, own_now, reads in list(self._guards.values()):
            c: Any = conn
            if getattr(c, "control", False) or (clients_only and (reads or own_now[0])):
                continue
            with contextlib.suppress(Exception):  # (closed meanwhile: nothing to interrupt)
                conn.interrupt()

    def halt(self) -> None:
        """Interrupt what the threads run now (a long migration, write, VACUUM or read: rolled back), and all they
        would run after: the store's stop ran past its grace. They end within some 10,000 SQLite instructions
        (or a COMMIT's fsync)."""
        self.halted = True
        self._interrupt(clients_only=False)

    def closable(self) -> bool:
        """Whether nothing of it runs or waits, so that closing it loses nothing (its next call opens it again):
        no transaction, no write or read queued or running, no snapshot of the loop's, no engine holding it
        (the store's own databases, a queue's jobs), and not broken or moved (those wait for a restart)."""
        return (
            not self._closed
            and not self.pinned
            and not self.name.startswith(RESERVED_DB_PREFIX)
            and self.broken is None
            and not self._moved
            and not self._wal_moved
            and not self._snapshot
            and self.active_tx is None
            and not self._queued
            and self._writes.empty()
            and self._writer_waiting
            and self._reads.idle()
            and not any(tx.db is self for tx in self.engine.transactions.values())
        )

    def busy(self) -> bool:
        """Whether its start or one of its threads still runs."""
        return not self._start_ended.is_set() or any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the threads to end; whether they all did (then the spare
        connections are closed)."""
        deadline = time.monotonic() + timeout
        if not self._start_ended.wait(timeout):
            return False  # (its migrations at open still run)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            return False
        # (under the lock, closes and all: a second thread waiting for them, a cancelled stop's own wait still
        # running beside the one that lets the directory go, returns only once the files are closed, not while the
        # first still closes them: CI, 2026-12-07)
        with self._spare_lock:
            for c in self._spare:
                c.close()
            self._spare.clear()
            inline, self._inline = self._inline, None
            if inline is not None:
                inline.close()
        return True


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


ROOM_WAIT = 2.0
"""Seconds an open waits at ``Limits.databases`` for a database to be done with (closed to make room)."""
ROOM_POLL = 0.02
"""Seconds between its looks."""
SWEEP_MIN = 0.05
SWEEP_MAX = 10.0
"""Seconds between two looks for databases no call used (a quarter of ``Limits.database_idle``, within these)."""


def _join_all(dbs: list[SqlDatabase]) -> None:
    """Waits (in a thread) for the threads of ``dbs``, closed, to end."""
    for db in dbs:
        while not db.join(HALT_WAIT):
            pass


HALT_WAIT = 10.0
"""Seconds between the stop's warnings while an interrupted statement has not ended (see ``SqlEngine.close``)."""

ENDED_KEPT = 1024
"""How many transactions that timed out an engine remembers, to tell a late call why (see ``SqlEngine.not_open``)."""


_size_encoder = msgspec.msgpack.Encoder()


def _encode(value: Any) -> bytearray:
    """``value`` in MessagePack (to measure it), into a bytearray: msgspec's ``encode`` to bytes crashes the process
    (SIGSEGV, msgspec 0.23) when memory runs out as its buffer grows (trial EG: a server under a memory limit read
    60 MB of rows); ``encode_into`` raises ``MemoryError``, which the call is answered."""
    out = bytearray()
    _size_encoder.encode_into(value, out)
    return out


_SIZE_CHUNK = 1024  # rows measured at a time: a large result is never encoded whole (the copy stays small)


RECYCLE_BYTES = 8 << 20
"""Characters of long statements a connection may have run before it is replaced (see ``SqlDatabase._recycle``)."""
INLINE_VALUE_BYTES = 16 << 10
"""The largest value (string, blob, row) a read on the event loop may make; a larger one moves to a reader."""
BIG_MIGRATIONS = 256 << 10
"""Characters of migrations (given and applied) past which a database already open looks for a renamed one on a
thread, not on the event loop (some 0.3 s a MB; the thread lets the loop run between texts)."""
INLINE_SQL_BYTES = 4 << 10
"""The longest statement a read on the event loop may run; a longer one goes to a reader. SQLite looks at its
progress handler only where a statement jumps: a statement of many function calls in a row (a long select list)
runs whole. With these two bounds, such a run on the loop costs a few ms at most (a few hundred calls over values
of 16 KiB), where 64 KiB and 1 MiB let one read hold every client for 17 s (trial W)."""
INLINE_TURN_READS = 512
"""Reads answered inline in one turn of the event loop, past which they are handed over in the next turn (see
:meth:`SqlDatabase.turn_full`)."""


def _bound_heap(limit: int) -> None:
    """Set SQLite's hard heap limit (process-wide) to ``limit`` bytes. No per-value or per-result bound stops one
    statement from holding many values at once (SQLite computes a statement's constant expressions once, each into
    a register of its own, all alive together: 1,899 copies of a 300 kB parameter took 1.5 GB, trial W), nor from
    keeping them with its prepared form; this does, for all of SQLite in the process."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(f"pragma hard_heap_limit = {int(limit)}")
    finally:
        conn.close()


def _too_big(exc: BaseException) -> bool:
    """Whether SQLite (or sqlite3) refused ``exc``'s statement for a value or a text over its limits."""
    return isinstance(exc, sqlite3.DataError) and (
        getattr(exc, "sqlite_errorname", "") == "SQLITE_TOOBIG" or str(exc) == "query string is too large"
    )


def _fetch_checked(cur: sqlite3.Cursor, db: str, limit: int) -> list[Any]:
    """The rows of ``cur``, fetched and measured as they come: ``LimitError`` (as :func:`_check_size`) as soon as
    they are over ``limit`` bytes, before the rest is made. The first row comes alone; then each chunk holds as
    many rows as an eighth of the limit fits, by the size of the rows so far (1 to ``_SIZE_CHUNK``), so the
    server holds at most the limit, an eighth more and one row. The statement is reset then, and on any failure
    (a text that is not UTF-8): left running, it would keep its transaction from ending (SQLite: "SQL statements
    in progress"), and with it the writes of other clients that share the transaction."""
    try:
        rows = cur.fetchmany(1)
        if not rows:
            return rows
        per_row = row_cost(len(rows[0]))
        total = len(_encode(rows))
        budget = max(limit // 8, 1)
        while total <= limit:
            n = max(1, min(_SIZE_CHUNK, budget * len(rows) // max(total, 1)))
            more = cur.fetchmany(n)
            if not more:
                return rows
            total += len(_encode(more)) + per_row * len(more)
            rows += more
    except BaseException:
        cur.close()
        raise
    cur.close()
    raise LimitError(
        f"database {db}: the result is over {limit} bytes (the limit sql_result_bytes; it is {total} bytes or more "
        f"encoded, each row after the first counted {per_row} bytes more: what it costs in memory){PAGE_HINT}",
        limit=limit,
        wanted=total,
    )


PAGE_HINT = (
    "; read it in pages (where id > ? order by id limit N: the last id of a page starts the next), or raise "
    "Limits.sql_result_bytes"
)
ROW_COST = 56
VALUE_COST = 24
"""What a row of a result costs the server beyond its encoding, counted against ``sql_result_bytes`` (every row
after the first): a Python tuple (56 bytes) and, for each value, its slot and a small object (24). Without it a
result of millions of one-integer rows (10 MB encoded) held 28 times that in memory (trial AO: 278 MB)."""


def row_cost(columns: int) -> int:
    """What a row of ``columns`` values costs beyond its encoding (see :data:`ROW_COST`)."""
    return ROW_COST + VALUE_COST * columns


def _check_size(db: str, rows: list[Any], limit: int) -> None:
    """Raise ``LimitError`` when ``rows`` are over ``limit`` bytes (``Limits.sql_result_bytes``), whatever their
    number (one row of large values too). Their size is their length encoded (msgpack, as a socket carries
    them), measured by msgspec: cheaper than a Python loop over the values (about 0.1 µs for a point read's
    row), and a large result is measured ``_SIZE_CHUNK`` rows at a time, so its copy stays small."""
    n = len(rows)
    if n == 0:
        return
    per_row = row_cost(len(rows[0]))
    if n <= _SIZE_CHUNK:
        total = len(_encode(rows)) + per_row * (n - 1)
    else:
        total = -per_row
        for i in range(0, n, _SIZE_CHUNK):
            chunk = rows[i : i + _SIZE_CHUNK]
            total += len(_encode(chunk)) + per_row * len(chunk)
            if total > limit:
                break
    if total > limit:
        more = " or more" if n > _SIZE_CHUNK else ""
        raise LimitError(
            f"database {db}: the result is over {limit} bytes (the limit sql_result_bytes; it is {total} bytes{more} "
            f"encoded, each row after the first counted {per_row} bytes more: what it costs in memory){PAGE_HINT}",
            limit=limit,
            wanted=total,
        )


def _placeholder_named(exc: TinystoreError, stmt: str) -> TinystoreError:
    """``exc`` of a migration's statement ``stmt``, or, when it is SQLite's "Incorrect number of bindings supplied"
    or the refusal of a named placeholder meant for ``db.exec``, an ``InvalidError`` that says what is wrong: a
    migration's statements take no parameters (trial GW)."""
    if not isinstance(exc, InvalidError) or not _PLACEHOLDER_REFUSED.search(exc.message):
        return exc
    named = named_placeholder(stmt)
    return InvalidError(
        f"the statement has {f'the placeholder {named}' if named else 'a ? placeholder'}: a migration takes no "
        "parameters (write the values in its text)"
    )


_PLACEHOLDER_REFUSED = re.compile(
    r"^database [^:]+: (Incorrect number of bindings supplied\. The current statement uses \d+, and there are 0 "
    r"supplied\.|the statement has the named placeholder \S+: give its values by name in one dict after the SQL .*)$"
)
"""SQLite's refusal of a statement with a placeholder run without parameters, or :func:`check_params`'s of a named
one: as a migration's statement's error, what :func:`_placeholder_named` words anew."""


class _NameLock(asyncio.Lock):
    """The lock the opens of one database name take turns by; ``users``: the opens that hold it or wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.users = 0


class SqlEngine:
    """The SQL databases of one store directory (``DIR/sql/<name>.db``)."""

    def __init__(self, directory: Path, limits: Limits, durability: str = "full") -> None:
        if durability not in ("full", "os"):
            raise InvalidError(f'durability {durability!r}: use "full" or "os"')
        self.directory = directory / "sql"
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            # (a file where the folder goes: a bare FileExistsError, and a sidecar that waited 20 s; trial CY)
            raise UnavailableError(
                f"store {directory}: {self.directory} is not a folder; it holds the store's SQL databases (move "
                "the file away for the store to start with none)"
            ) from None
        self.limits = limits
        _bound_heap(limits.sql_memory_bytes)
        self.durability = durability
        self.loop = asyncio.get_running_loop()
        self.databases: dict[str, SqlDatabase] = {}
        self.transactions: dict[int, SqlTx] = {}
        # why recent transactions ended other than by their own commit or rollback (a timeout, the store
        # stopping), so that a late call learns why rather than only that the transaction is gone
        self._ended: collections.OrderedDict[int, TinystoreError] = collections.OrderedDict()
        self._opening: dict[str, _NameLock] = {}  # name → the lock its opens take turns by, while one holds or waits
        self._starting = 0  # databases whose start runs (their files count as spoken for: see check_room)
        # how many connections the server's listeners hold (each a descriptor: see check_room); set by the server
        self.connections: Callable[[], int] = lambda: 0
        # descriptors kept for connections to the directory's socket (the command line's), set by the server
        self.kept_local: Callable[[], int] = lambda: 0
        self._opening_dbs: set[SqlDatabase] = set()  # those databases (see close)
        # new migrations of open databases being applied, in tasks of their own (see open): ended at close
        self._migrating: set[asyncio.Future[list[str]]] = set()
        # the databases given room under Limits.databases and not in self.databases yet (their start runs, or has
        # just ended and its opener has not taken it in yet)
        self._admitted: set[SqlDatabase] = set()
        self._room_line: collections.deque[object] = collections.deque()  # opens waiting for room, in order
        # databases closed because no call used them (see _sweep), until their threads ended: an open of one
        # waits for that first, so that two writers never share a file
        self._closing: dict[str, tuple[SqlDatabase, asyncio.Future[None]]] = {}
        # the databases not open now because no call used them, with their counters (status; carried on at reopen)
        self._unused_closed: dict[str, dict[str, int]] = {}
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._tx_ids = 0
        self.closed = False
        self.stopping = False  # see stop_transactions

    def check_descriptors(self, name: str, need: int, **words: str) -> None:
        """:func:`check_room` for ``need`` more descriptors of database ``name``: the databases opening beside it,
        and the files the open ones open at their first reads, count as spoken for (``words``: its error's)."""
        check_room(
            name,
            need,
            database_files(self.limits.readers) * self._starting + LAZY_FILES * len(self.databases),
            self.connections(),
            self.kept_local(),
            **words,
        )

    def stop_transactions(self) -> None:
        """The store is stopping: roll back the clients' transactions now (those with an owner; the store's own
        are part of a call under way, which may finish), and refuse the clients' new ones. A statement running
        in one is interrupted (a commit already sent is done); a begin still waiting for the writer fails as
        not begun (``refused``: the client may begin again at the next server). Otherwise each would hold the
        writer, its statements refused, until ``tx_idle``, and the stop would wait out its grace."""
        self.stopping = True
        open_tx = [tx for tx in self.transactions.values() if tx.owner is not None and not tx.done]
        for tx in open_tx:
            tx.abort(
                UnavailableError(
                    f"database {tx.db.name}: the store stopped; transaction {tx.id} was rolled back (nothing of it "
                    "was committed)"
                )
            )
        if open_tx:
            log.info("the store is stopping: %d open transactions rolled back", len(open_tx))

    def ended(self, tx_id: int, error: TinystoreError | None) -> None:
        """Transaction ``tx_id`` ended (on the loop); ``error`` is why, when it was not its own doing. Its
        ``on_end`` hooks run now."""
        tx = self.transactions.pop(tx_id, None)
        if tx is not None:
            for hook in tx.on_end:
                try:
                    hook()
                except Exception:
                    log.exception("a hook of transaction %d's end failed", tx_id)
        if error is not None and not isinstance(error, ClosedError):
            self._ended[tx_id] = error
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)

    def not_open(self, tx_id: int, what: str = "") -> TinystoreError:
        """The error for a call on transaction ``tx_id`` that is not open: why it ended, when it timed out
        lately (``TimeoutError_`` naming ``tx_idle`` or ``tx_max``), else ``ClosedError``. ``what`` prefixes the
        message (``"channel c: "``)."""
        why = self._ended.get(tx_id)
        if why is not None:
            return type(why)(f"{what}{why.message}", **why.extra)
        return ClosedError(f"{what}transaction {tx_id} is not open (it ended, timed out, or belongs to another client)")

    def next_tx_id(self) -> int:
        self._tx_ids += 1
        return self._tx_ids

    async def open(
        self, name: str, migrations: Sequence[tuple[str, str]] = (), *, create: bool = True, why: str = ""
    ) -> tuple[SqlDatabase, list[str]]:
        """Open (creating, unless ``create`` is False) database ``name`` and apply new migrations; returns it and
        the names applied.

        Raises ``InvalidError`` (bad name, a migration that fails), ``ConflictError`` (an applied migration
        whose text changed), ``ClosedError`` (the engine is closing), ``UnavailableError`` (``create`` False and no
        file: the message starts with ``why``). A database already open gets only its new migrations applied.
        """
        check_name("database", name)
        check_migrations(name, migrations)
        room_by = self.loop.time() + ROOM_WAIT  # (see _room_for)
        lock = self._opening.get(name)
        if lock is None:
            lock = self._opening[name] = _NameLock()
        lock.users += 1
        try:
            await lock.acquire()
        except BaseException:
            self._let_go(name, lock, held=False)
            raise
        held = True  # released when this returns, or once a start whose caller was cancelled has ended
        try:
            db = self.databases.get(name)
            if db is None:
                closing = self._closing.get(name)
                if closing is not None:  # closed as unused a moment ago: its threads end first
                    await asyncio.shield(closing[1])
                if self.closed:
                    raise ClosedError(f"database {name}: the store is stopping")
                own = name.startswith(RESERVED_DB_PREFIX)
                if not own:
                    # (the store's own databases, tinystore-jobs, are not counted: trial EX, with every queue in an
                    # application database the jobs database took one of Limits.databases for good)
                    await self._room_for(name, room_by)
                # (its connections: the writer, the readers, the loop's own for short reads; about 2 files each,
                # some opened at the first read; those opening beside it count whole)
                self.check_descriptors(name, database_files(self.limits.readers))
                path = self.directory / f"{name}.db"
                existed = path.exists()
                if not existed and not create:
                    # (known low: a queue's database moved away was made again, empty, by the queue's load: an
                    # offline `tinystore status` left an app.db that the moved file could no longer go back over)
                    raise UnavailableError(
                        f"{why}database {name} is missing: no file {path} (moved or deleted? put it back, or "
                        "restore a backup)"
                    )
                db = SqlDatabase(self, name, path)
                db.stats.update(self._unused_closed.get(name, {}))  # (its counters go on from where they were)
                if not own:
                    self._admitted.add(db)  # (counted against Limits.databases until it is open or failed)
                self._starting += 1
                self._opening_dbs.add(db)
                start = asyncio.ensure_future(asyncio.to_thread(db.start, migrations))
                start.add_done_callback(functools.partial(self._one_started, db))
                try:
                    applied = await asyncio.shield(start)
                except asyncio.CancelledError:
                    # the thread goes on applying the migrations: the next open of this database waits for it
                    # (else it would apply them a second time), then finds the database open (it stays admitted
                    # until then: see _started_unseen)
                    held = False
                    start.add_done_callback(functools.partial(self._started_unseen, db, lock))
                    raise
                except BaseException as exc:
                    self._admitted.discard(db)
                    if isinstance(exc, TinystoreError) and not existed:
                        if db.applied_before_failure == 0 or _empty_file(path):
                            # made by this open, whose first migration failed (or that failed before any, a full
                            # disk): leave no file with nothing in it
                            for suffix in ("", "-wal", "-shm"):
                                path.with_name(path.name + suffix).unlink(missing_ok=True)
                    raise
                self._admitted.discard(db)
                if self.closed:  # the store began to stop meanwhile, and its close did not see this database
                    db.close()
                    raise ClosedError(f"database {name}: the store is stopping")
                self.databases[name] = db
                self._unused_closed.pop(name, None)
                self._sweep_soon()
                return db, applied
            if not migrations:
                return db, []
            # in a task of its own: a cancel of the caller leaves the migrations going on, each to its commit or
            # rollback (trial GQ: cancelled as it took the writer, a migration's transaction, given a year of
            # tx_idle, was left open and held every write of the database for good); the next open waits for them
            migrating = asyncio.ensure_future(self._migrate_open(db, migrations))
            self._migrating.add(migrating)
            migrating.add_done_callback(self._migrating.discard)
            try:
                return db, await asyncio.shield(migrating)
            except asyncio.CancelledError:
                caller = asyncio.current_task()
                if migrating.cancelled() and (caller is None or not caller.cancelling()):
                    # ended by the store's close, not by a cancel of the caller (trial GR)
                    raise ClosedError(f"database {name}: the store is stopping") from None
                if not migrating.done():
                    held = False
                    migrating.add_done_callback(functools.partial(self._migrated_unseen, db.name, lock))
                raise
        finally:
            if held:
                self._let_go(name, lock)

    def _let_go(self, name: str, lock: _NameLock, held: bool = True) -> None:
        """An open of ``name`` is over: ``lock`` is released (when ``held``), and forgotten once no open holds it
        or waits for it (trial GU: each name whose open failed kept its lock for the server's life)."""
        if held:
            lock.release()
        lock.users -= 1
        if lock.users == 0 and self._opening.get(name) is lock:
            del self._opening[name]

    # -- closing the databases no call uses (trial EM: each kept its threads and files for the server's life, and
    # Limits.databases counted every database opened since the start)

    def _sweep_soon(self) -> None:
        idle = self.limits.database_idle
        if self._sweep_timer is None and not self.closed:
            self._sweep_timer = self.loop.call_later(min(SWEEP_MAX, max(SWEEP_MIN, idle / 4)), self._sweep)

    def _seen_now(self) -> float:
        """Marks each database a call used since the last look as used now; returns the loop's time."""
        now = self.loop.time()
        for db in self.databases.values():
            if db.uses != db.uses_seen:
                db.uses_seen = db.uses
                db.quiet_since = now
        return now

    def _sweep(self) -> None:
        """Closes the databases no call used for ``Limits.database_idle`` (and in which nothing runs or waits:
        :meth:`SqlDatabase.closable`). The next call of one opens it again."""
        self._sweep_timer = None
        if self.closed:
            return
        now = self._seen_now()
        unused = [
            db
            for db in self.databases.values()
            if now - db.quiet_since >= self.limits.database_idle and self._unused(db)
        ]
        if unused:
            log.info(
                "closed %d database%s no call used for %gs (%s): opened again at the next call",
                len(unused),
                "" if len(unused) == 1 else "s",
                self.limits.database_idle,
                ", ".join(db.name for db in unused[:8]) + (", ..." if len(unused) > 8 else ""),
            )
            self._close_unused(unused)
        if self.databases:
            self._sweep_soon()

    async def _room_for(self, name: str, deadline: float) -> None:
        """Room to open database ``name`` under ``Limits.databases``, counting those whose open runs (trial EU: a
        burst of calls on 120 databases closed as unused opened them all at once, past a limit of 20): when there
        is none, the one a call used the longest ago of those not in use is closed; when each is in use, the open
        waits in line, first come first served (trial EV: opens that came later took the room first), until
        ``deadline`` (loop time: :data:`ROOM_WAIT` seconds after the call came, so that opens of one name queued
        behind each other do not wait that long each), then raises ``LimitError``; ``ClosedError`` when the store
        stops meanwhile."""
        line = self._room_line
        if not line and self._has_room():
            return
        ticket = object()
        line.append(ticket)
        try:
            while not (line[0] is ticket and self._has_room()):
                if self.closed:
                    raise ClosedError(f"database {name}: the store is stopping")
                now = self.loop.time()
                if now >= deadline:
                    limit = self.limits.databases
                    opening = f" and {len(self._admitted)} opening" if self._admitted else ""
                    raise LimitError(
                        f"database {name}: the store has {self._counted()} databases open{opening}, the most it "
                        f"may (Limits.databases, {limit}: each holds a writer thread, {self.limits.readers} readers "
                        f"and their files), and none was done with in the {ROOM_WAIT:g}s this call waited (each had a "
                        "call or a transaction under way, or a queue's jobs in it); one no call uses is closed to "
                        "make room",
                        limit=limit,
                        wanted=self._counted() + len(self._admitted) + 1,
                    )
                await asyncio.sleep(min(ROOM_POLL, deadline - now))
        finally:
            line.remove(ticket)
        if self.closed:
            raise ClosedError(f"database {name}: the store is stopping")

    def _has_room(self) -> bool:
        """Whether one more database may open under ``Limits.databases``, once one unused is closed if need be."""
        return self._counted() + len(self._admitted) < self.limits.databases or self._close_one_unused()

    def _counted(self) -> int:
        """The open databases ``Limits.databases`` counts: the application's (not the store's own, ``tinystore-…``)."""
        return sum(1 for name in self.databases if not name.startswith(RESERVED_DB_PREFIX))

    def _close_one_unused(self) -> bool:
        """At ``Limits.databases``: closes the database a call used the longest ago of those in which nothing runs
        or waits; whether there was one."""
        self._seen_now()
        unused = [db for db in self.databases.values() if self._unused(db)]
        if not unused:
            return False
        db = min(unused, key=operator.attrgetter("quiet_since"))
        log.info("closed database %s, unused, to open another (Limits.databases, %d)", db.name, self.limits.databases)
        self._close_unused([db])
        return True

    def _unused(self, db: SqlDatabase) -> bool:
        """:meth:`SqlDatabase.closable`, and no open of it under way (one applying new migrations to it)."""
        lock = self._opening.get(db.name)
        return (lock is None or not lock.locked()) and db.closable()

    def _close_unused(self, dbs: list[SqlDatabase]) -> None:
        for db in dbs:
            del self.databases[db.name]
            self._unused_closed[db.name] = dict(db.stats)
            inline, db._inline = db._inline, None  # (on the loop, which alone reads with it)
            if inline is not None:
                with contextlib.suppress(sqlite3.Error):
                    inline.close()
            db.close()
        ended = asyncio.ensure_future(asyncio.to_thread(_join_all, dbs))
        ended.add_done_callback(functools.partial(self._closing_ended, dbs))
        for db in dbs:
            self._closing[db.name] = (db, ended)

    def _closing_ended(self, dbs: list[SqlDatabase], ended: asyncio.Future[None]) -> None:
        if not ended.cancelled() and ended.exception() is not None:
            log.error("closing unused databases failed", exc_info=ended.exception())
        for db in dbs:
            if self._closing.get(db.name, (None,))[0] is db:
                del self._closing[db.name]

    def _one_started(self, db: SqlDatabase, _: asyncio.Future[Any]) -> None:
        self._starting -= 1
        self._opening_dbs.discard(db)

    def _started_unseen(self, db: SqlDatabase, lock: _NameLock, start: asyncio.Future[Any]) -> None:
        """The start of ``db`` whose opener was cancelled has ended: a started database is kept open (its
        migrations are applied; the next open finds it), or closed when the store is stopping; then the next open
        of the name may go on."""
        try:
            if not start.cancelled() and start.exception() is None:
                if self.closed:
                    db.close()
                else:
                    self.databases[db.name] = db
        finally:
            self._admitted.discard(db)
            self._let_go(db.name, lock)

    def _migrated_unseen(self, name: str, lock: _NameLock, migrating: asyncio.Future[list[str]]) -> None:
        """The new migrations of open database ``name`` whose caller was cancelled have ended: what failed is
        logged (nobody waits for it now), and the next open of the name may go on."""
        try:
            exc = None if migrating.cancelled() else migrating.exception()
            if exc is not None and not isinstance(exc, ClosedError):
                log.warning("database %s: migrations whose caller was cancelled failed: %s", name, exc)
        finally:
            self._let_go(name, lock)

    async def _migrate_open(self, db: SqlDatabase, migrations: Sequence[tuple[str, str]]) -> list[str]:
        """New migrations for a database already open: in name order, each in its own transaction (SQL-05), as at
        open. A migration that fails leaves nothing of itself; those before it stay applied."""
        known = {r[0]: r[1] for r in (await db.read(f"select name, text from {MIGRATIONS_TABLE}", [])).rows}
        if sum(map(len, known.values())) + sum(len(text) for _, text in migrations) > BIG_MIGRATIONS:
            # (their texts are read as SQLite reads them: a second for some MB, not on the loop; trial GA)
            await asyncio.to_thread(check_migration_renames, db.name, known, migrations)
        else:
            check_migration_renames(db.name, known, migrations)
        check_migration_order(db.name, known, migrations)  # (after: a rename is told as one, trial IH)
        applied: list[str] = []
        for name, text in sorted(migrations, key=lambda m: m[0]):
            if name in known:  # applied: checked without taking the writer
                if not same_migration(known[name], text):
                    raise ConflictError(
                        f"database {db.name}: migration {name} was applied with another text; "
                        "an applied migration must not change (add a new one instead)"
                    )
                continue
            tx = await db.begin(owner=None, migration=True)
            try:
                try:
                    before = await _run_fk_in(tx, _fk_state())
                    stmt = ""
                    for stmt in _migration_statements(text):  # (as at open: see SqlDatabase._migrate)
                        await tx.exec(stmt, [])
                    await _run_fk_in(tx, _orphans_check(before, await _run_fk_in(tx, _fk_state(with_rows=False))))
                except TinystoreError as exc:
                    raise migration_error(db.name, name, _placeholder_named(exc, stmt)) from None
                await tx.exec(
                    f"insert into {MIGRATIONS_TABLE} (name, text, applied_at) values (?, ?, ?)",
                    [name, text, int(time.time() * 1000)],
                    own=True,
                )
                await tx.commit()
            except BaseException:
                await tx.rollback()
                raise
            applied.append(name)
        return applied

    def exists(self, name: str) -> bool:
        """Whether database ``name`` is open or has its file (``DIR/sql/<name>.db``)."""
        return name in self.databases or (self.directory / f"{name}.db").exists()

    def get(self, name: str) -> SqlDatabase:
        db = self.databases.get(name)
        if db is None:
            check_name("database", name)
            raise InvalidError(f"database {name} is not open (call store.database({name!r}) first)")
        return db

    def status(self) -> dict[str, Any]:
        """Each database of the store, by name, with the same keys whether it is open or not (trial EP): ``path``;
        ``open``; ``closed_as_unused`` (not open now because no call used it for ``Limits.database_idle``: opened
        again at its next call); ``bytes`` (its file's size; ``None`` when it cannot be read); ``writes``,
        ``commits``, ``reads``, ``reads_moved`` (inline reads that ran over their budget and moved to a reader
        thread), ``transactions``, ``connections_recycled`` (replaced after statements that grew them): counted
        since the store started (on across a close as unused), each ``None`` when it was not open since;
        ``open_transactions``, ``None`` when it is not open; and ``broken``:
        why it takes no more writes until the store restarts (a commit the file system failed), else ``None``."""
        counters = ("writes", "commits", "reads", "reads_moved", "transactions", "connections_recycled")
        out: dict[str, Any] = {}
        for name, db in self.databases.items():
            out[name] = {
                "path": str(db.path),
                "open": True,
                "closed_as_unused": False,
                "bytes": _size(db.path),
                **{k: db.stats[k] for k in counters},
                "open_transactions": sum(1 for t in self.transactions.values() if t.db is db),
                "broken": db.broken,
            }
        try:
            files = sorted(self.directory.glob("*.db"))
        except OSError:
            files = []
        for path in files:
            name = path.name[: -len(".db")]
            if name not in out and NAME.fullmatch(name) is not None:
                size = _size(path)
                if size is None:
                    continue
                out[name] = {
                    "path": str(path),
                    "open": False,
                    "closed_as_unused": name in self._unused_closed,
                    "bytes": size,
                    **{k: self._unused_closed[name][k] if name in self._unused_closed else None for k in counters},
                    "open_transactions": None,
                    "broken": None,
                }
        return out

    async def close(self, timeout: float = 10.0) -> None:
        """Close every database (see :meth:`SqlDatabase.close`) and wait for their threads: up to ``timeout``
        seconds for the work queued to be done, then what still runs is interrupted (:meth:`SqlDatabase.halt`)
        and waited for. Returns only once no thread of the engine has a database file open (trial DZ: a stop let
        the directory go while a migration still ran and then committed, under a new owner). A later :meth:`open`
        raises ``ClosedError``. Cancelled, the threads are left to end on their own."""
        self.closed = True
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        closing: list[asyncio.Future[Any]] = [ended for _, ended in self._closing.values()]
        # (new migrations of open databases under way end as their database closes, each with its own error: "the
        # store stopped while the statement ran", not a cancel)
        closing += list(self._migrating)
        # (and those whose start still runs, their migrations at open: told to stop once started, if they start)
        dbs = self.every_database()
        for db in dbs:
            db.close()
        if not await asyncio.to_thread(self.join, dbs, timeout):
            log.warning(
                "stopping: statements of %s still ran at the grace's end: interrupted and rolled back",
                ", ".join(db.name for db in dbs if db.busy()) or "a database",
            )
            for db in dbs:
                db.halt()
            waited = 0.0
            while not await asyncio.to_thread(self.join, dbs, HALT_WAIT):
                waited += HALT_WAIT
                log.warning(
                    "stopping: a statement of %s still runs %gs after it was interrupted (a wait for another process "
                    "that holds the database's write lock, which SQLite does not cut short; a COMMIT's fsync on a "
                    "disk that does not answer?); waiting for it before letting the directory go",
                    ", ".join(db.name for db in dbs if db.busy()),
                    waited,
                )
        await asyncio.gather(*closing, return_exceptions=True)  # (their threads ended: these end at once)

    def every_database(self) -> list[SqlDatabase]:
        """The databases open, those whose start runs, and those closing as unused (a list of the moment)."""
        return [*self.databases.values(), *self._opening_dbs, *(db for db, _ in self._closing.values())]

    def busy(self) -> bool:
        """Whether a thread of a database (or a database's start) still runs."""
        return any(db.busy() for db in self.every_database())

    def cut_calls(self) -> None:
        """Interrupt the statements every database runs for clients' calls (see :meth:`SqlDatabase.cut_calls`)."""
        for db in self.every_database():
            db.cut_calls()

    def halt(self) -> None:
        """Interrupt what every database runs and would run (see :meth:`SqlDatabase.halt`)."""
        for db in self.every_database():
            db.halt()

    @staticmethod
    def join(dbs: list[SqlDatabase], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the threads of ``dbs`` to end (blocking: from a thread); whether
        they all have."""
        deadline = time.monotonic() + timeout
        ended = True
        for db in dbs:
            ended = db.join(max(0.0, deadline - time.monotonic())) and ended
        return ended
