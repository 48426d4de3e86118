"""The jobs engine: durable job queues whose jobs are rows in SQLite.

A job is a row of ``_tinystore_jobs``, in the store's own jobs database (``DIR/sql/tinystore-jobs.db``) or in
an application database, so that adding a job can commit with the application's own rows (JOB-06). The
options of every queue are kept in the jobs database (``_tinystore_queues``), so every process that opens a
queue runs it with the same options.

The server is the one place that claims, so the engine keeps, for each queue it has loaded, an index in
memory of the jobs that have not ended: the due ones per tenant and priority (first in, first out), the
delayed ones in a heap by due time, the running ones with their lease. Scheduling decisions (which job goes
to which waiting worker, fairness, ``max_running`` and ``max_running_per_tenant``) are taken in memory; every
change of state is one ``UPDATE … RETURNING`` on the database's writer, guarded by the job's state and its
attempt fence, so a late or repeated report never changes a job twice (JOB-08). The attempt ends asked for in
one loop turn go to the writer as one statement (each row still guarded by its own fence), and so do the single
adds of one turn; a claim takes as many due jobs as the worker has free slots, after the turn's adds and ends
have reached the index.

The index costs about 250 bytes of memory per job that has not ended (a queue's backlog of a million jobs is
about 250 MB), and a queue loads it from its rows at its first use after a start (about 5 s per million).

Nothing polls. A worker's claim waits in the queue's line of waiters; the engine hands it jobs when one is
added, comes due (a clock timer at the earliest due time), or when a running job ends and frees a slot. A job
added while a claim waits is handed to it as its insert goes to the writer: the claim's write follows the insert
in the same commit, so an idle worker starts a new job after one fsync rather than two.

- Claim: the chosen jobs become ``running`` with ``attempts + 1`` (the attempt counts before the handler
  runs, JOB-03) and a fence above the last (and at least the store's epoch) in one write; the lease starts
  then. A lease runs out ``lease`` after the claim or the last renewal; then the attempt failed with "worker
  lost" and the job is retried (or dead) (JOB-01). Attempts claimed by the store's own process (an embedded
  store's workers) have no lease: that process cannot die apart from the store, and a store restart finds them
  running and gives them a lease.
- Fairness (JOB-07): a higher priority first; among the tenants whose best due job has that priority, the
  tenant served least recently (a counter per tenant, bumped at each claim); tenants at
  ``max_running_per_tenant`` are skipped, and nobody is served while ``max_running`` jobs run.
- Backoff (JOB-03): ``min(cap, first × 3^(n-1)) × uniform(0.8, 1.0)`` after failed attempt ``n``.
- Events (JOB-10, JOB-11): each state change, progress and stuck report is published on the channel
  ``tinystore-jobs`` under ``(queue, job_id)`` through the ``publish`` function given to the engine.

Time is the store's :class:`~tinystore.clock.Clock` (seconds since the Unix epoch; the rows keep integer
milliseconds), so tests move backoffs, leases, stuck reports and ``keep`` with a test clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import math
import random
import re
import shlex
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from ..clock import Clock
from ..durations import format_seconds
from ..errors import (
    ClosedError,
    CorruptError,
    InvalidError,
    LimitError,
    PermissionDeniedError,
    TinystoreError,
    UnavailableError,
)
from ..limits import Limits
from ..names import RESERVED_DB_PREFIX, check_name
from ..protocol.jobs import (
    ADD_MAX,
    CANCEL_PUSH,
    DELAY_MAX_MS,
    ENDED,
    EVENTS_CHANNEL,
    KEY_MAX,
    PRIORITY_MAX,
    RUN_AT_MAX_MS,
    STATES,
    TEXT_MAX,
    Attempt,
    CancelRun,
    Claim,
    Claimed,
    ErrorEntry,
    JobEvent,
    JobRow,
    NewJob,
    Options,
    Page,
    QueueInfo,
    Report,
    check_job_id,
    check_list,
    check_options,
    check_step_name,
)
from ..protocol.jobs import OPTION_NAMES as _OPTION_NAMES
from ..protocol.jobs import (
    List as ListRequest,
)
from ..protocol.sql import Done, Rows
from ..protocol.values import json_problem, shown, valid_text
from . import gc_hold
from .base import Peer
from .jobs_index import (
    CLAIMING,
    DELAYED,
    ENDING,
    GONE,
    INSERTING,
    READY,
    RUNNING,
    UNWRITTEN,
    Entry,
    JobQueue,
    Waiter,
)
from .sql import Later, SqlDatabase, SqlEngine, SqlTx, row_cost

__all__ = ["JOBS_DB", "JobsEngine", "QueueOptions", "backoff_delay"]

log = logging.getLogger("tinystore.jobs")

R = TypeVar("R")

#: seconds after a failed deletion of the jobs ended more than ``keep`` ago before it is tried again
SWEEP_RETRY = 60.0

JOBS_DB = "tinystore-jobs"
"""The store's own jobs database (``DIR/sql/tinystore-jobs.db``)."""
TABLE = "_tinystore_jobs"
QUEUES = "_tinystore_queues"
ERROR_MAX = 2000
"""Longer error texts are cut to this many characters."""
TRACEBACK_MAX = 4000
"""Longer tracebacks are cut to their last this many characters (the innermost frames and the error's line)."""
ERRORS_KEPT = 50
"""How many failed attempts a job's history keeps (the newest)."""
ERRORS_TRIM_BYTES = 64 * 1024
"""A history longer than this (its JSON) is trimmed to :data:`ERRORS_KEPT` after the attempt that made it so."""
CHUNK = 400
"""Jobs per INSERT statement (13 parameters each stays far below SQLite's bound)."""
TURN_JOBS = 2000
"""The jobs of a big add checked, or indexed once committed, in one turn of the event loop (some 5 ms)."""
INT_MAX = PRIORITY_MAX
STEPS_VALUES = 8
"""A job's steps together hold at most this many times ``Limits.job_value_bytes`` (8 MiB by default)."""
CLAIMS_KEPT = 10_000
CLAIM_KEPT_FOR = 300.0
CLAIMED_KEPT = 100_000
"""How many answered claims (at most), holding how many attempts in all (at most), and for how long (seconds),
``jobs.release_claim`` can still hand back (a claim holds up to 1,000 attempts: without the second cap, 10,000
of them could keep 10 million)."""
END_SPENT_AT_ONCE = 256
"""How many spent jobs a configure that lowers ``attempts`` ends at once (see ``JobsEngine._end_spent``)."""

END_CHUNK = 400
"""Attempt ends per statement (10 parameters each)."""


def _errors_with(entry: str) -> str:
    """SQL for a job's error history (column ``errors``) with ``entry`` (the attempt's JSON, or null for none) added,
    cut to its newest :data:`ERRORS_KEPT` when its JSON passes :data:`ERRORS_TRIM_BYTES` (characters, as the
    history and the entry are long: no JSON is read to tell), in the same statement: trimmed in a write after it,
    a read in between saw one too many (trial CQ). The history is read once in the common cases (under the size,
    or under :data:`ERRORS_KEPT` entries, or cut by its oldest one); only one longer than that from before (or of
    many small entries) takes the general cut (trial CT: an expression per entry made an end 25 times slower)."""
    old = "coalesce(errors, '[]')"
    added = f"json_insert({old}, '$[#]', json({entry}))"
    return (
        f"case when {entry} is null then errors "
        f"when length({old}) + length({entry}) < {ERRORS_TRIM_BYTES} then {added} "
        f"when json_array_length({old}) < {ERRORS_KEPT} then {added} "
        f"when json_array_length({old}) = {ERRORS_KEPT} then json_remove({added}, '$[0]') "
        f"else (select json_group_array(json(value)) from json_each({added}) "
        f"where key > json_array_length({old}) - {ERRORS_KEPT}) end"
    )


END_MANY = (
    "with v(v_id, v_fence, v_state, v_run_at, v_error, v_entry, v_result, v_progress, v_finished, v_uncount) "
    f"as (values {{marks}}) update {TABLE} set state = v_state, run_at = coalesce(v_run_at, run_at), "
    f"error = coalesce(v_error, error), errors = {_errors_with('v_entry')}, result = coalesce(v_result, result), "
    "progress = coalesce(v_progress, progress), finished_at = v_finished, attempts = attempts - v_uncount, "
    "lease_until = null from v where id = v_id and fence = v_fence and state = 'running' "
    "returning id, attempts, progress, error"
)
"""Attempts' ends in one statement (a row of ten parameters each: see ``JobsEngine._write_ending``), each guarded
by its fence (JOB-08)."""
END_ONE = END_MANY.format(marks="(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
"""One attempt's end."""

SCHEMA = (
    f"""create table if not exists {TABLE} (
        id text primary key,
        queue text not null,
        key text,
        tenant text not null default '',
        user text,
        type text,
        priority integer not null default 0,
        state text not null,
        attempts integer not null default 0,
        fence integer not null default 0,
        value text not null,
        progress text,
        result text,
        error text,
        errors text,
        steps text,
        run_at integer not null,
        created_at integer not null,
        started_at integer,
        finished_at integer,
        lease_until integer,
        stuck_fence integer
    ) without rowid""",
    f"create unique index if not exists {TABLE}_key on {TABLE} (queue, key) where key is not null",
    f"create index if not exists {TABLE}_state on {TABLE} (queue, state, id)",
    f"create index if not exists {TABLE}_queue on {TABLE} (queue, id)",
    f"create index if not exists {TABLE}_ended on {TABLE} (queue, finished_at) "
    "where state in ('succeeded', 'dead', 'cancelled')",
)
_UNREADABLE = (UnavailableError, CorruptError)
"""What a queue whose database is missing or not a database raises: listed with its error, the others read."""
QUEUE_TABLES = "_tinystore_queue_tables"
"""In the store's jobs database: the queues whose tables the store made in their application database, so that a
file replaced or emptied since is told as such, not made anew without a word (trial FS)."""
QUEUES_SCHEMA = (
    f"create table if not exists {QUEUES} (name text primary key, options text not null, created_at integer not null)",
    f"create table if not exists {QUEUE_TABLES} (name text primary key)",
)
ROW_BYTES = (
    "length(cast(value as blob)) + coalesce(length(cast(result as blob)), 0) + "
    "coalesce(length(cast(steps as blob)), 0) + coalesce(length(cast(errors as blob)), 0) + "
    "coalesce(length(cast(progress as blob)), 0) + coalesce(length(cast(error as blob)), 0) + 256"
)
"""About how many bytes a job's row takes in a page (its large texts, and some for the rest)."""
COLUMNS = (
    "id, queue, state, attempts, fence, value, key, tenant, user, type, priority, progress, result, error, "
    "errors, steps, run_at, created_at, started_at, finished_at"
)
ROW_COST = row_cost(COLUMNS.count(",") + 1)
"""What a job's row costs against ``sql_result_bytes`` beyond its bytes (the SQL engine counts it so)."""

_OUTCOMES = frozenset({"succeeded", "error", "fail", "snooze"})


_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode
_msgpack = msgspec.msgpack.Encoder()


def _note_written(
    chunk: list[list[Any]], written: list[list[Any]], found: dict[str, str], insert: asyncio.Future[Done]
) -> None:
    """An insert of ``chunk`` in a transaction was answered: note its rows and the ids it returned (see
    :meth:`JobsEngine.add`); a failed one wrote nothing (its error is its caller's)."""
    if insert.cancelled() or insert.exception() is not None:
        return
    written.extend(chunk)
    found.update(JobsEngine._returned(insert.result().rows))


def backoff_delay(attempt: int, first: float, cap: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): ``min(cap, first × 3^(n-1))`` times a random
    factor in ``[0.8, 1.0)``, so never above the cap and still random at it (JOB-03)."""
    exp = min(attempt - 1, 64)
    base = min(cap, first * (3.0**exp))
    return base * (0.8 + 0.2 * rand())


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """A queue's options, all set. Durations in seconds; ``max_running*``: 0 means no limit."""

    database: str
    attempts: int
    backoff_first: float
    backoff_cap: float
    lease: float
    timeout: float
    expected: float
    max_running: int
    max_running_per_tenant: int
    keep: float

    def to_wire(self) -> Options:
        return Options(
            database=self.database,
            attempts=self.attempts,
            backoff_first_ms=round(self.backoff_first * 1000),
            backoff_cap_ms=round(self.backoff_cap * 1000),
            lease_ms=round(self.lease * 1000),
            timeout_ms=round(self.timeout * 1000),
            expected_ms=round(self.expected * 1000),
            max_running=self.max_running,
            max_running_per_tenant=self.max_running_per_tenant,
            keep_ms=round(self.keep * 1000),
        )


# a claim answered this much (seconds) after it was asked for (behind a long transaction, or made by a timer of a
# test clock's advance) writes its rows' started_at again, as the time its attempt counts from
START_SLACK = 0.5


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Take a finished future's outcome, so that asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        exc = fut.exception()
        if exc is not None and not isinstance(exc, ClosedError):
            log.debug("jobs: an opening ended with the store: %s", exc)


def _merge(limits: Limits, o: Options) -> QueueOptions:
    def secs(ms: int | None, default: float) -> float:
        return default if ms is None else ms / 1000

    return QueueOptions(
        database=o.database or JOBS_DB,
        attempts=o.attempts if o.attempts is not None else limits.job_attempts,
        backoff_first=secs(o.backoff_first_ms, limits.job_backoff_first),
        backoff_cap=secs(o.backoff_cap_ms, limits.job_backoff_cap),
        lease=secs(o.lease_ms, limits.job_lease),
        timeout=secs(o.timeout_ms, limits.job_timeout),
        expected=secs(o.expected_ms, limits.job_expected),
        max_running=o.max_running or 0,
        max_running_per_tenant=o.max_running_per_tenant or 0,
        keep=secs(o.keep_ms, limits.job_keep),
    )


def _now_ms(clock: Clock) -> int:
    return clock.now_ms()


class _JobName:
    """``queue Q: job I of N`` (``queue Q: the job`` for one), as text only when an error is made of it."""

    __slots__ = ("i", "n", "queue")

    def __init__(self, queue: str, i: int, n: int) -> None:
        self.queue, self.i, self.n = queue, i, n

    def __str__(self) -> str:
        return f"queue {self.queue}: job {self.i + 1} of {self.n}" if self.n > 1 else f"queue {self.queue}: the job"


def _ms(when: float) -> int:
    return math.floor(when * 1000)


def _when_text(ms: int) -> str:
    """A time in epoch milliseconds as ISO 8601 (UTC) where it is one, else as epoch seconds in full."""
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return f"{ms / 1000:.3f} (epoch seconds)"


def _cut_traceback(text: str | None) -> str | None:
    """A traceback as kept: at most its last ``TRACEBACK_MAX`` characters (``…`` first when cut), as :func:`_cut`
    keeps text SQLite can store; ``None`` for none or one that is not a str."""
    if not isinstance(text, str) or not text:
        return None
    if len(text) > TRACEBACK_MAX:
        text = "…" + text[-(TRACEBACK_MAX - 1) :]
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


def _cut(text: str) -> str:
    """An error text as kept: at most ``ERROR_MAX`` characters, and text SQLite can store (a lone surrogate, which
    a Python exception's message may hold, becomes an escape)."""
    if not isinstance(text, str):
        text = repr(text)
    if len(text) > ERROR_MAX:
        text = text[: ERROR_MAX - 1] + "…"
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


_LONG_INT = re.compile(r"\d{19}")
"""A run of digits that may be an integer past 64 bits (JSON text without one holds none)."""


class _Ids:
    """Job ids: 26 characters of Crockford base32, 48 bits of milliseconds then 80 random bits, so they sort by
    creation time and never repeat in practice (ids stay unique across the queues and databases of a store).
    The layout of a ULID: the 128 bits after two zero bits, five bits a character, most significant first."""

    ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"

    def __init__(self) -> None:
        self.last_ms = -1
        self.last_rand = 0

    def new(self, ms: int) -> str:
        if ms <= self.last_ms:
            ms = self.last_ms
            rand = self.last_rand + 1
        else:
            rand = random.getrandbits(80)
        self.last_ms, self.last_rand = ms, rand
        n = ((ms & 0xFFFF_FFFF_FFFF) << 80) | (rand & ((1 << 80) - 1))
        # 130 bits (two zero bits, then the 128 of n): thirteen pairs of characters, ten bits each
        pairs = _PAIRS
        return "".join([pairs[(n >> shift) & 1023] for shift in _SHIFTS])


_PAIRS = [a + b for a in _Ids.ALPHABET for b in _Ids.ALPHABET]
_SHIFTS = tuple(range(120, -1, -10))


LOAD_SLICE = 10_000
"""Jobs a queue's load reads in one page, and indexes in one turn of the event loop (some 20 ms)."""
LOAD_PAGE = (
    "select id, tenant, priority, run_at, state, attempts, fence, started_at, lease_until, {stuck} "
    f"from {TABLE} indexed by {TABLE}_queue where queue = ? and id > ? and state in ('queued', 'failed', "
    "'running') order by id limit ?"
)
"""One page of a queue's jobs that have not ended, after the id given, in the order of their ids. Through the index
``(queue, id)``, so that each page goes on where the last one ended, whatever SQLite's statistics say (through
the index of states, each page would sort all the jobs left). ``{stuck}``: ``stuck_fence``, or ``null`` in a table
made before that column was (:data:`STUCK_COLUMN`)."""
STUCK_COLUMN = f"alter table {TABLE} add column stuck_fence integer"
"""The column that keeps which attempt of a job was reported stuck (its fence), so that a next server does not
report it again (JOB-11: once); added to a table made before it was, as its queue loads."""
HAS_STUCK_COLUMN = f"select count(*) from pragma_table_info('{TABLE}') where name = 'stuck_fence'"
MARK_STUCK = f"update {TABLE} set stuck_fence = ? where id = ? and fence = ? and state = 'running'"


def _overdue_at(started_at: float, options: QueueOptions, lease: float | None = None) -> float:
    """When an attempt started at ``started_at`` ends whatever its worker says: its timeout and a lease more. The
    worker cancels its handler at the timeout and reports the attempt failed; a handler that does not stop
    (it swallows the cancel, it blocks the thread) would otherwise keep its job running, its lease renewed, for
    ever (JOB-01). Renewals never carry a lease past this; the attempt then ends failed, "timed out"."""
    return started_at + options.timeout + (options.lease if lease is None else lease)


async def _written(write: asyncio.Future[Any]) -> None:
    """A write of the engine's own that nobody waits for, as a coroutine for :meth:`JobsEngine._track` (its failure
    logged; a cancel at close leaves the writer to do it or not)."""
    await asyncio.shield(write)


async def _column_added(write: asyncio.Future[Any]) -> None:
    """:data:`STUCK_COLUMN`'s write: one made by another queue's load meanwhile is no failure (trial CY: each
    queue loading at once logged an error)."""
    try:
        await asyncio.shield(write)
    except InvalidError as exc:
        if "duplicate column" not in exc.message:
            raise


def _settle(w: Waiter) -> None:
    """The cancelled claim of ``w`` has landed and handed back what it got (see :meth:`JobsEngine.claim`)."""
    if w.settled is not None and not w.settled.done():
        w.settled.set_result(None)


class JobsEngine:
    """The job queues of one store.

    ``sql``: the store's SQL engine (the jobs live in its databases). ``clock``: the one clock. ``limits``:
    defaults and bounds (``job_*``). ``publish(channel, branch, payload)``: hands a job event (MessagePack of a
    :class:`~tinystore.protocol.jobs.JobEvent`) to the channels engine, or ``None`` while there is none.
    ``spawn(coro)``: starts a task the store owns.
    """

    def __init__(
        self,
        sql: SqlEngine,
        clock: Clock,
        limits: Limits,
        *,
        publish: Callable[[str, tuple[str, ...], bytes], object] | None = None,
        listened: Callable[[str, tuple[str, ...]], bool] | None = None,
        spawn: Callable[[Any], asyncio.Task[Any]] | None = None,
        epoch: int = 0,
    ) -> None:
        self.sql = sql
        # the least fence a claim of this start gives: the store's epoch (ms, larger at each start), so that a
        # store started from a backup gives every job a fence above those the original gave after the copy (a
        # claim is a durable commit: a job's fence grows by far less than one a millisecond; trial AX saw the
        # restored store give fence 1 again, while the original's attempt 1 still ran and renewed)
        self.fence_floor = epoch
        # kept: self.loop makes a getpid system call each time on Python 3.11
        self.loop = sql.loop
        self.clock = clock
        self.limits = limits
        self.publish = publish
        self.listened = listened
        self._spawn = spawn or asyncio.ensure_future
        self.queues: dict[str, JobQueue] = {}
        self._loading: dict[str, asyncio.Future[JobQueue]] = {}
        self._load_errors: dict[str, str] = {}  # queue → why its load at the start failed (shown by status)
        self._options: dict[str, QueueOptions] = {}
        # the options this engine wrote last for each queue (configure): what the store keeps, whatever a read of
        # the options under way meanwhile gives
        self._configured: dict[str, QueueOptions] = {}
        self._configure_lock = asyncio.Lock()
        self._jobs_db: asyncio.Future[SqlDatabase] | None = None
        self._ids = _Ids()
        self.closed = False
        self.stopping = False
        self.stuck_reports = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._claims: OrderedDict[str, tuple[float, list[Attempt]]] = OrderedDict()
        self._claims_timer: asyncio.TimerHandle | None = None  # forgets them once kept long enough (_forget_claims)
        self._claiming: dict[str, Waiter] = {}  # token → a claim whose write is on its way
        self._claimed_kept = 0  # attempts in _claims

    # ------------------------------------------------------------------------------------------- setup

    async def jobs_db(self) -> SqlDatabase:
        """The store's jobs database, opened (and its tables made) at first use. Raises ``ClosedError`` once the
        engine is closed, and what opening the database raises (the next call tries again)."""
        fut = self._jobs_db
        if fut is None:
            if self.closed:
                raise ClosedError("jobs: the store is stopping")
            # a task of its own, shielded: a caller's cancel does not stop the opening others wait for
            # (close cancels it and retrieves its outcome)
            fut = self._jobs_db = asyncio.ensure_future(self._open_jobs_db())
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if fut.done() and (fut.cancelled() or fut.exception() is not None) and self._jobs_db is fut:
                self._jobs_db = None
            raise

    async def _open_jobs_db(self) -> SqlDatabase:
        db, _ = await self.sql.open(JOBS_DB)
        for stmt in QUEUES_SCHEMA + SCHEMA:
            await db.write(stmt, [], own=True)
        return db

    async def start(self) -> None:
        """Load every queue the store knows, so that leases, due times and ``keep`` run before anyone asks."""
        if not (self.sql.directory / f"{JOBS_DB}.db").exists():
            return
        delay = 1.0
        while not self.closed:
            try:
                db = await self.jobs_db()
                rows = (await db.read(f"select name from {QUEUES}", [])).rows
            except ClosedError:
                return
            except (TinystoreError, OSError) as exc:
                # the jobs database cannot be opened now (a full disk, out of file descriptors): try again, so
                # that leases, due times and keep run once it can; a client that opens a queue meanwhile tries too
                why = exc.message if isinstance(exc, TinystoreError) else str(exc)
                log.error("jobs: cannot load the queues: %s; trying again in %gs", why, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            for (name,) in rows:
                if self.closed:
                    return
                await self._load_quietly(name)
            return

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` as a task the engine owns: cancelled at close, and what it raises is logged (never left
        for "Task exception was never retrieved"). Returns the task."""
        task = self._spawn(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tracked_done)
        return task

    async def _to_its_end(self, coro: Coroutine[Any, Any, R]) -> R:
        """Await ``coro`` run in a task the engine owns: a cancel of the caller leaves it going on to its end (a
        write, and what must follow its commit: the index, the job's event, a running handler told), and what it
        raises then is logged (trial GQ: a retry cancelled after its commit left a job queued that no worker could
        see, nor cancel or retry; a cancel cancelled so never told the running handler)."""
        task = self._spawn(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if task.cancelled() and (caller is None or not caller.cancelling()):
                # ended by the engine's close, not by a cancel of the caller (trial GR: the caller got a bare
                # CancelledError, which a TaskGroup took for its own and swallowed)
                raise ClosedError("jobs: the store is stopping") from None
            if not task.done():
                task.add_done_callback(self._orphan_done)
            raise

    def _orphan_done(self, task: asyncio.Task[Any]) -> None:
        """A task of :meth:`_to_its_end` whose caller was cancelled has ended: what it raised is logged, an error
        of the call itself (a bad option, say) quietly, as nobody waits for it now."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, TinystoreError) or self.closed:
            log.debug("jobs: a call whose caller was cancelled ended with: %s", exc)
        else:
            log.error("jobs: a call whose caller was cancelled failed: %s", exc, exc_info=exc)

    def _tracked_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, ClosedError) or self.closed:
            log.debug("jobs: a background write ended with the store: %s", exc)
        else:
            log.error("jobs: a background write failed: %s", exc, exc_info=exc)

    async def _stored_options(self, name: str) -> QueueOptions | None:
        opts = self._configured.get(name) or self._options.get(name)
        if opts is not None:
            return opts
        db = await self.jobs_db()
        row = (await db.read(f"select options from {QUEUES} where name = ?", [name], "one")).rows
        if not row:
            return None
        given = _json_decode(row[0][0], type=Options)
        opts = _merge(self.limits, given)
        self._options[name] = opts
        return opts

    def _merged(self, name: str, given: Options) -> QueueOptions:
        """``given`` with the limits' defaults for what it leaves out; ``InvalidError`` for a backoff whose first
        delay is above its cap."""
        merged = _merge(self.limits, given)
        if merged.backoff_first > merged.backoff_cap:
            raise InvalidError(f"queue {name}: option backoff: the first delay is above the cap")
        if merged.expected >= merged.timeout and given.expected_ms is not None:
            # allowed (a queue whose jobs should never be reported stuck), but most often a slip: a doc's example
            # gave expected="2m" with the default timeout of 1 min (trial BL). Said only of an expected given (trial
            # CD: a queue given only a short timeout was warned of the default expected, in every process)
            log.warning(
                "queue %s: expected (%s) is not below timeout (%s): a handler is cancelled at its timeout, so no job "
                "of this queue is ever reported stuck (give a longer timeout, or a shorter expected)",
                name,
                format_seconds(merged.expected),
                format_seconds(merged.timeout),
            )
        return merged

    async def open_queue(self, name: str, given: Options) -> QueueInfo:
        """Open queue ``name`` with the options the caller gave (``None`` fields: not given).

        The first open of a queue keeps its options (given ones, the rest from the limits) in the jobs
        database; a later open whose given options differ from the kept ones raises ``InvalidError`` naming the
        option. Also ``InvalidError`` for a bad name or an option out of bounds; ``PermissionDeniedError`` for a
        ``database`` named like the store's own (``tinystore-…``, but for the jobs database).
        """
        self._check_open()
        check_name("queue", name)
        check_options(name, given)
        if given.database is not None:
            try:
                check_name("database", given.database)
            except InvalidError as exc:
                raise InvalidError(f"queue {name}: option database: {exc.message}") from None
            if given.database.startswith(RESERVED_DB_PREFIX) and given.database != JOBS_DB:
                # (trial Z: a queue made such a database, which store.database() refuses to make)
                raise PermissionDeniedError(
                    f"queue {name}: option database: {given.database} starts with {RESERVED_DB_PREFIX!r}, kept for "
                    f"the store's own databases; a queue's jobs live in {JOBS_DB} (the default) or in an "
                    "application database"
                )
        stored = await self._stored_options(name)
        if stored is None:
            merged = self._merged(name, given)
            if merged.database != JOBS_DB:
                # kept with the queue for good (its jobs will live there): a slip, "ap" for "app", left the queue
                # bound to a database that never was, every later open refused (trial GV). Opened, not looked for:
                # an open of it under way is waited for (trial GX: a first open that failed removed the file the
                # queue had seen)
                try:
                    await self.sql.open(merged.database, create=False)
                except UnavailableError:
                    if self.sql.exists(merged.database):
                        raise
                    raise InvalidError(
                        f"queue {name}: option database: there is no database {merged.database} in this store (make "
                        f"it first: store.database({merged.database!r}); a queue's database is kept with it and never "
                        "changes)"
                    ) from None
            db = await self.jobs_db()
            await db.write(
                f"insert into {QUEUES} (name, options, created_at) values (?, ?, ?) on conflict (name) do nothing",
                [name, _json_encode(merged.to_wire()).decode(), _now_ms(self.clock)],
                own=True,
            )
            self._options.pop(name, None)
            stored = await self._stored_options(name)
            assert stored is not None
        kept = stored.to_wire()
        for fname in Options.__struct_fields__:
            want = getattr(given, fname)
            if want is not None and want != getattr(kept, fname):
                have = getattr(kept, fname)
                label = _OPTION_NAMES[fname]
                if fname.endswith("_ms"):  # as a duration is written: "6d", "1m30s"
                    want, have = format_seconds(want / 1000), format_seconds(have / 1000)
                elif fname.startswith("max_running"):  # 0 is kept for no limit, which the caller wrote as None
                    want, have = (v if v else "None (no limit)" for v in (want, have))
                raise InvalidError(
                    f"queue {name}: option {label} is {want} here but the store keeps {have} for this queue "
                    f"(every process must open a queue with the same options{self._configure_hint(name, given, kept)})"
                )
        q = self.queues.get(name)
        if q is None:
            # its jobs load (after a start: seconds for hundreds of thousands): the open does not wait, nor do the
            # reads of its rows (trial CA: a web page polling a job waited 3.4 s after each restart); the calls
            # that need the index (add, claim, ...) do. The counts are those of the loaded index: none yet
            self._track(self._load_quietly(name))
            return QueueInfo(queue=name, options=kept)
        return self._info(q)

    async def _load_quietly(self, name: str) -> None:
        """:meth:`_queue`, its failure logged (the next call that needs the queue loads it again, and raises)."""
        try:
            await self._queue(name)
        except ClosedError:
            pass
        except TinystoreError as exc:
            # once for each new reason (trial HP: a queue whose database file was gone logged this at every call of
            # a client that polled it); the calls themselves raise it each time
            if self._load_errors.get(name) != exc.message:
                log.error("jobs: queue %s could not be loaded: %s", name, exc.message)
            self._load_errors[name] = exc.message

    def _configure_hint(self, name: str, given: Options, kept: Options) -> str:
        """How a deploy changes the options the store keeps to those ``given``: the command line's ``tinystore
        jobs DIR configure`` with each option that differs (a queue's database cannot change)."""
        if given.database is not None and given.database != kept.database:
            return ""
        flags: list[str] = []
        for fname in ("attempts", "lease_ms", "timeout_ms", "expected_ms", "keep_ms"):
            want = getattr(given, fname)
            if want is not None and want != getattr(kept, fname):
                flag = "--" + fname.removesuffix("_ms")
                flags.append(f"{flag} {want}" if fname == "attempts" else f"{flag} {format_seconds(want / 1000)}")
        first, cap = given.backoff_first_ms, given.backoff_cap_ms
        if (first is not None and first != kept.backoff_first_ms) or (cap is not None and cap != kept.backoff_cap_ms):
            first = kept.backoff_first_ms if first is None else first
            cap = kept.backoff_cap_ms if cap is None else cap
            flags.append(f"--backoff {format_seconds((first or 0) / 1000)},{format_seconds((cap or 0) / 1000)}")
        for fname in ("max_running", "max_running_per_tenant"):
            want = getattr(given, fname)
            if want is not None and want != getattr(kept, fname):
                flags.append(f"--{fname.replace('_', '-')} {want}")  # 0: no limit, as the command line writes it
        directory = shlex.quote(str(self.sql.directory.parent))
        # (trial FV: to an old process of a deploy that changed them, that alone said to undo the deploy)
        return (
            f"; to change what the store keeps: tinystore jobs {directory} configure {name} {' '.join(flags)}; or, "
            "if the store's are the ones now meant (changed by a deploy), give this process those options"
        )

    async def configure(self, name: str, given: Options) -> QueueInfo:
        """Change the options the store keeps for queue ``name`` (``None`` fields: kept as they are): what a
        deploy that changes ``attempts``, ``lease`` or a limit needs, since every process must open a queue with
        the options the store keeps. Applies at once to this store's index (limits, leases of later claims,
        retries of later failures); attempts already running keep the lease and timeout they were given.

        Raises ``InvalidError``: the queue does not exist, an option out of bounds, a backoff whose first delay
        is above its cap, or a change of ``database`` (the jobs' rows live there)."""
        self._check_open()
        check_name("queue", name)
        check_options(name, given)
        return await self._to_its_end(self._configure(name, given))

    async def _configure(self, name: str, given: Options) -> QueueInfo:
        # one configure at a time: each reads the kept options, changes the given ones and writes them all, so two
        # at once would each undo the other's change (trial AB)
        async with self._configure_lock:
            stored = await self._stored_options(name)
            if stored is None:
                raise InvalidError(f"queue {name} does not exist (open it with store.queue({name!r}, ...) first)")
            kept = stored.to_wire()
            if given.database is not None and given.database != kept.database:
                raise InvalidError(
                    f"queue {name}: option database cannot change (its jobs live in database {kept.database})"
                )
            changed = msgspec.structs.replace(
                kept, **{f: getattr(given, f) for f in Options.__struct_fields__ if getattr(given, f) is not None}
            )
            merged = self._merged(name, changed)
            # (from the options kept, not the index's: a queue still loading takes the new ones at its load's end,
            # and would see no change; trial CE)
            lowered = merged.attempts < stored.attempts
            db = await self.jobs_db()
            await db.write(
                f"update {QUEUES} set options = ? where name = ?",
                [_json_encode(merged.to_wire()).decode(), name],
                own=True,
            )
            # (a read of the options or a load of the queue already under way may have read them before this write:
            # they take these instead, see _stored_options and _load)
            self._configured[name] = merged
        q = self.queues.get(name)
        if q is None:
            q = await self._queue(name)
        before, q.options = q.options, self._configured[name]
        if q.options.expected != before.expected:
            # the running attempts' stuck reports come at the new expected time (trial BQ: at the old one, while
            # the list already showed them stuck); one due later than its old time is put off in _on_stuck
            for e in list(q.entries.values()):
                if e.where == RUNNING and not e.stuck:
                    q.stuck_at.push(e.started_at + q.options.expected, (e, e.fence))
        if q.options.keep != before.keep:
            self._arm_sweep(q, self.clock.now())  # ended jobs past the new keep go now (trial BQ: at the next end)
        if lowered:
            await self._end_spent(q)
        self._pump_soon(q)
        return self._info(q)

    async def _end_spent(self, q: JobQueue) -> None:
        """The jobs waiting for a retry that have made as many attempts as the queue now allows end ``dead``, as
        they would have after their last attempt with these options (trial CD: lowered to stop retries against
        a service that is down, they ran once more each, ``2/1``). Their last error stays theirs."""
        limit = q.options.attempts
        await self._end_all_spent(
            q, [e for e in q.entries.values() if e.where in (READY, DELAYED) and e.attempts >= limit]
        )

    async def _end_loaded_spent(self, q: JobQueue) -> None:
        """End ``dead`` the waiting jobs the load of ``q`` set aside as spent (``q.spent_at_load``); those a
        configure during the load gave more attempts are placed to run (trial CK: a configure that raised the count
        meanwhile was answered, and they all ended dead all the same)."""
        spent, q.spent_at_load = q.spent_at_load, []
        await self._end_all_spent(q, spent, unplaced=True)

    async def _end_all_spent(self, q: JobQueue, entries: list[Entry], unplaced: bool = False) -> None:
        """:meth:`_end_if_spent` of each of ``entries``, a few hundred at once (their writes share group commits;
        50,000 at once stalled the loop 0.8 s). ``unplaced``: entries the load set aside, in no line of the index:
        those no longer spent are placed."""
        for i in range(0, len(entries), END_SPENT_AT_ONCE):
            chunk = entries[i : i + END_SPENT_AT_ONCE]
            ended = await asyncio.gather(*(self._end_if_spent(q, e) for e in chunk))
            if unplaced:
                q.place_loaded(
                    [e for e, done in zip(chunk, ended, strict=True) if done is None and q.entries.get(e.id) is e]
                )

    def _attempts_now(self, q: JobQueue) -> int:
        """The attempts ``q`` allows now: a configure's while the queue still loads (it takes them at the end)."""
        return (self._configured.get(q.name) or q.options).attempts

    async def _answer_after(self, ending: Coroutine[Any, Any, bool], out: asyncio.Future[bool]) -> None:
        """Await ``ending``, then give ``out`` ``True`` whatever came of it (an attempt's end was written)."""
        try:
            await ending
        finally:
            if not out.done():
                out.set_result(True)

    async def _end_if_spent(self, q: JobQueue, e: Entry, then: asyncio.Future[bool] | None = None) -> bool | None:
        """End the waiting job ``e`` ``dead`` if it has made as many attempts as the queue allows (after its
        write under way, if one is); then ``then`` (if given) gets ``True``, whatever came of it. Returns ``True``
        when it ended, ``False`` when its row had moved on (it is placed as it is), ``None`` when it was not
        spent or is no longer waiting (nothing done)."""
        try:
            while e.busy is not None:
                await asyncio.shield(e.busy)
            if e.where in (READY, DELAYED) and q.entries.get(e.id) is e and e.attempts >= self._attempts_now(q):
                return await self._end_waiting(q, e, "dead", _now_ms(self.clock))
            return None
        finally:
            if then is not None and not then.done():
                then.set_result(True)

    async def load(self, name: str) -> None:
        """Load queue ``name`` (already opened): in an application database, its jobs tables are made now, behind
        any transaction that holds the writer (this does not wait for them)."""
        await self._queue(name)

    def loaded_in(self, name: str, database: str) -> bool:
        """Whether queue ``name`` is loaded, its jobs in application database ``database``."""
        q = self.queues.get(name)
        return q is not None and q.db.name == database

    async def _queue(self, name: str) -> JobQueue:
        q = self.queues.get(name)
        if q is not None:
            return q
        self._check_open()
        fut = self._loading.get(name)
        if fut is None:
            fut = asyncio.ensure_future(self._load(name))
            self._loading[name] = fut
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done() and self._loading.get(name) is fut:
                del self._loading[name]

    async def _where(self, name: str) -> tuple[QueueOptions, SqlDatabase, bool, bool]:
        """Queue ``name``'s options, its database, whether its tables are made there, and whether the store noted
        that it made them (:data:`QUEUE_TABLES`). Raises ``InvalidError`` for a queue the store does not know, and
        ``UnavailableError`` for tables the store made that are gone (the file replaced or emptied)."""
        opts = await self._stored_options(name)
        if opts is None:
            check_name("queue", name)
            raise InvalidError(f"queue {name} does not exist (open it with store.queue({name!r}, ...) first)")
        if opts.database == JOBS_DB:
            return opts, await self.jobs_db(), True, True
        db, _ = await self.sql.open(opts.database, create=False, why=f"queue {name}: its jobs' ")
        db.pinned = True  # the queue's jobs are there: never closed as unused (see SqlEngine._sweep)
        made = bool(
            (
                await db.read(
                    "select count(*) from sqlite_master where type = 'index' and name = ?", [f"{TABLE}_ended"], "scalar"
                )
            ).rows[0][0]
        )
        jobs = await self.jobs_db()
        marked = bool(
            (await jobs.read(f"select count(*) from {QUEUE_TABLES} where name = ?", [name], "scalar")).rows[0][0]
        )
        if marked and not made:
            raise UnavailableError(
                f"queue {name}: its jobs' tables are missing from database {opts.database}, where the store made them: "
                f"was its file ({opts.database}.db) replaced or emptied? Its jobs are not made anew without a word: "
                "put the file back (a copy of `tinystore backup`, say), or, to begin the queue anew, stop the store, "
                f"delete the file, and let store.database({opts.database!r}) make it anew"
            )
        return opts, db, made, marked

    async def forget_tables(self, names: list[str]) -> None:
        """Queues ``names``' database was made anew (its file was missing) by the application's own open: their
        tables are made there anew too (trial FB), not told missing."""
        jobs = await self.jobs_db()
        for name in names:
            await jobs.write(f"delete from {QUEUE_TABLES} where name = ?", [name], own=True)

    async def _mark_made(self, name: str) -> None:
        """Note that queue ``name``'s tables are made in its application database (see :data:`QUEUE_TABLES`)."""
        jobs = await self.jobs_db()
        mark = f"insert into {QUEUE_TABLES} (name) values (?) on conflict (name) do nothing"
        await jobs.write(mark, [name], own=True)

    async def _load(self, name: str) -> JobQueue:
        # In an application database, the tables are made without waiting for the writer: an application
        # transaction may hold it, and may be the very one adding this queue's first job (it then makes them
        # itself, see add()). Every later write of the engine queues behind these on the writer.
        opts, db, made, marked = await self._where(name)
        q = JobQueue(self, name, opts, db)
        if not made:
            q.schema = asyncio.gather(*(db.write(stmt, [], own=True) for stmt in SCHEMA))

            def schema_done(f: asyncio.Future[Any]) -> None:
                if not f.cancelled() and f.exception() is None and not self.closed:
                    self._track(self._mark_made(name))

            q.schema.add_done_callback(schema_done)
        else:
            if not marked:  # (made by a version before the note, or by an application's transaction: noted now)
                self._track(self._mark_made(name))
            await self._load_jobs(q, db)
        if self.closed:
            raise ClosedError("jobs: the store is stopping")
        # a configure that wrote while this load ran: its options, not the ones read at the load's start (trial Z:
        # a configure during the load at a store's start was stored, answered with the old options, and the queue
        # ran with them until the next start)
        q.options = self._configured.get(name, q.options)
        self._load_errors.pop(name, None)
        if q.spent_at_load:
            await self._end_loaded_spent(q)  # (before the queue is used: its callers see them dead)
        self.queues[name] = q
        if not made:
            return q
        oldest = await db.read(
            f"select min(finished_at) from {TABLE} where queue = ? and state in ('succeeded', 'dead', 'cancelled')",
            [name],
            "scalar",
        )
        if oldest.rows and oldest.rows[0][0] is not None:
            self._arm_sweep(q, oldest.rows[0][0] / 1000 + q.options.keep)
        return q

    async def _load_jobs(self, q: JobQueue, db: SqlDatabase) -> None:
        """Index the jobs of ``q`` that have not ended, read in pages of :data:`LOAD_SLICE` in the order of their ids
        (a queue of a million jobs loads in seconds, and other clients' calls go on meanwhile: each page is
        indexed in one turn of the loop, while a reader reads the next). Nothing else writes the queue's jobs
        while it loads: every call of the queue waits for its load. Raises ``ClosedError`` when the store stops
        meanwhile, and what a read raises."""
        name, opts = q.name, q.options
        now = q.loaded_at = self.clock.now()
        has_stuck = bool((await db.read(HAS_STUCK_COLUMN, [], "scalar")).rows[0][0])
        if not has_stuck:
            # a table made before the column was: added behind the writes under way (an application's transaction
            # may hold its database's writer: nothing waits for it), ahead of any stuck report's
            self._track(_column_added(db.write(STUCK_COLUMN, [], own=True)))
        load_page = LOAD_PAGE.format(stuck="stuck_fence" if has_stuck else "null")
        page: asyncio.Future[Rows] | None = db.read(load_page, [name, "", LOAD_SLICE], unlimited=True)
        gc_held = contextlib.ExitStack()
        holding = False
        try:
            while page is not None:
                rows = (await page).rows
                page = None
                if len(rows) == LOAD_SLICE:
                    page = db.read(load_page, [name, rows[-1][0], LOAD_SLICE], unlimited=True)
                    if not holding:
                        holding = True
                        gc_held.enter_context(gc_hold.held())  # a big queue: see gc_hold
                waiting: list[Entry] = []
                for jid, tenant, priority, run_at, state, attempts, fence, started_at, lease_until, stuck in rows:
                    e = Entry(jid, tenant, priority, run_at / 1000, attempts=attempts, fence=fence)
                    q.entries[jid] = e
                    if state != "running":
                        if attempts >= opts.attempts:
                            # it has made as many attempts as allowed (lowered by a configure that ended only some
                            # before its store stopped: trial CH): ended once loaded (see _end_loaded_spent), never
                            # placed where a claim could take it
                            e.where = DELAYED
                            q.spent_at_load.append(e)
                        else:
                            waiting.append(e)
                        continue
                    e.where = RUNNING
                    e.counted = True
                    e.started_at = (started_at or 0) / 1000
                    # the lease it was given, whatever a configure since (its worker renews at a third of that
                    # one): the claim wrote started_at and lease_until a lease apart (trial AR: a lease shortened,
                    # then a restart, and a renewing worker lost its attempt)
                    given = (lease_until - started_at) / 1000 if lease_until is not None and started_at else 0.0
                    e.lease = given if given > 0 else opts.lease
                    if lease_until is None:
                        # claimed by a worker inside the process that owned the store before (no lease there):
                        # that process is gone, and so is the attempt. It ends "worker lost" at once, not a lease
                        # later
                        e.lease_until = now
                    else:
                        e.lease_until = max(lease_until / 1000, now + e.lease)
                    # the timeout it was given is not kept: it gets the queue's, and a whole one from now at least
                    # (a configure that shortened the timeout while it ran must not end it at once)
                    e.overdue_at = max(_overdue_at(e.started_at, opts, e.lease), _overdue_at(now, opts, e.lease))
                    q.running[tenant] = q.running.get(tenant, 0) + 1
                    q.running_total += 1
                    q.leases.push(e.lease_until, (e, fence))
                    # (reported stuck by a server before: not again, JOB-11)
                    e.stuck = stuck == fence
                    # a whole expected time from now as well, as its timeout (trial IA: each restart reported every
                    # attempt under way stuck at once, the time the store was down counted as the attempt's)
                    q.stuck_at.push(max(e.started_at, now) + opts.expected, (e, fence))
                q.place_loaded(waiting)
                if page is not None:
                    # (the queue is not in self.queues yet; a deadline of an entry indexed already may fire, as
                    # after)
                    await asyncio.sleep(0)
                    if self.closed:
                        raise ClosedError("jobs: the store is stopping")
        finally:
            gc_held.close()
            if page is not None:
                if page.done():
                    page.cancelled() or page.exception()  # (retrieved: the error that ended the load is told)
                else:
                    page.cancel()

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("jobs: the store is stopping")

    def _on_due(self, q: JobQueue, e: Entry) -> None:
        if e.where == DELAYED and q.entries.get(e.id) is e:
            if e.run_at > self.clock.now():
                q.delayed.push(e.run_at, e)
                return
            q.place(e)
            self._pump(q)

    def _pump(self, q: JobQueue) -> None:
        """Hand due jobs to waiting claims, first come first served, as far as the limits allow."""
        while q.waiters:
            w = q.waiters[0]
            if w.fut.done():
                q.waiters.popleft()
                continue
            picked: list[Entry] = []
            while len(picked) < w.n:
                e = q.pick(w.due_before)
                if e is None:
                    break
                picked.append(e)
            if not picked:
                return
            q.waiters.popleft()
            w.claiming = True
            if w.token:
                self._claiming[w.token] = w
            self._claim(q, w, picked)

    def _pump_soon(self, q: JobQueue) -> None:
        """:meth:`_pump` once the callbacks ready now have run: the adds and ends written in one commit all reach the
        index first, so a waiting claim takes them in one write rather than one job at a time."""
        if not q.pump_soon:
            q.pump_soon = True
            self.loop.call_soon(self._pump_later, q)

    def _pump_later(self, q: JobQueue) -> None:
        q.pump_soon = False
        if not self.closed:
            self._pump(q)

    # ------------------------------------------------------------------------------------------- claims

    def _claim(self, q: JobQueue, w: Waiter, picked: list[Entry]) -> None:
        now = self.clock.now()
        local = bool(getattr(w.peer, "local", False))
        lease_until = math.inf if local else now + q.options.lease
        marks = ", ".join("?" for _ in picked)
        fut = q.db.write(
            f"update {TABLE} set state = 'running', attempts = attempts + 1, fence = max(fence + 1, ?), "
            f"started_at = ?, lease_until = ? where id in ({marks}) and state in ('queued', 'failed') "
            "returning id, fence, attempts, value, steps, tenant, key, type, user, priority, progress, error",
            [self.fence_floor, _ms(now), None if local else _ms(lease_until), *(e.id for e in picked)],
            own=True,
        )
        fut.add_done_callback(lambda f: self._claimed(q, w, picked, local, f, now))

    def _claimed(
        self, q: JobQueue, w: Waiter, picked: list[Entry], local: bool, f: asyncio.Future[Any], asked: float
    ) -> None:
        if f.cancelled() or f.exception() is not None:
            err = ClosedError("jobs: the claim was cancelled") if f.cancelled() else f.exception()
            for e in picked:
                if e.where == CLAIMING:
                    e.counted = False
                    q.count(e, -1)
                    if e.unwritten == UNWRITTEN:  # placed early, and its row was not written either
                        q.unserve(e)
                        e.where = GONE
                        if q.entries.get(e.id) is e:
                            del q.entries[e.id]
                        continue
                    q.place(e, front=True)
            if not w.fut.done():
                w.fut.set_exception(err or ClosedError("jobs: the claim failed"))
            self._claim_over(w)
            self._pump(q)
            return
        done = f.result()
        # The lease and the ``expected`` time count from now, when the claim took effect, not from when it was asked
        # for: a claim that waited for the writer behind a long transaction would otherwise start with its lease
        # used up, and every attempt would end "worker lost" (the row's lease_until, written with the claim, is only
        # read by a restart, which gives a running attempt at least a whole lease anyway). A claim made by a timer of
        # a test clock's advance counts from the advance's end too, as its worker's handler and timeout do, which
        # start once the advance is over (trial EV: counted from the timer's time, its lease and timeout ended
        # before the worker's own timeout, and the attempt was ended "timed out" while its handler had not run it)
        now = self.clock.now()
        if now - asked > START_SLACK and done.rows:
            # the rows say when the attempt counts from, as its deadlines do (trial EX: a job claimed by a timer of
            # a test clock's advance was listed stuck, by its started_at, 30 s before it was reported stuck)
            marks = ", ".join("?" for _ in done.rows)
            fix = q.db.write(
                f"update {TABLE} set started_at = ? where id in ({marks}) and state = 'running' and started_at = ?",
                [_ms(now), *(r[0] for r in done.rows), _ms(asked)],
                own=True,
            )
            fix.add_done_callback(_retrieve)
        # an attempt of this process's own worker has no lease, but ends at its hard deadline (see _overdue_at)
        overdue_at = _overdue_at(now, q.options)
        lease_until = overdue_at if local else now + q.options.lease
        got: list[Claimed] = []
        by_id = {e.id: e for e in picked}
        waited_ms = round((self.loop.time() - w.asked) * 1000) if w.asked else None
        for jid, fence, attempts, value, steps, tenant, key, type_, user, priority, progress, error in done.rows:
            e = by_id.pop(jid)
            e.where = RUNNING
            e.fence = fence
            e.attempts = attempts
            e.started_at = now
            e.lease_until = lease_until
            e.overdue_at = overdue_at
            e.lease = q.options.lease
            e.peer = w.peer
            e.stuck = False
            q.leases.push(lease_until, (e, fence))
            q.stuck_at.push(now + q.options.expected, (e, fence))
            prog = _json_decode(progress) if progress else None
            # (the event carries the job's error as its row keeps it: an earlier attempt's, trial IW)
            self._event(q, "state", jid, "running", prog, attempts, error)
            self._notify(q, jid)
            if e.cancel_queued:
                continue  # its cancel is already on its way: nobody runs it
            got.append(
                Claimed(
                    id=jid,
                    fence=fence,
                    attempt=attempts,
                    value=value,
                    steps=_json_decode(steps) if steps else {},
                    lease_ms=round(q.options.lease * 1000),
                    timeout_ms=round(q.options.timeout * 1000),
                    tenant=tenant,
                    key=key,
                    type=type_,
                    user=user,
                    priority=priority,
                    progress=prog,
                    waited_ms=waited_ms,
                )
            )
        for e in by_id.values():  # the row was not claimable after all: forget it
            if e.counted:
                e.counted = False
                q.count(e, -1)
            if e.unwritten:
                q.unserve(e)  # (placed early: nothing ran, the turn was not taken)
            e.where = GONE
            if q.entries.get(e.id) is e:
                del q.entries[e.id]
        if w.fut.done():  # the claim was given up meanwhile: hand the jobs back
            if got:
                handing = self._track(self.release(q.name, [Attempt(c.id, c.fence) for c in got]))
                handing.add_done_callback(lambda t: self._claim_over(w))
            else:
                self._claim_over(w)
        elif not got and not w.expired:
            # (every job it took was placed early and not written after all: it waits on, first in line)
            w.claiming = False
            q.waiters.appendleft(w)
            self._claim_over(w)
        else:
            w.fut.set_result(got)
            if w.token and got:
                self._remember(w.token, [Attempt(c.id, c.fence) for c in got])
            self._claim_over(w)
        self._pump(q)

    def _claim_over(self, w: Waiter) -> None:
        """The claim of ``w`` has landed, and when it was given up meanwhile, has handed back what it got: a
        ``release_claim`` of its token, which waits while it is in ``_claiming``, goes on (from the CI run of
        4a90b2d: taken out as the write landed, a hand-back by token that came during the claim's own hand-back
        answered 0 at once, and the caller saw its jobs running)."""
        if w.token and self._claiming.get(w.token) is w:
            del self._claiming[w.token]
        _settle(w)
        w.settled = None  # (a claim that waits on, first in line, may be under way again: a new one then)

    def _remember(self, token: str, attempts: list[Attempt]) -> None:
        """Keep what claim ``token`` got for a while, in case its answer never reaches the caller."""
        now = time.monotonic()
        claims = self._claims
        while claims and (
            len(claims) >= CLAIMS_KEPT
            or self._claimed_kept + len(attempts) > CLAIMED_KEPT
            or next(iter(claims.values()))[0] < now - CLAIM_KEPT_FOR
        ):
            self._drop_oldest_claim()
        claims[token] = (now, attempts)
        self._claimed_kept += len(attempts)
        if self._claims_timer is None and not self.closed:
            self._claims_timer = self.loop.call_later(CLAIM_KEPT_FOR, self._forget_claims)

    def _drop_oldest_claim(self) -> None:
        self._claimed_kept -= len(self._claims.popitem(last=False)[1][1])

    def _forget_claims(self) -> None:
        """Forgets the claims kept :data:`CLAIM_KEPT_FOR`, with no new claim to do it (trial EM: an idle store kept
        its last 10,000 claims for ever); looks again when the oldest left is due."""
        self._claims_timer = None
        claims = self._claims
        now = time.monotonic()
        while claims and next(iter(claims.values()))[0] <= now - CLAIM_KEPT_FOR:
            self._drop_oldest_claim()
        if claims and not self.closed:
            due = next(iter(claims.values()))[0] + CLAIM_KEPT_FOR - now
            self._claims_timer = self.loop.call_later(max(due, 0.0) + 0.001, self._forget_claims)

    async def release_claim(self, queue: str, token: str) -> int:
        """Hand back the attempts that claim ``token`` got (those still unreported and current): for a caller whose
        claim was cancelled, or whose answer was lost. Returns how many were handed back. A claim whose write is on
        its way is waited for: it lands first, and a claim given up hands back what it got itself (a caller that
        gave up its claim then finds its jobs queued once this returns; trial AR saw them running a moment)."""
        w = self._claiming.get(token)
        if w is not None:
            if w.settled is None:
                w.settled = self.loop.create_future()
            await asyncio.shield(w.settled)
        entry = self._claims.pop(token, None)
        if entry is None:
            return 0
        self._claimed_kept -= len(entry[1])
        return await self.release(queue, entry[1])

    async def claim(self, peer: Peer, req: Claim) -> list[Claimed]:
        """Claim up to ``req.n`` due jobs of ``req.queue`` for ``peer``, waiting up to ``req.wait_ms`` (real time)
        for one. Returns the attempts (possibly none). Each is ``running``, its attempt counted.

        A cancel of this call (or :meth:`unwait`) gives the jobs back, unstarted and not counted, when the claim
        was already under way: the cancel ends once they are back (a claim's write on its way first lands).
        Raises ``InvalidError`` (bad queue or n), ``UnavailableError`` (the store is
        stopping: waiting claims end with it at once), ``ClosedError`` (stopped).
        """
        loop = self.loop
        asked = loop.time()  # (before the queue's load, which a claim after a start waits for: trial FD, the load's
        # time was left out of waited_ms, and a healthy worker dropped the claim's attempts as past their lease)
        q = await self._queue(req.queue)
        if self.stopping:
            raise UnavailableError("jobs: the store is stopping; claim again once it is back")
        if not 1 <= req.n <= 1000:
            raise InvalidError(f"queue {req.queue}: claim: n = {req.n} is not between 1 and 1000")
        w = Waiter(peer, req.n, req.worker, req.due_before_ms / 1000, loop.create_future(), req.token, asked=asked)
        q.waiters.append(w)
        self._pump(q)
        handle: asyncio.TimerHandle | None = None
        if not w.fut.done() and not w.claiming:
            if req.wait_ms <= 0:
                w.fut.set_result([])
            else:

                def timeout() -> None:
                    if not w.fut.done():
                        if w.claiming:
                            w.expired = True
                        else:
                            w.fut.set_result([])

                handle = loop.call_later(req.wait_ms / 1000, timeout)
        try:
            return await w.fut
        except asyncio.CancelledError:
            # Once the cancel is through, no job of this claim is running: a claim whose write has landed hands its
            # jobs back, one whose write is on its way waits for it to land and hands back what it got (so that a
            # worker's stop() returns with its jobs queued again, the status saying so). A second cancel ends the
            # wait, not the hand-back.
            if w.fut.done() and not w.fut.cancelled() and w.fut.exception() is None:
                got = w.fut.result()
                if got:
                    await asyncio.shield(self._track(self.release(q.name, [Attempt(c.id, c.fence) for c in got])))
            elif w.claiming:
                if w.settled is None:  # (a release_claim of its token may wait for it too)
                    w.settled = loop.create_future()
                await asyncio.shield(w.settled)
            raise
        finally:
            if handle is not None:
                handle.cancel()
            if not w.claiming:
                try:
                    q.waiters.remove(w)
                except ValueError:
                    pass

    def unwait(self, queue: str, worker: str) -> int:
        """End the waiting (not yet claiming) claims of ``worker`` on ``queue`` with no jobs; returns how many."""
        q = self.queues.get(queue)
        if q is None:
            return 0
        n = 0
        for w in list(q.waiters):
            if w.worker == worker and not w.claiming and not w.fut.done():
                w.fut.set_result([])
                n += 1
        return n

    def drop_peer(self, peer: Peer) -> None:
        """A client went away: its waiting claims end (its running attempts keep their lease)."""
        for q in self.queues.values():
            for w in list(q.waiters):
                if w.peer is peer and not w.claiming and not w.fut.done():
                    w.fut.set_exception(ClosedError("jobs: the client went away"))

    def renew(self, peer: Peer, queue: str, attempts: Sequence[Attempt]) -> list[str]:
        """Renew the leases of ``attempts`` held by ``peer``: each lasts ``lease`` from now. Returns the ids whose
        attempt is no longer current (its lease ran out, it was cancelled, or it ended): those are lost."""
        q = self.queues.get(queue)
        lost: list[str] = []
        now = self.clock.now()
        for a in attempts:
            e = q.entries.get(a.id) if q is not None else None
            if q is None or e is None or e.where not in (RUNNING, CLAIMING) or e.fence != a.fence or e.cancel_queued:
                lost.append(a.id)
                continue
            e.peer = peer
            was = e.lease_until
            hard = e.overdue_at if e.where == RUNNING else math.inf
            # the lease it was given, whatever a configure since (docs/jobs.md)
            e.lease_until = hard if peer.local else min(now + (e.lease or q.options.lease), hard)
            if e.lease_until < was and e.where == RUNNING:
                q.leases.push(e.lease_until, (e, e.fence))
        return lost

    def loaded(self, queue: str) -> bool:
        """Whether ``queue`` is loaded: its attempts are in the index, so :meth:`renew` can answer at once."""
        return queue in self.queues

    async def renew_loading(self, peer: Peer, queue: str, attempts: Sequence[Attempt]) -> list[str]:
        """:meth:`renew` for a queue not loaded yet (a store that just started loads its queues in the
        background): waits for the load, which gives the running attempts a fresh lease, so a renewal that comes
        first is not taken for a lost attempt. A queue the store does not have: every attempt is lost. Raises
        ``ClosedError`` when the store is stopping; a cancel leaves the load to go on for others."""
        try:
            await self._queue(queue)
        except InvalidError:
            return [a.id for a in attempts]
        return self.renew(peer, queue, attempts)

    def _on_lease(self, q: JobQueue, e: Entry, fence: int) -> None:
        if e.fence != fence or q.entries.get(e.id) is not e:
            return
        if self.stopping:
            # renewals are refused while the store stops: no lease ends then (trial CS: a stop longer than a lease
            # made a healthy worker's job "worker lost", dead with attempts=1); the attempt stays running in its
            # row, and the next start gives it a fresh lease
            return
        if e.where == ENDING:
            # its end is being written; should the write fail, the attempt runs on: look again a second later
            q.leases.push(max(e.lease_until, self.clock.now() + 1.0), (e, fence))
            return
        if e.where != RUNNING:
            return
        now = self.clock.now()
        if e.lease_until > now:
            q.leases.push(e.lease_until, (e, fence))
            return
        if e.lease_until >= e.overdue_at:  # renewed up to its end: its worker is there, its handler runs on
            why = (
                f"timed out: still running {now - e.started_at:.0f}s after it started, past its timeout and a lease "
                "more (a handler that does not stop when cancelled is ended so)"
            )
            log.warning("queue %s: job %s: attempt %d: %s", q.name, e.id, e.attempts, why)
        else:
            why = "worker lost"
            # a warning, as serving.md lists it (trial GX: a private server, which writes only its warnings, said
            # nothing of it)
            log.warning("queue %s: job %s: attempt %d: the lease ran out (worker lost)", q.name, e.id, e.attempts)
        peer = e.peer
        if peer is not None:
            peer.push(CANCEL_PUSH, CancelRun(queue=q.name, id=e.id, fence=fence, reason="lost"))
        # its end (and its retry's due time) is made now, at this timer's time: within a test clock's advance, a
        # task would run only once the advance is over (trial EV: the retry counted its backoff from there)
        try:
            ended = self._fail_now(q, e, why, None)
        except Exception as exc:
            ended = self.loop.create_future()
            ended.set_exception(exc)
        self._track(self._lease_ran_out(q, e, fence, ended))

    async def _lease_ran_out(self, q: JobQueue, e: Entry, fence: int, ended: asyncio.Future[bool]) -> None:
        """Wait for ``ended``, the end of a lost attempt as failed; when that write fails (not at close), try again
        a second later, so a lost attempt never stays running."""
        try:
            await ended
        except Exception as exc:
            if self.closed or isinstance(exc, ClosedError):
                return
            log.warning("queue %s: job %s: ending the lost attempt failed (%s); trying again", q.name, e.id, exc)
            q.leases.push(self.clock.now() + 1.0, (e, fence))

    def _on_stuck(self, q: JobQueue, e: Entry, fence: int) -> None:
        if e.fence != fence or e.stuck or q.entries.get(e.id) is not e:
            return
        # (an attempt this server loaded under way has a whole expected time from the load: see _load)
        due = max(e.started_at, q.loaded_at) + q.options.expected
        if self.clock.now() < due:  # (expected was made longer by a configure since this deadline was set)
            q.stuck_at.push(due, (e, fence))
            return
        if e.where == ENDING:
            q.stuck_at.push(self.clock.now() + 1.0, (e, fence))  # as in _on_lease
            return
        if e.where != RUNNING:
            return
        if e.lease_until <= max(due, q.loaded_at) or q.options.expected >= q.options.timeout:
            # its lease ran out before it was due to be stuck: its worker is lost, which _on_lease tells. By the due
            # time, not now (trial DA: one advance of a test clock past both skipped the report), but for an attempt
            # of an earlier server due before this one loaded it, by then (trial CA: the attempts of a process
            # killed with its embedded store were reported stuck at the next start, then ended "worker lost"); or
            # its queue's jobs are never stuck (a handler is cancelled at its timeout), though an attempt loaded at
            # a start has a whole timeout more from then
            return
        e.stuck = True
        ran = self.clock.now() - e.started_at

        def report(_: object) -> None:
            if self.closed:
                return
            q.stuck_reports += 1
            self.stuck_reports += 1
            log.warning(
                "queue %s: job %s is stuck: attempt %d has run %.0fs, past its expected %gs",
                q.name,
                e.id,
                e.attempts,
                ran,
                q.options.expected,
            )
            progress, error = self._progress_now(q, e)
            self._event(q, "stuck", e.id, "running", progress, e.attempts, error)
            self._notify(q, e.id)

        # kept in its row, so that a next server loading the attempt does not report it again (JOB-11: once); and
        # reported once kept (a CI run killed the server between the report and its mark, and the next server
        # reported it again), or once the mark failed (then a next server may report it again: better twice than
        # never)
        write = q.db.write(MARK_STUCK, [fence, e.id, fence], own=True)
        write.add_done_callback(report)
        self._track(_written(write))

    def _progress_now(self, q: JobQueue, e: Entry) -> tuple[Any, str | None]:
        """The progress and the error of running job ``e`` as its row holds them, for an event that tells the job's
        state (read on the loop, only when somebody listens for the job's events; ``None`` for what the read would
        not fit there)."""
        if self.publish is None or (self.listened is not None and not self.listened(EVENTS_CHANNEL, (q.name, e.id))):
            return None, None
        try:
            rows = q.db.read_now(f"select progress, error from {TABLE} where id = ?", [e.id], "one")
        except TinystoreError as exc:
            log.debug("queue %s: job %s: progress not read for its event: %s", q.name, e.id, exc)
            return None, None
        if rows is None or not rows.rows:
            return None, None
        progress, error = rows.rows[0]
        return (None if progress is None else _json_decode(progress)), error

    # ------------------------------------------------------------------------------------------- ends

    def _begin_write(self, e: Entry) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self.loop.create_future()
        e.busy = fut
        return fut

    def _end_write(self, e: Entry, fut: asyncio.Future[None]) -> None:
        if e.busy is fut:
            e.busy = None
        if not fut.done():
            fut.set_result(None)

    def _settle(self, q: JobQueue, e: Entry, state: str, run_at: float | None, ended_at: float) -> None:
        """The row of ``e`` is now ``state`` (its ``finished_at`` ``ended_at``, when it ended): move the index with
        it."""
        if e.counted:
            e.counted = False
            q.count(e, -1)
        e.peer = None
        if state in ENDED:
            e.where = GONE
            q.drop(e)
            # its keep counts from its finished_at, not from when the write was answered (trial EX: a job ended by a
            # timer of a test clock's advance was kept past keep, to the advance's end + keep)
            self._arm_sweep(q, ended_at + q.options.keep)
        else:
            if run_at is not None:
                e.run_at = run_at
            q.place(e)
        self._pump_soon(q)

    def _fail_now(
        self,
        q: JobQueue,
        e: Entry,
        error: str,
        after: float | None,
        progress: str | None = None,
        traceback: str | None = None,
        handler_ended: bool = False,
    ) -> asyncio.Future[bool]:
        """A failed attempt (a raise, a timeout, a lost worker, ``run.retry``): retried after the backoff (or
        ``after``), or ``dead`` when it was the last attempt. The future as :meth:`_end_now`'s."""
        fence = e.fence
        if e.attempts >= q.options.attempts:
            return self._end_now(
                q, e, fence, "dead", error=error, progress=progress, traceback=traceback, handler_ended=handler_ended
            )
        delay = (
            after if after is not None else backoff_delay(e.attempts, q.options.backoff_first, q.options.backoff_cap)
        )
        return self._end_now(
            q,
            e,
            fence,
            "failed",
            error=error,
            run_at=self.clock.now() + delay,
            progress=progress,
            traceback=traceback,
            handler_ended=handler_ended,
        )

    def _end_now(
        self,
        q: JobQueue,
        e: Entry,
        fence: int,
        state: str,
        *,
        error: str | None = None,
        run_at: float | None = None,
        result: str | None = None,
        progress: str | None = None,
        uncount: bool = False,
        traceback: str | None = None,
        handler_ended: bool = False,
    ) -> asyncio.Future[bool]:
        """End attempt ``fence`` of ``e`` as ``state`` (one guarded write), then move the index. The future gets
        ``True`` when it changed the job (the server answers a report from it). A cancel of the future leaves
        the write to go on (and the index to follow it). ``handler_ended``: the attempt's own report, its
        handler done: it stops counting against ``max_running*`` at once, not once its end is written."""
        out: asyncio.Future[bool] = self.loop.create_future()
        if e.where != RUNNING or e.fence != fence:
            out.set_result(False)
            return out
        e.where = ENDING
        # reported, its handler ended: it no longer counts against max_running and max_running_per_tenant while
        # its end is written, so that a claim that comes meanwhile (a worker's next, sent after the report) takes
        # the tenant's next job by priority, not a lower one of another tenant because this tenant seemed at its
        # cap (trial DL); counted again should the end not be written. Not for a cancel, a timeout or a lease
        # that ran out: the handler may run on until its worker hears (trial DN: the next job of a queue of
        # max_running=1 started before the cancelled handler was told)
        uncounted = handler_ended and e.counted
        if uncounted:
            e.counted = False
            q.count(e, -1)
            self._pump_soon(q)
        busy = self._begin_write(e)
        now = self.clock.now()
        entry = None
        if error is not None:
            error = _cut(error)
            entry = _json_encode(
                ErrorEntry(attempt=e.attempts, error=error, at_ms=_ms(now), traceback=_cut_traceback(traceback))
            ).decode()
        ended = state in ENDED
        written = self._write_ending(
            q,
            [
                e.id,
                fence,
                state,
                None if run_at is None else _ms(run_at),
                error,
                entry,
                result,
                progress,
                _ms(now) if ended else None,
                1 if uncount else 0,
            ],
        )

        def done(f: asyncio.Future[tuple[Any, ...] | None]) -> None:
            self._end_write(e, busy)
            exc = None if f.cancelled() else f.exception()
            row = None if f.cancelled() or exc is not None else f.result()
            if row is None:
                if e.where == ENDING:
                    e.where = RUNNING  # (its deadlines are still armed: see _on_lease)
                    if uncounted and not e.counted:
                        e.counted = True
                        q.count(e, 1)
                if out.done():
                    pass
                elif f.cancelled():
                    out.cancel()
                elif exc is not None:
                    out.set_exception(exc)
                else:
                    out.set_result(False)
                return
            attempts, prog, kept_error = row
            e.attempts = attempts
            self._settle(q, e, state, run_at, now)
            # (the row's error: this attempt's, or an earlier one's after a success or a snooze, trial IW)
            self._event(q, "state", e.id, state, _json_decode(prog) if prog else None, attempts, kept_error)
            self._notify(q, e.id)
            if state in ("queued", "failed") and attempts >= self._attempts_now(q):
                # a job back to wait (a snooze or a hand-back, which do not count; a failure written while a
                # configure lowered the count: trial CK) that has made as many attempts as now allowed: it ends
                # as _end_spent ends the waiting ones (before the answer, so who reads the job after it sees it
                # dead). Begun here, not in a task: a claim waiting (a live worker has one) would otherwise take
                # it first, at the pump its placing asked for (trial CM: it ran once more)
                if e.busy is None and e.where in (READY, DELAYED) and q.entries.get(e.id) is e:
                    self._track(self._answer_after(self._begin_end_waiting(q, e, "dead", _now_ms(self.clock)), out))
                else:
                    self._track(self._end_if_spent(q, e, out))
            elif not out.done():
                out.set_result(True)

        written.add_done_callback(done)
        return out

    def _write_ending(self, q: JobQueue, values: list[Any]) -> asyncio.Future[tuple[Any, ...] | None]:
        """Write one attempt's end (``values`` as in :data:`END_MANY`'s rows); the future gets the row's
        ``(attempts, progress)`` after the change, or ``None`` when the attempt was not the job's current
        running one. The ends asked for in one loop turn go to the writer as one statement."""
        loop = self.loop
        fut: asyncio.Future[tuple[Any, ...] | None] = loop.create_future()
        if not q.ends:
            loop.call_soon(self._flush_ends, q)
        q.ends.append((values, fut))
        return fut

    def _flush_ends(self, q: JobQueue) -> None:
        ends, q.ends = q.ends, []
        if len(ends) == 1 or len({v[0] for v, _ in ends}) < len(ends):
            for values, fut in ends:
                self._end_one(q, values, fut)
            return
        for i in range(0, len(ends), END_CHUNK):
            self._end_many(q, ends[i : i + END_CHUNK])

    def _end_one(self, q: JobQueue, values: list[Any], fut: asyncio.Future[tuple[Any, ...] | None]) -> None:
        w = q.db.write(END_ONE, values, own=True)

        def done(f: asyncio.Future[Any]) -> None:
            if fut.done():
                return
            if f.cancelled():
                fut.cancel()
            elif (exc := f.exception()) is not None:
                fut.set_exception(exc)
            else:
                rows = f.result().rows
                fut.set_result(tuple(rows[0][1:]) if rows else None)

        w.add_done_callback(done)

    def _end_many(self, q: JobQueue, ends: list[tuple[list[Any], asyncio.Future[tuple[Any, ...] | None]]]) -> None:
        marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(ends))
        w = q.db.write(END_MANY.format(marks=marks), [v for values, _ in ends for v in values], own=True)

        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                for values, fut in ends:  # each alone: a write that fails fails only its own attempt's end
                    if not fut.done():
                        self._end_one(q, values, fut)
                return
            got = {r[0]: tuple(r[1:]) for r in f.result().rows}
            for values, fut in ends:
                if not fut.done():
                    fut.set_result(got.get(values[0]))

        w.add_done_callback(done)

    async def report(self, peer: Peer, r: Report) -> bool:
        """How an attempt ended (see :class:`~tinystore.protocol.jobs.Report`). Returns ``True`` when it changed
        the job; ``False`` when attempt ``r.fence`` is no longer the job's current running attempt (it was lost,
        cancelled or already reported): nothing changes then (JOB-08).

        Raises ``InvalidError`` (an unknown outcome, a result or progress that is not JSON), ``LimitError`` (a
        result over ``job_value_bytes`` or progress over ``job_progress_bytes``). Once the report is checked, a
        cancel leaves it to be written.
        """
        await self._queue(r.queue)
        fut = self.report_now(peer, r)
        assert fut is not None
        return await fut

    def report_now(self, peer: Peer, r: Report) -> asyncio.Future[bool] | None:
        """:meth:`report` without a coroutine, for a queue this engine has loaded (``None`` for one it has not:
        then await :meth:`report`). Raises what :meth:`report` raises, at once."""
        q = self.queues.get(r.queue)
        if q is None:
            return None
        e = q.entries.get(r.id)
        if r.result is not None:
            self._check_json(q.name, r.id, "result", r.result, self.limits.job_value_bytes)
        if r.progress is not None:
            self._check_json(q.name, r.id, "progress", r.progress, self.limits.job_progress_bytes)
        if r.outcome not in _OUTCOMES:
            raise InvalidError(
                f"queue {q.name}: job {r.id}: outcome {r.outcome!r} is not succeeded, error, fail or snooze"
            )
        if e is None or e.where != RUNNING or e.fence != r.fence:
            fut: asyncio.Future[bool] = self.loop.create_future()
            fut.set_result(False)
            return fut
        if r.after_ms is not None and not 0 <= r.after_ms <= DELAY_MAX_MS:
            raise InvalidError(f"queue {q.name}: job {r.id}: after {r.after_ms / 1000:g}s is not within 0 .. 100 years")
        after = None if r.after_ms is None else r.after_ms / 1000
        if r.outcome == "succeeded":
            result = r.result if r.result is not None else "null"
            return self._end_now(q, e, r.fence, "succeeded", result=result, progress=r.progress, handler_ended=True)
        if r.outcome == "error":
            return self._fail_now(q, e, r.error or "failed", after, r.progress, r.traceback, handler_ended=True)
        if r.outcome == "fail":
            return self._end_now(
                q,
                e,
                r.fence,
                "dead",
                error=r.error or "failed",
                progress=r.progress,
                traceback=r.traceback,
                handler_ended=True,
            )
        run_at = self.clock.now() + (after or 0.0)
        return self._end_now(
            q, e, r.fence, "queued", run_at=run_at, progress=r.progress, uncount=True, handler_ended=True
        )

    async def release(self, queue: str, attempts: Sequence[Attempt]) -> int:
        """Hand back claimed attempts that did not run (or were stopped with their worker): each job is queued
        again, due now, and the attempt is not counted. Returns how many were handed back.

        A cancel of the caller leaves the hand-back going on in a task of the engine's: cut short between two
        attempts, it would leave the rest running, and an embedded store's own workers have no lease to end them
        (a worker stopped as its claim lands is cancelled while it hands that claim back)."""
        q = await self._queue(queue)
        return int(await asyncio.shield(self._track(self._release(q, attempts))))

    async def _release(self, q: JobQueue, attempts: Sequence[Attempt]) -> int:
        n = 0
        for a in attempts:
            e = q.entries.get(a.id)
            if e is None:
                continue
            if await self._end_now(q, e, a.fence, "queued", uncount=True):
                n += 1
        return n

    def _check_json(self, queue: str, jid: str, what: str, text: str, limit: int) -> None:
        if not isinstance(text, str) or not (text.isascii() or valid_text(text)):
            raise InvalidError(f"queue {queue}: job {jid}: the {what} is not JSON text (a str of valid Unicode)")
        size = len(text.encode()) if not text.isascii() else len(text)
        if size > limit:
            raise LimitError(
                f"queue {queue}: job {jid}: the {what} is {size} bytes of JSON, over the {limit} bytes allowed",
                limit=limit,
                wanted=size,
            )
        try:
            decoded = _json_decode(text)
        except msgspec.DecodeError as exc:
            raise InvalidError(f"queue {queue}: job {jid}: the {what} is not JSON: {exc}") from None
        if _LONG_INT.search(text):
            problem = json_problem(decoded)
            if problem is not None:
                raise InvalidError(f"queue {queue}: job {jid}: the {what} does not encode as JSON: {problem}")

    async def progress(self, queue: str, jid: str, fence: int, progress: str) -> bool:
        """Store the progress (JSON text, at most ``job_progress_bytes``) of running attempt ``fence`` and publish
        it. ``False`` when the attempt is not current. Raises ``InvalidError``, ``LimitError``."""
        q = await self._queue(queue)
        self._check_json(queue, jid, "progress", progress, self.limits.job_progress_bytes)
        e = q.entries.get(jid)
        if e is None or e.where != RUNNING or e.fence != fence:
            return False
        return await self._to_its_end(self._progress(q, jid, fence, progress))

    async def _progress(self, q: JobQueue, jid: str, fence: int, progress: str) -> bool:
        done = await q.db.write(
            f"update {TABLE} set progress = ? where id = ? and fence = ? and state = 'running' "
            "returning attempts, error",
            [progress, jid, fence],
            own=True,
        )
        if not done.rows:
            return False
        # (its watchers woken and its event published even when the caller is gone: trial GS)
        self._event(q, "progress", jid, "running", _json_decode(progress), done.rows[0][0], done.rows[0][1])
        self._notify(q, jid)
        return True

    async def step(self, queue: str, jid: str, fence: int, name: str, result: str) -> bool:
        """Keep the result (JSON text) of step ``name`` of running attempt ``fence`` on the job, for its later
        attempts (JOB-12). ``False`` when the attempt is not current. Raises ``InvalidError``, ``LimitError``."""
        q = await self._queue(queue)
        check_step_name(f"queue {queue}: job {jid}", name)
        self._check_json(queue, jid, f"result of step {name!r}", result, self.limits.job_value_bytes)
        e = q.entries.get(jid)
        if e is None or e.where != RUNNING or e.fence != fence:
            return False
        # all the steps of a job together stay under STEPS_VALUES values' worth, so that its row (and a page of
        # a list) always fits a frame; the running attempt is the only writer of its steps (fenced). The size is
        # checked in the write itself: steps run at once (gather) would all pass a check read before any write
        cap = STEPS_VALUES * self.limits.job_value_bytes
        merged = "json_set(coalesce(steps, '{}'), ?, json(?))"
        path = f'$."{name}"'
        done = await q.db.write(
            f"update {TABLE} set steps = {merged} "
            f"where id = ? and fence = ? and state = 'running' and length(cast({merged} as blob)) <= ? returning id",
            [path, result, jid, fence, path, result, cap],
            own=True,
        )
        if done.rows:
            return True
        had = (
            await q.db.read(
                f"select length(cast({merged} as blob)) from {TABLE} where id = ? and fence = ? and state = 'running'",
                [path, result, jid, fence],
                "one",
            )
        ).rows
        if had and (had[0][0] or 0) > cap:
            raise LimitError(
                f"queue {queue}: job {jid}: step {name!r}: the job's steps would be {had[0][0]} "
                f"bytes of JSON, over the {cap} bytes allowed ({STEPS_VALUES} values' worth)",
                limit=cap,
                wanted=had[0][0],
            )
        return False

    # ------------------------------------------------------------------------------------------- adds

    async def _new_rows_in_turns(self, queue: str, jobs: Sequence[NewJob]) -> list[list[Any]]:
        """:meth:`_new_rows` of a big add, :data:`TURN_JOBS` jobs a loop turn, so that the other clients' calls are
        answered meanwhile (trial HL: 100,000 jobs held every client of the server for 0.5 s)."""
        now_ms = _ms(self.clock.now())
        out: list[list[Any]] = []
        for start in range(0, len(jobs), TURN_JOBS):
            if start:
                await asyncio.sleep(0)
            out.extend(self._new_rows(queue, jobs[start : start + TURN_JOBS], now_ms, start, len(jobs)))
        return out

    def _new_rows(
        self, queue: str, jobs: Sequence[NewJob], now_ms: int | None = None, first: int = 0, n: int | None = None
    ) -> list[list[Any]]:
        """The rows of ``jobs`` (the ``first`` .. of ``n``, for errors' names), checked; ``now_ms``: the add's time."""
        if now_ms is None:
            now_ms = _ms(self.clock.now())
        out: list[list[Any]] = []
        if n is None:
            n = len(jobs)
        for i, j in enumerate(jobs, first):
            # (the job's name for an error, made only then: a job or two of the millions added is refused)
            what = _JobName(queue, i, n)
            if not isinstance(j.value, str):
                raise InvalidError(f"{what}: the value must be JSON text")
            self._check_json(queue, "(new)", "value", j.value, self.limits.job_value_bytes)
            for label, v in (("key", j.key), ("tenant", j.tenant), ("user", j.user), ("type", j.type)):
                if v is not None and (not isinstance(v, str) or not valid_text(v)):
                    raise InvalidError(f"{what}: {label} {v!r} is not text (a str of valid Unicode)")
            if isinstance(j.priority, bool) or not isinstance(j.priority, int):
                raise InvalidError(f"{what}: priority {j.priority!r} is not an int")
            if j.key is not None and not 0 < len(j.key) <= KEY_MAX:
                raise InvalidError(f"{what}: key {j.key[:40]!r}: an idempotency key is 1 to {KEY_MAX} characters")
            for label, v in (("tenant", j.tenant), ("user", j.user), ("type", j.type)):
                if v is not None and len(v) > TEXT_MAX:
                    raise InvalidError(f"{what}: {label} {v[:40]!r}…: at most {TEXT_MAX} characters")
            if not -INT_MAX <= j.priority <= INT_MAX:
                raise InvalidError(f"{what}: priority {shown(j.priority)} does not fit in 64 bits")
            if j.delay_ms is not None and j.at_ms is not None:
                raise InvalidError(f"{what}: give delay or at, not both")
            if j.delay_ms is not None and j.delay_ms < 0:
                raise InvalidError(f"{what}: delay {j.delay_ms / 1000:g}s is negative")
            run_at = now_ms
            if j.delay_ms is not None:
                if j.delay_ms > DELAY_MAX_MS:
                    raise InvalidError(f"{what}: delay {format_seconds(j.delay_ms / 1000)} is over 100 years")
                run_at = now_ms + j.delay_ms
            elif j.at_ms is not None:
                run_at = j.at_ms
            if not 0 <= run_at <= RUN_AT_MAX_MS:
                if j.delay_ms is not None:  # (trial CW: it named an "at" the caller never gave)
                    raise InvalidError(
                        f"{what}: delay {format_seconds(j.delay_ms / 1000)} from now ({_when_text(now_ms)}) would run "
                        "it past the end of 9999"
                    )
                raise InvalidError(f"{what}: at {_when_text(run_at)} is not between 1970 and the end of 9999")
            jid = self._ids.new(now_ms)
            out.append(
                [jid, queue, j.key, j.tenant or "", j.user or None, j.type or None, j.priority, j.value, run_at, now_ms]
            )
        return out

    async def add(self, queue: str, jobs: Sequence[NewJob], tx: SqlTx | None = None) -> list[str]:
        """Add ``jobs`` to ``queue``, all or none; returns their ids in order. A job whose idempotency key a job
        of the queue holds adds nothing and gets that job's id (JOB-05), also when many add at once (a unique
        index decides). With ``tx`` (an open transaction of the queue's database), the rows are written inside
        it and become runnable only once it commits (JOB-06).

        Raises ``InvalidError`` (a value that is not JSON, a bad key, tenant, priority or delay, a transaction
        of another database), ``LimitError`` (a value over ``job_value_bytes``), ``ClosedError``.
        A cancel after the write was handed to the writer leaves the jobs added.
        """
        q = await self._queue(queue)
        if not jobs:
            return []
        if len(jobs) > ADD_MAX:
            raise LimitError(
                f"queue {queue}: {len(jobs):,} jobs in one add; at most {ADD_MAX:,}", limit=ADD_MAX, wanted=len(jobs)
            )
        rows = self._new_rows(queue, jobs) if len(jobs) <= TURN_JOBS else await self._new_rows_in_turns(queue, jobs)
        if tx is not None:
            if tx.db is not q.db:
                raise InvalidError(
                    f"queue {queue}: its jobs live in database {q.db.name}; a transaction of database {tx.db.name} "
                    "cannot add to it"
                )
            if not q.schema_ready():
                for stmt in SCHEMA:
                    await tx.exec(stmt, [], own=True)
            # what each chunk's insert wrote is noted as the writer answers it, whatever becomes of this call, and
            # the jobs it wrote are indexed at the commit (trial GS: an add cancelled after its insert, in a
            # transaction that then committed, left jobs queued that no worker saw)
            written: list[list[Any]] = []
            found: dict[str, str] = {}
            tx.after_commit.append(lambda: self._added_at_commit(q, self._ids_of(written, found)[1]))
            for i in range(0, len(rows), CHUNK):
                chunk = rows[i : i + CHUNK]
                insert = asyncio.ensure_future(tx.exec(*self._insert(chunk), own=True))
                insert.add_done_callback(functools.partial(_note_written, chunk, written, found))
                await asyncio.shield(insert)
            return self._ids_of(rows, found)[0]
        if len(rows) <= CHUNK:
            added: list[str] = await self._insert_soon(q, rows)
            return added
        # in a task of its own: a cancel of the caller leaves the transaction to its commit or rollback, and the
        # jobs committed indexed (trial GS: cancelled at its commit, 401 jobs were queued that no worker saw;
        # cancelled as it began, its transaction held the database's writer until tx_idle)
        return await self._to_its_end(self._add_in_own_tx(q, rows))

    async def _add_in_own_tx(self, q: JobQueue, rows: list[list[Any]]) -> list[str]:
        own = await q.db.begin(owner=None)
        found: dict[str, str] = {}
        # before the commit, from which its rows can be read: a cancel of one of them waits for its index (trial
        # HN: one found by SQL between the commit and the index was answered "no such job", and then ran)
        placing = asyncio.Event()
        try:
            for i in range(0, len(rows), CHUNK):
                done = await own.exec(*self._insert(rows[i : i + CHUNK]), own=True)
                found.update(self._returned(done.rows))
            q.placing.add(placing)
            await own.commit()
            ids, new = self._ids_of(rows, found)
            await self._added_in_turns(q, new)
        except BaseException:
            await asyncio.shield(own.rollback())
            raise
        finally:
            q.placing.discard(placing)
            placing.set()
        return ids

    async def _added_in_turns(self, q: JobQueue, rows: list[list[Any]]) -> None:
        """:meth:`_added` of a big add's committed jobs, :data:`TURN_JOBS` a loop turn (see
        :meth:`_new_rows_in_turns`); a cancel of one not indexed yet waits for it (``q.placing``, held by the
        caller from before the commit). It runs in the add's own task (see :meth:`_to_its_end`): a cancel of the
        caller does not stop it."""
        for start in range(0, len(rows), TURN_JOBS):
            if start:
                await asyncio.sleep(0)
            self._added(q, rows[start : start + TURN_JOBS])

    def _added_at_commit(self, q: JobQueue, rows: list[list[Any]]) -> None:
        """:meth:`_added` of the jobs a transaction added, at its commit: the first :data:`TURN_JOBS` now, the rest
        in a task of the engine's, a loop turn for each :data:`TURN_JOBS` (a transaction that added 100,000 jobs
        held the loop, and every other client, for a second at its commit); a cancel of one not indexed yet waits
        for it (``q.placing``, set from now on)."""
        self._added(q, rows[:TURN_JOBS])
        if len(rows) <= TURN_JOBS:
            return
        placing = asyncio.Event()
        q.placing.add(placing)

        async def rest() -> None:
            try:
                await asyncio.sleep(0)
                await self._added_in_turns(q, rows[TURN_JOBS:])
            finally:
                q.placing.discard(placing)
                placing.set()

        self._track(rest())

    def running_in(self, database: str) -> int:
        """The attempts running now of the queues whose jobs live in ``database``."""
        return sum(q.running_total for q in self.queues.values() if q.db.name == database)

    def add_now(self, queue: str, jobs: Sequence[NewJob]) -> Later | None:
        """:meth:`add` without a coroutine, for its common case: a queue this engine has loaded, no transaction,
        1 to :data:`CHUNK` jobs. ``None`` otherwise (then await :meth:`add`). Raises what :meth:`add` raises, at
        once."""
        q = self.queues.get(queue)
        if q is None or not jobs or len(jobs) > CHUNK:
            return None
        self._check_open()
        return self._insert_soon(q, self._new_rows(queue, jobs))

    def _insert_soon(self, q: JobQueue, rows: list[list[Any]]) -> Later:
        """Write ``rows`` (at most :data:`CHUNK`) and put the new jobs in the index; the future gets their ids. The
        adds asked for in one loop turn go to the writer as one statement (a statement that fails is tried again
        one add at a time, so an add fails only for its own rows). Once handed over, the rows are written (and
        indexed) whatever becomes of the caller: a :class:`Later`, so that the server knows when a cancelled add
        has run."""
        loop = self.loop
        fut = Later(loop)
        if not q.adds:
            loop.call_soon(self._flush_adds, q)
        q.adds.append((rows, fut))
        return fut

    def _flush_adds(self, q: JobQueue) -> None:
        adds, q.adds = q.adds, []
        group: list[tuple[list[list[Any]], Later]] = []
        size = 0
        for item in adds:
            if group and size + len(item[0]) > CHUNK:
                self._insert_group(q, group)
                group, size = [], 0
            group.append(item)
            size += len(item[0])
        if group:
            self._insert_group(q, group)

    def _insert_group(self, q: JobQueue, group: list[tuple[list[list[Any]], Later]], early: bool = True) -> None:
        rows = [r for batch, _ in group for r in batch]
        w = q.db.write(*self._insert(rows), own=True)
        placed = self._place_early(q, rows) if early else []

        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                self._unplace(q, placed)
                if len(group) > 1:
                    for item in group:  # each alone: an add that fails fails alone
                        self._insert_group(q, [item], early=False)
                    return
                exc = None if f.cancelled() else f.exception()
                group[0][1].deliver(None, exc or ClosedError(f"queue {q.name}: the add did not run: the store closes"))
                return
            found = self._returned(f.result().rows)
            answers = [self._ids_of(batch, found) for batch, _ in group]
            if placed:
                self._written_early(q, placed, {r[0] for _, new in answers for r in new})
            for (_, fut), (ids, new) in zip(group, answers, strict=True):
                self._added(q, new)
                fut.deliver(ids, None)

        w.add_done_callback(done)

    def _place_early(self, q: JobQueue, rows: list[list[Any]]) -> list[Entry]:
        """When a claim waits for jobs and ``rows`` are all due, put them in the index while their insert is still
        on its way to the writer, and hand them to the waiting claims at once: the claim's write follows the
        insert's in the same commit, and the job starts one commit (one fsync) sooner. Returns the entries placed
        (the insert's answer tells whether each row was written)."""
        if self.closed or not any(not w.fut.done() and not w.claiming for w in q.waiters):
            return []
        now_ms = _ms(self.clock.now())
        if any(r[8] > now_ms for r in rows):
            return []
        placed: list[Entry] = []
        for jid, _, _, tenant, _, _, priority, _, run_at, _ in rows:
            e = Entry(jid, tenant, priority, run_at / 1000, unwritten=INSERTING)
            q.entries[jid] = e
            q.place(e)
            placed.append(e)
        self._pump(q)
        return placed

    def _written_early(self, q: JobQueue, placed: list[Entry], written: set[str]) -> None:
        """The insert of jobs placed early was answered: those whose rows it wrote (ids in ``written``) are queued
        (their event goes out before the claim's); one whose idempotency key another job holds was not written, and
        leaves the index."""
        gone: list[Entry] = []
        for e in placed:
            if e.id in written:
                e.unwritten = 0
                self._event(q, "state", e.id, "queued", None, 0, None)
            else:
                gone.append(e)
        if gone:
            self._unplace(q, gone)

    def _unplace(self, q: JobQueue, placed: list[Entry]) -> None:
        """Jobs placed early whose rows were not written (a failed insert, or a key another job holds) leave the
        index. One being claimed is left to its claim, which finds no row to claim and drops it."""
        for e in placed:
            e.unwritten = UNWRITTEN
            if e.where == READY and q.entries.get(e.id) is e:
                e.where = GONE
                del q.entries[e.id]
                q.stale_ready += 1

    @staticmethod
    def _insert(rows: list[list[Any]]) -> tuple[str, list[Any]]:
        values = ", ".join("(?, ?, ?, ?, ?, ?, ?, 'queued', 0, 0, ?, ?, ?)" for _ in rows)
        params = [v for r in rows for v in r]
        return (
            f"insert into {TABLE} (id, queue, key, tenant, user, type, priority, state, attempts, fence, value, "
            f"run_at, created_at) values {values} on conflict (queue, key) where key is not null "
            "do update set key = excluded.key returning id, key",
            params,
        )

    @staticmethod
    def _returned(rows: Iterable[Sequence[Any]]) -> dict[str, str]:
        """key (or id, for jobs without a key) → the id the row has."""
        out: dict[str, str] = {}
        for jid, key in rows:
            out["k:" + key if key is not None else "i:" + jid] = jid
        return out

    @staticmethod
    def _ids_of(rows: list[list[Any]], found: dict[str, str]) -> tuple[list[str], list[list[Any]]]:
        ids: list[str] = []
        new: list[list[Any]] = []
        for r in rows:
            jid, key = r[0], r[2]
            got = found.get("k:" + key) if key is not None else jid
            if got is None:
                got = jid
            if got == jid:
                new.append(r)
            ids.append(got)
        return ids, new

    def _added(self, q: JobQueue, rows: list[list[Any]]) -> None:
        if self.closed or self.queues.get(q.name) is not q:
            return
        for jid, _, _, tenant, _, _, priority, _, run_at, _ in rows:
            if jid in q.entries:
                continue
            e = Entry(jid, tenant, priority, run_at / 1000)
            q.entries[jid] = e
            q.place(e)
            self._event(q, "state", jid, "queued", None, 0, None)
        self._pump_soon(q)

    # ------------------------------------------------------------------------------------------- cancel, retry

    async def cancel(self, queue: str, jid: str) -> bool:
        """Cancel job ``jid``: a waiting job never runs; a running one's handler is told (push ``jobs.cancel``)
        and the job ends ``cancelled``, never retried (JOB-09). Returns ``True`` when it changed the job;
        ``False`` when it had already ended or is unknown (nothing is written then). ``InvalidError`` for an id
        that is not a str."""
        q = await self._queue(queue)
        check_job_id(queue, "cancel", jid)
        return await self._to_its_end(self._cancel(q, queue, jid))

    async def _cancel(self, q: JobQueue, queue: str, jid: str) -> bool:
        while True:
            e = q.entries.get(jid)
            if e is None:
                if q.placing:  # (a big add's jobs, committed, being indexed: it may be one of them)
                    await next(iter(q.placing)).wait()
                    continue
                return False
            if e.busy is not None:
                await asyncio.shield(e.busy)
                continue
            break
        now_ms = _now_ms(self.clock)
        if e.where == RUNNING:
            fence = e.fence
            peer = e.peer
            ok = await self._end_now(q, e, fence, "cancelled")
            if ok and peer is not None:
                peer.push(CANCEL_PUSH, CancelRun(queue=queue, id=jid, fence=fence, reason="cancelled"))
            return ok
        return await self._end_waiting(q, e, "cancelled", now_ms)

    async def _end_waiting(self, q: JobQueue, e: Entry, state: str, now_ms: int) -> bool:
        """End the waiting (or being claimed) job ``e`` as ``state`` (``cancelled``, or ``dead`` when its attempts
        were lowered under those it made): its row, its place in the index, its event. ``False`` when its row
        had moved on meanwhile (nothing written then). A claim under way that got it is told to give it up."""
        return await self._begin_end_waiting(q, e, state, now_ms)

    def _begin_end_waiting(self, q: JobQueue, e: Entry, state: str, now_ms: int) -> Coroutine[Any, Any, bool]:
        """:meth:`_end_waiting`'s start, done at once: ``e`` leaves the claimable jobs (a pump that comes next
        passes it over) and its write is sent. The coroutine returned does the rest."""
        jid = e.id
        if e.where == CLAIMING:
            e.cancel_queued = True
            sql_state = "('queued', 'failed', 'running')"
        else:
            if e.where == READY:
                q.stale_ready += 1  # it stays in its line until passed (or JobQueue.compact_ready)
            e.where = ENDING
            sql_state = "('queued', 'failed')"
        busy = self._begin_write(e)
        write = q.db.write(
            f"update {TABLE} set state = ?, finished_at = ?, lease_until = null "
            f"where id = ? and state in {sql_state} returning attempts, progress, fence, error",
            [state, now_ms, jid],
            own=True,
        )
        return self._finish_end_waiting(q, e, state, write, busy, now_ms)

    async def _finish_end_waiting(
        self, q: JobQueue, e: Entry, state: str, write: asyncio.Future[Done], busy: asyncio.Future[None], now_ms: int
    ) -> bool:
        jid = e.id
        try:
            done = await write
        except BaseException:
            if e.where == ENDING:
                q.place(e)
            e.cancel_queued = False
            self._end_write(e, busy)
            raise
        self._end_write(e, busy)
        if not done.rows:
            if e.where == ENDING:
                q.place(e)
            return False
        attempts, prog, fence, error = done.rows[0]
        peer = e.peer
        self._settle(q, e, state, None, now_ms / 1000)
        if peer is not None:
            peer.push(CANCEL_PUSH, CancelRun(queue=q.name, id=jid, fence=fence, reason=state))
        # (the event carries the job's last error as its row keeps it, for a dead job as at the end of its last
        # attempt (trial CE), and for a cancelled one that had failed before (trial IP: a page built from events showed
        # another error than the row))
        self._event(q, "state", jid, state, _json_decode(prog) if prog else None, attempts, error)
        self._notify(q, jid)
        return True

    async def retry(self, queue: str, jid: str) -> bool:
        """Put a ``dead`` or ``cancelled`` job back to ``queued``, due now, attempts from 0 (its steps and its
        error history stay). Returns ``False`` for a job in another state or an unknown id."""
        q = await self._queue(queue)
        check_job_id(queue, "retry", jid)
        return await self._to_its_end(self._retry(q, queue, jid))

    async def _retry(self, q: JobQueue, queue: str, jid: str) -> bool:
        if jid in q.entries:
            return False
        now_ms = _now_ms(self.clock)
        done = await q.db.write(
            f"update {TABLE} set state = 'queued', attempts = 0, run_at = ?, finished_at = null, result = null "
            "where id = ? and queue = ? and state in ('dead', 'cancelled') returning tenant, priority, progress, error",
            [now_ms, jid, queue],
            own=True,
        )
        if not done.rows or jid in q.entries:
            return bool(done.rows)
        tenant, priority, prog, error = done.rows[0]
        e = Entry(jid, tenant, priority, now_ms / 1000)
        q.entries[jid] = e
        q.place(e)
        self._event(q, "state", jid, "queued", _json_decode(prog) if prog else None, 0, error)
        self._notify(q, jid)
        self._pump(q)
        return True

    # ------------------------------------------------------------------------------------------- reads

    def _row_options(self, name: str) -> QueueOptions:
        """The options of queue ``name`` as known without its load (the stored ones, or those just configured)."""
        return self._configured.get(name) or self._options.get(name) or _merge(self.limits, Options())

    def _row(self, q: JobQueue | None, r: Sequence[Any]) -> JobRow:
        (
            jid,
            queue,
            state,
            attempts,
            fence,
            value,
            key,
            tenant,
            user,
            type_,
            priority,
            progress,
            result,
            error,
            errors,
            steps,
            run_at,
            created_at,
            started_at,
            finished_at,
        ) = r
        opts = q.options if q is not None else self._row_options(queue)
        stuck = False
        if state == "running" and started_at is not None:
            e = q.entries.get(jid) if q is not None else None
            stuck = (e is not None and e.stuck) or self.clock.now() - started_at / 1000 > opts.expected
        return JobRow(
            id=jid,
            queue=queue,
            state=state,
            attempts=attempts,
            max_attempts=opts.attempts,
            fence=fence,
            value=value,
            key=key,
            tenant=tenant,
            user=user,
            type=type_,
            priority=priority,
            progress=_json_decode(progress) if progress else None,
            result=result,
            error=error,
            errors=_json_decode(errors, type=list[ErrorEntry]) if errors else [],
            steps=_json_decode(steps) if steps else {},
            run_at_ms=run_at,
            created_at_ms=created_at,
            started_at_ms=started_at,
            finished_at_ms=finished_at,
            stuck=stuck,
        )

    async def get(self, queue: str, jid: str) -> JobRow | None:
        """Job ``jid`` of ``queue`` as stored, or ``None`` (``InvalidError`` for an id that is not a str)."""
        where = await self._for_reads(queue)
        check_job_id(queue, "get", jid)
        if where is None:
            return None
        db, q = where
        rows = (await db.read(f"select {COLUMNS} from {TABLE} where id = ? and queue = ?", [jid, queue], "one")).rows
        return self._row(q, rows[0]) if rows else None

    async def _for_reads(self, name: str) -> tuple[SqlDatabase, JobQueue | None] | None:
        """Where to read the rows of queue ``name``: its database, and the queue once it is loaded (``None`` while
        its jobs load after a start: a read does not wait for that, trial CA: a get waited 3.4 s behind the load
        of 180,000 jobs). ``None`` when its table is not made yet (no row). Raises as :meth:`_queue`."""
        q = self.queues.get(name)
        if q is None:
            self._check_open()
            _, db, made, _ = await self._where(name)
            q = self.queues.get(name)  # (loaded meanwhile)
            if q is None:
                return (db, None) if made else None
        if not await self._readable(q):
            return None
        return q.db, q

    async def _readable(self, q: JobQueue) -> bool:
        """Whether the rows of ``q`` may be read now: its schema is made, or its table is committed while the rest
        of its making waits for the writer. A read does not wait for the writer: an open transaction of the
        queue's database may hold it, the very one that made the table with its first add (trial BZ: a get
        inside it waited until tx_idle rolled the transaction back). ``False``: no table yet, so no row. Raises
        what the making of the schema raised, when it failed."""
        if q.schema is None or q.schema_ready():
            return True
        if q.schema.done():
            await q.wait_schema()  # (it failed: raises why)
        found = await q.db.read(
            "select count(*) from sqlite_master where type = 'table' and name = ?", [TABLE], "scalar"
        )
        return bool(found.rows[0][0])

    async def find(self, jid: str) -> JobRow | None:
        """Job ``jid`` in whichever queue holds it, or ``None``."""
        check_job_id("(any)", "find", jid)
        unreadable: TinystoreError | None = None
        for name in await self.queue_names():
            try:
                row = await self.get(name, jid)
            except _UNREADABLE as exc:
                # (trial FF: a queue whose database is missing hid the jobs of every other queue; FQ: one whose
                # file is not a database)
                unreadable = unreadable or exc
                continue
            if row is not None:
                return row
        if unreadable is not None:  # (the job may be in the queue that cannot be read: not "no such job")
            raise UnavailableError(f"job {jid} is in no queue that can be read; {unreadable.message}")
        return None

    async def queue_names(self) -> list[str]:
        """The names of the queues the store knows, sorted; none (and no jobs database made) before its first."""
        if self._jobs_db is None and not (self.sql.directory / f"{JOBS_DB}.db").exists():
            return []  # (a status or a list must not make the jobs database: it would be a new database)
        db = await self.jobs_db()
        return [r[0] for r in (await db.read(f"select name from {QUEUES} order by name", [])).rows]

    async def queues_in(self, database: str) -> list[str]:
        """The queues whose jobs are kept in application database ``database``, sorted."""
        out = []
        for name in await self.queue_names():
            opts = await self._stored_options(name)
            if opts is not None and opts.database == database:
                out.append(name)
        return out

    async def list_jobs(self, req: ListRequest) -> Page:
        """Jobs newest first (by id), ``req.limit`` (1..1000) at most, after cursor ``req.after``; ``state``
        ``"stuck"`` lists running jobs past their expected time. Raises ``InvalidError`` for a bad filter."""
        check_list(req.queue, req)
        names = [req.queue] if req.queue else await self.queue_names()
        found: list[tuple[str, int, str]] = []  # (id, bytes of its row, its queue)
        filters: dict[str, tuple[str, list[Any]]] = {}  # each queue's filter, but its cursor: (sql, params)
        sources: dict[str, tuple[SqlDatabase, JobQueue | None]] = {}
        unreadable: list[str] = []
        for name in names:
            try:
                source = await self._for_reads(name)
            except _UNREADABLE as exc:
                if req.queue:
                    raise
                # (trial FF: one queue whose database file was missing failed the list of every queue; the rest of
                # the store goes on, as docs/jobs.md says)
                unreadable.append(exc.message)
                continue
            if source is None:
                continue
            sources[name] = source
            db, q = source
            where = ["queue = ?"]
            params: list[Any] = [name]
            if req.state == "stuck":
                expected = q.options.expected if q is not None else self._row_options(name).expected
                where.append("state = 'running' and started_at < ?")
                params.append(_ms(self.clock.now() - expected))
            elif req.state is not None:
                where.append("state = ?")
                params.append(req.state)
            if req.tenant is not None:
                where.append("tenant = ?")
                params.append(req.tenant)
            # "" is none, as for a tenant: an add's user="" or type="" is kept as none (trial JF)
            if req.type == "":
                where.append("coalesce(type, '') = ''")
            elif req.type is not None:
                where.append("type = ?")
                params.append(req.type)
            if req.user == "":
                where.append("coalesce(user, '') = ''")
            elif req.user is not None:
                where.append("user = ?")
                params.append(req.user)
            filters[name] = (" and ".join(where), list(params))
            if req.after is not None:
                where.append("id < ?")
                params.append(req.after)
            sized = (
                await db.read(
                    f"select id, {ROW_BYTES} from {TABLE} where {' and '.join(where)} order by id desc limit ?",
                    [*params, req.limit + 1],
                    unlimited=True,  # (an id and a number a job, at most a page of them and one)
                )
            ).rows
            found.extend((jid, size + ROW_COST, name) for jid, size in sized)
        found.sort(key=lambda f: f[0], reverse=True)
        # a page holds at most `limit` jobs, and no more bytes than half a frame (or of a SQL result): a page of
        # large jobs is shorter, never refused; its `next` goes on from its last job
        budget = min(self.limits.frame_body_bytes, self.limits.sql_result_bytes) // 2
        take: list[tuple[str, int, str]] = []
        total = 0
        for item in found[: req.limit]:
            if take and total + item[1] > budget:
                break
            take.append(item)
            total += item[1]
        out: list[JobRow] = []
        for name in dict.fromkeys(owner for _, _, owner in take):
            ids = [jid for jid, _, owner in take if owner == name]
            db, q = sources[name]
            # the filter again: a job that left it since (a queued job that ran meanwhile) is not on the page (trial
            # CA: a page of state "running" held jobs that had succeeded)
            where_sql, where_params = filters[name]
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                marks = ", ".join("?" * len(part))
                rows = (
                    await db.read(
                        f"select {COLUMNS} from {TABLE} where id in ({marks}) and {where_sql}", [*part, *where_params]
                    )
                ).rows
                out.extend(self._row(q, r) for r in rows)
        out.sort(key=lambda j: j.id, reverse=True)
        more = len(found) > len(take)
        return Page(jobs=out, next=take[-1][0] if more and take else None, unreadable=unreadable)

    async def wait(self, queue: str, jid: str, seen: str, wait_ms: int) -> JobRow | None:
        """Job ``jid`` once it differs from snapshot ``seen`` (see :func:`~tinystore.protocol.jobs.snapshot`),
        or as it is after ``wait_ms`` (real time, at most 5 minutes); ``None`` for an unknown job."""
        from ..protocol.jobs import snapshot

        q = await self._queue(queue)
        check_job_id(queue, "watch", jid)
        if self.stopping:
            raise UnavailableError("jobs: the store is stopping; wait again once it is back")
        fut: asyncio.Future[None] = self.loop.create_future()
        q.watchers.setdefault(jid, []).append(fut)
        try:
            row = await self.get(queue, jid)
            if row is None or snapshot(row) != seen or row.state in ENDED:
                return row
            try:
                async with asyncio.timeout(min(max(wait_ms, 0), 300_000) / 1000):
                    await asyncio.shield(fut)
            except TimeoutError:
                pass
            return await self.get(queue, jid)
        finally:
            lst = q.watchers.get(jid)
            if lst is not None:
                try:
                    lst.remove(fut)
                except ValueError:
                    pass
                if not lst:
                    del q.watchers[jid]

    def _notify(self, q: JobQueue, jid: str) -> None:
        for fut in q.watchers.pop(jid, ()):
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------------------------------- events, keep

    def _event(
        self, q: JobQueue, kind: str, jid: str, state: str, progress: Any, attempts: int, error: str | None
    ) -> None:
        """Publish a job event on ``tinystore-jobs`` under ``(queue, job id)`` when channels are there (and, when
        ``listened`` can tell, when somebody could hear it: an event nobody can get is not even encoded)."""
        if self.publish is None:
            return
        listened = self.listened
        if listened is not None and not listened(EVENTS_CHANNEL, (q.name, jid)):
            return
        try:
            payload = _msgpack.encode(
                JobEvent(
                    kind=kind,  # type: ignore[arg-type]  # (this module's own words: see JobEvent)
                    job_id=jid,
                    state=state,  # type: ignore[arg-type]
                    progress=progress,
                    attempts=attempts,
                    error=error,
                )
            )
            self.publish(EVENTS_CHANNEL, (q.name, jid), payload)
        except Exception as exc:  # an event that cannot go out never harms the job
            log.debug("queue %s: job %s: event not published: %s", q.name, jid, exc)

    def _arm_sweep(self, q: JobQueue, when: float) -> None:
        if when >= q.sweep_when or self.closed:
            return
        if q.sweep_timer is not None:
            q.sweep_timer.cancel()
        q.sweep_when = when
        q.sweep_timer = self.clock.call_at(when, lambda: self._track(self._sweep(q)))

    async def _sweep(self, q: JobQueue) -> None:
        """Delete ended jobs older than ``keep`` (their keys go with them), then wait for the next to come due."""
        q.sweep_timer = None
        q.sweep_when = math.inf
        if self.closed:
            return
        try:
            while True:
                cutoff = _ms(self.clock.now() - q.options.keep)
                done = await q.db.write(
                    f"delete from {TABLE} where id in (select id from {TABLE} where queue = ? and state in "
                    "('succeeded', 'dead', 'cancelled') and finished_at <= ? limit 1000)",
                    [q.name, cutoff],
                    own=True,
                )
                if done.changes < 1000:
                    break
            oldest = await q.db.read(
                f"select min(finished_at) from {TABLE} where queue = ? and state in ('succeeded', 'dead', 'cancelled')",
                [q.name],
                "scalar",
            )
        except ClosedError:
            return
        except TinystoreError as exc:
            # (a full disk; a foreign key to the jobs table made before the store refused them: trial BB) tried
            # again later, rather than never again while the process runs
            log.warning(
                "queue %s: deleting the jobs ended more than keep ago failed, tried again in %gs: %s",
                q.name,
                SWEEP_RETRY,
                exc.message,
            )
            self._arm_sweep(q, self.clock.now() + SWEEP_RETRY)
            return
        if oldest.rows and oldest.rows[0][0] is not None:
            self._arm_sweep(q, max(oldest.rows[0][0] / 1000 + q.options.keep, self.clock.now() + 0.001))

    # ------------------------------------------------------------------------------------------- status, close

    def _info(self, q: JobQueue) -> QueueInfo:
        counts = {"queued": 0, "delayed": 0, "running": q.running_total}
        stuck = 0
        for e in q.entries.values():
            if e.where == READY:
                counts["queued"] += 1
            elif e.where == DELAYED:
                counts["delayed"] += 1
            elif e.where == RUNNING and e.stuck:
                stuck += 1
        return QueueInfo(queue=q.name, options=q.options.to_wire(), counts=counts, stuck=stuck)

    async def queues_info(self) -> list[QueueInfo]:
        """Every queue the store knows, with its options and the counts of its jobs by state (from the rows)."""
        out = []
        for name in await self.queue_names():
            try:
                q = await self._queue(name)
            except _UNREADABLE as exc:
                # its database's file is missing, or not a database: listed, saying so, with the others (one
                # queue's database moved away made the listing, and an offline `tinystore status`, fail for every
                # queue; trial FQ: one whose file was not a database)
                opts = await self._stored_options(name)
                assert opts is not None  # (listed by queue_names)
                out.append(QueueInfo(queue=name, options=opts.to_wire(), error=exc.message))
                continue
            info = self._info(q)
            if not await self._readable(q):
                out.append(info)  # (its table is not committed yet: no row to count)
                continue
            rows = (await q.db.read(f"select state, count(*) from {TABLE} where queue = ? group by state", [name])).rows
            info.counts = {s: 0 for s in STATES} | {s: n for s, n in rows}
            out.append(info)
        return out

    def status(self) -> dict[str, Any]:
        """What ``store.status()["jobs"]`` shows: the queues (those still loading with ``loading`` true and their
        counts ``None``) and the stuck reports so far; the memory the
        engine keeps: ``claims_kept`` (claims remembered in case their answer was lost, at most
        :data:`CLAIMS_KEPT`), and per queue ``index`` (jobs not ended, about 250 bytes each) and ``deadlines``
        (timer items: delayed jobs, leases, ``expected`` times; at most about twice the live ones)."""
        queues = []
        for q in self.queues.values():
            info = self._info(q)
            queues.append(
                {
                    "queue": q.name,
                    "database": q.db.name,
                    "queued": info.counts["queued"],
                    "delayed": info.counts["delayed"],
                    "running": info.counts["running"],
                    "stuck": info.stuck,
                    "waiting_claims": sum(1 for w in q.waiters if not w.fut.done()),
                    "stuck_reports": q.stuck_reports,
                    "index": len(q.entries),
                    "deadlines": len(q.delayed) + len(q.leases) + len(q.stuck_at),
                    "loading": False,
                    "error": None,
                }
            )
        for name in self._loading:
            if name not in self.queues:
                # its jobs are being read into the index (after a start): listed all the same, its counts not known
                # yet (trial CB: a queue of 200,000 jobs went missing from status for seconds)
                queues.append(self._unloaded_row(name, loading=True, error=None))
        for name, error in self._load_errors.items():
            if name not in self.queues and name not in self._loading:
                # its load failed (its database missing, or not a database): listed, saying why (trial FS: it was
                # left out of the status of a running server)
                queues.append(self._unloaded_row(name, loading=False, error=error))
        return {
            "stuck_reports": self.stuck_reports,
            "claims_kept": len(self._claims),
            "claimed_attempts_kept": self._claimed_kept,
            "queues": queues,
        }

    def _unloaded_row(self, name: str, loading: bool, error: str | None) -> dict[str, Any]:
        """The status row of a queue not in the index (loading, or its load failed): its counts not known."""
        opts = self._options.get(name)
        return {
            "queue": name,
            "database": None if opts is None else opts.database,
            **dict.fromkeys(("queued", "delayed", "running", "stuck")),
            "waiting_claims": 0,  # (a claim waits for the load before it waits in the queue)
            "stuck_reports": 0,
            **dict.fromkeys(("index", "deadlines")),
            "loading": loading,
            "error": error,
        }

    def begin_stop(self) -> None:
        """The store begins to stop: waiting claims end at once (``UnavailableError``: the worker claims again
        from the next server), waiting watches return, and new ones are refused, so a graceful stop does not
        wait for long polls."""
        self.stopping = True
        for q in self.queues.values():
            for w in q.waiters:
                if not w.fut.done() and not w.claiming:
                    w.fut.set_exception(UnavailableError("jobs: the store is stopping; claim again once it is back"))
            for lst in q.watchers.values():
                for fut in lst:
                    if not fut.done():
                        fut.set_result(None)

    async def close(self) -> None:
        """Stop: timers stop, waiting claims and watches end with ``ClosedError``; running attempts stay running
        in their rows (the next start gives them a lease to renew, or retries them)."""
        if self.closed:
            return
        self.closed = True
        if self._claims_timer is not None:
            self._claims_timer.cancel()
            self._claims_timer = None
        for q in self.queues.values():
            q.close()
            for w in q.waiters:
                if not w.fut.done():
                    w.fut.set_exception(ClosedError("jobs: the store is stopping"))
            for lst in q.watchers.values():
                for fut in lst:
                    if not fut.done():
                        fut.set_result(None)
        for task in list(self._tasks):
            task.cancel()
        # the openings under way (of the jobs database, of a queue; shielded tasks that go on when the caller that
        # started them is cancelled, as a start cut short by a stop): awaited (they are short, and whoever waits
        # on them gets their outcome rather than a cancel), and their outcome retrieved, never left for "Task
        # exception was never retrieved"; one that does not end in time is cancelled
        opening: list[asyncio.Future[Any]] = [f for f in (self._jobs_db, *self._loading.values()) if f is not None]
        pending = [*self._tasks, *(f for f in opening if not f.done())]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for fut in opening:
            if fut.done():
                _retrieve(fut)
            else:
                fut.cancel()
                fut.add_done_callback(_retrieve)
