"""How the SDK reaches a store: in this process (:class:`LocalTransport`) or over a socket
(:class:`RemoteTransport`, with reconnects).

Both offer ``call(method, request, response_type, write=...)`` and push handlers. Over a socket, a dropped
connection is re-made by itself with exponential backoff and equal jitter (M. Brooker, "Exponential Backoff And
Jitter", AWS Architecture Blog, 2015: each wait drawn between half and all of it), STORE-06; a read whose answer was
lost is sent again; a write whose answer was lost raises ``OutcomeUnknownError`` and is never sent twice.

Both refuse a request whose encoding is over the frame limit (``Limits.frame_body_bytes``; over a socket, what
the server announced in ``WELCOME``) with ``LimitError`` before anything is sent or run, so the outcome of an
oversized request does not depend on the way the store is reached, and the connection goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import inspect
import itertools
import json
import logging
import os
import random
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import CoroutineType
from typing import Any, TypeVar

import msgspec

from ..errors import (
    ClosedError,
    InvalidError,
    LimitError,
    OutcomeUnknownError,
    ProtocolError,
    TinystoreError,
    UnauthenticatedError,
    UnavailableError,
    error_from,
)
from ..protocol import frames
from ..protocol.channels import GRANT, PUBLISH, UNSUBSCRIBE
from ..protocol.frames import Kind, body_too_large, request_frame
from ..protocol.locks import ACQUIRE, RELEASE, RENEW
from ..protocol.messages import ErrorBody, GoAway, Hello, Welcome, decode, decoder_for, encode, encode_answer
from ..protocol.store import Empty
from ..server.paths import check_socket_dir
from . import attempt_guard
from .sql import _TxMark, open_tx_mark
from .turns import pass_turn
from .unsendable import surrogate_named, unsendable

_RESPONSE = Kind.RESPONSE
_Future = asyncio.Future

log = logging.getLogger("tinystore.client")

PushHandler = Callable[[Any], None]
ReconnectHook = Callable[[int, int], Awaitable[None]]  # (old epoch, new epoch)
ConnectedHook = Callable[[Welcome], Awaitable[None]]

_PING = "store.ping"
_PING_BODY = encode(Empty())


_SUBJECTS = (("db", "database"), ("channel", "channel"), ("queue", "queue"), ("lock", "lock"))
# methods whose requests other bounds keep far below any frame limit (names of 64 characters, keys of 256, ids)
_SMALL_REQUESTS = frozenset(
    {GRANT, UNSUBSCRIBE, ACQUIRE, RENEW, RELEASE, "store.ping", "store.status", "clock.now", "clock.advance"}
)


# methods whose calls may wait at the server for as long as something else takes (the writer, a due job, a job's
# change, a key), and writes, which wait for the writer a transaction may hold. Each has a share of the
# request credit, and a reserve is left to the other calls, so that the calls that end those waits always go
# out: the statements of the transaction that holds the writer, a worker's claim of the job that many watch, a
# release. Past its share, a call waits in the SDK for its turn.
_PARKING = frozenset({"sql.begin", "jobs.claim", "jobs.wait", ACQUIRE, "sql.exec", "jobs.add"})
# of these, a statement or an add inside a transaction is not one: it goes out at once (the transaction holds
# the writer that the others wait for)
_IN_TX = frozenset({"sql.exec", "jobs.add"})


#: writes made inside one open transaction's fn (see :func:`~tinystore.client.sql.open_tx_mark`) that may be in
#: flight past their method's share
TX_EXTRA = 8


def parking_cap(max_inflight: int) -> int:
    """Calls of one :data:`_PARKING` method a connection may have in flight: an equal share of its credit
    less a reserve of 64 (a quarter, with a small credit); 160 of 1,024."""
    return max(1, (max_inflight - max(1, min(64, max_inflight // 4))) // len(_PARKING))


class _Turns:
    """The calls of one parking method: how many are in flight (those handed a turn included), and those waiting for
    their turn, which they get first come, first served: a turn freed is handed to the first waiting (counted as it
    is handed), so a call that comes later cannot take it first (trial GY: each call that ended was followed at once
    by its caller's next, which took the freed turn; the caller woken for it found none and went to the back of the
    line, and some callers waited as long as the flood lasted)."""

    __slots__ = ("count", "waiters")

    def __init__(self) -> None:
        self.count = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self, cap: int) -> bool:
        """A turn now (counted), when fewer than ``cap`` are in flight and no call waits for one."""
        waiters = self.waiters
        while waiters and waiters[0].done():  # (given up, or woken another way)
            waiters.popleft()
        if self.count < cap and not waiters:
            self.count += 1
            return True
        return False

    def release(self, cap: int) -> None:
        """A call's turn is over: handed on to those waiting, in their order, as far as ``cap`` allows."""
        self.count -= 1
        waiters = self.waiters
        while self.count < cap and waiters:
            w = waiters.popleft()
            if not w.done():
                self.count += 1
                w.set_result(None)


def too_large(method: str, request: Any, size: int, limit: int, subject: str = "") -> LimitError:
    """The ``LimitError`` of a request of ``method`` whose encoding (``size`` bytes) is over the frame limit,
    naming what it is about (``database app: sql.exec: the request is ... bytes``): ``subject`` when given,
    else the database, channel, queue or lock the request names."""
    if not subject:
        named = _named(request)
        subject = f"{named[0]} {named[1]}" if named is not None else ""
    return body_too_large(f"{subject}: {method}" if subject else method, size, limit)


def _named(request: Any) -> tuple[str, str] | None:
    """The kind and name of the database, channel, queue or lock ``request`` names, if any."""
    for attr, kind in _SUBJECTS:
        name = getattr(request, attr, None)
        if isinstance(name, str) and name:
            return kind, name
    return None


def _about(method: str, request: Any) -> str:
    """``method`` and what its request is about, as an error's message begins (API.md: each message names the thing
    it is about): ``sql.exec: database app``, ``sql.exec: database app: transaction 7``, ``channels.publish: channel
    chat: branch ['7']``, ``jobs.report: queue mail: job 01j…``, ``locks.acquire: lock summaries: key "7"``."""
    parts = [method]
    named = _named(request)
    if named is not None:
        kind, name = named
        parts.append(f"{kind} {name}")
        if kind == "channel":
            branch = getattr(request, "branch", None)
            if isinstance(branch, list) and branch:
                parts.append(f"branch {branch!r}")
        elif kind == "lock":
            key = getattr(request, "key", None)
            if isinstance(key, str):
                parts.append(f"key {json.dumps(key, ensure_ascii=False)}")
        elif kind == "queue":
            job = getattr(request, "id", None)
            if isinstance(job, str) and job:
                parts.append(f"job {job}")
    tx = getattr(request, "tx", 0)
    if type(tx) is int and tx:
        parts.append(f"transaction {tx}")
    return ": ".join(parts)


CLOSE_WRITES_WAIT = 10.0
"""Seconds a store's close waits, in all, for what is under way: its parts' ends (subscriptions, leases), then the
answers of the writes in flight (one still unanswered then raises ``OutcomeUnknownError``)."""


T = TypeVar("T")


class Transport:
    """What the engine clients need of a way to reach the store."""

    local = False
    epoch = 0
    test_clock = False
    description = ""
    max_body = frames.DEFAULT_MAX_BODY  # the largest request body the store accepts (its frame limit)

    def __init__(self) -> None:
        self.push_handlers: dict[str, tuple[PushHandler, Any]] = {}
        self.reconnect_hooks: list[ReconnectHook] = []
        self.lost_hooks: list[Callable[[], None]] = []  # called (on the loop) when the connection drops
        # called (on the loop) with the server's reason when it says that it is stopping (its GOAWAY at a graceful
        # stop), before the connection drops: nothing it holds for this client outlives it
        self.stopping_hooks: list[Callable[[str], None]] = []
        # called (on the loop) with the error when the store will not be reached again as things are: gone from its
        # path for good, or refusing this client's token at a reconnect (what lives across reconnects ends then)
        self.failed_hooks: list[Callable[[TinystoreError], None]] = []
        # when (time.monotonic()) the server last said it was stopping (a graceful stop: a call refused, or its
        # GOAWAY); kept once the next one is reached: a worker counts its leases from it until it has renewed them
        # there (trial JB: reset at the reconnect, a healthy attempt was counted from its last renewal before the
        # stop, and refused a second after a quick restart, well within its lease)
        self.server_stopped_at: float | None = None
        self.reconnected_at = 0.0  # (monotonic) the last reconnect: a stop said before it is no reason to poll
        self.closed = False
        # when (time.monotonic()) the store's close gives up waiting for what is under way: one bound for all it
        # waits for (the SDK's parts, then the writes in flight), set as the close begins (see close_left)
        self.close_deadline: float | None = None
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    def close_left(self, most: float = CLOSE_WRITES_WAIT) -> float:
        """Seconds a part of the store's close may still wait: ``most``, or less once the close's one bound
        (:data:`CLOSE_WRITES_WAIT` from its start) is nearer (trial HW: the channels', the locks' and the
        connection's waits of a close added up to 20 s with the server frozen)."""
        if self.close_deadline is None:
            return most
        return max(0.0, min(most, self.close_deadline - time.monotonic()))

    def track_read(self, fut: asyncio.Future[T]) -> asyncio.Future[T]:
        """``fut``, a read's of this process's engines, ended by the close if it is still under way then (an
        embedded store's: :class:`LocalTransport`)."""
        return fut

    def give_up(self, exc: TinystoreError) -> None:
        """The store will not be reached again (its private server stopped or gone with its directory): every call
        from now raises ``exc``, and :attr:`failed_hooks` are told."""
        self.failed(exc)

    def failed(self, exc: TinystoreError) -> None:
        """Tell :attr:`failed_hooks` that the store will not be reached again as things are (``exc`` says why)."""
        for hook in list(self.failed_hooks):
            try:
                hook(exc)
            except Exception:
                log.exception("a hook of a store that cannot be reached failed")

    def other_loop(self) -> InvalidError:
        """The error of a call made on another event loop than the one the store was opened on (its
        connection and futures belong to that loop)."""
        return InvalidError(
            f"store {self.description}: used from another event loop than the one it was opened on (a store "
            "belongs to one loop: open one in this loop; with a loop per test, a store per test)"
        )

    @property
    def connected(self) -> bool:
        """Whether a call sent now goes out at once (over a socket: a connection is up; in this process: not
        closed). Calls made meanwhile wait for the SDK to reconnect."""
        return not self.closed

    async def reached(self, within: float) -> bool:
        """Wait up to ``within`` seconds for the store to be reached: ``False`` when the SDK is still trying to
        reach it then (stopped, restarting, unreachable); ``True`` at once when :attr:`connected`, as the SDK's
        next connection is up, or when it stopped trying (closed, or given up: the next call raises why). A cancel
        leaves nothing behind."""
        return True

    def on_push(self, method: str, handler: PushHandler, body_type: Any = Any) -> None:
        """Call ``handler(body)`` for each push of ``method`` (``body`` decoded as ``body_type``)."""
        self.push_handlers[method] = (handler, body_type)

    async def call(
        self,
        method: str,
        request: Any,
        response_type: Any = Any,
        *,
        write: bool = False,
        retry: bool = True,
        undo: Callable[[bytes], None] | None = None,
        sent: Callable[[float], None] | None = None,
        still: Callable[[], Any] | None = None,
    ) -> Any:
        """Call ``method`` with ``request``; its answer decoded as ``response_type``. Raises ``LimitError``
        when the request's encoding is over the frame limit (nothing is sent), ``ClosedError``, and what the
        method raises.

        ``undo(answer)`` (the answer's bytes): for a call whose answer hands the caller something the server keeps
        for it (a transaction's id): called when the call is cancelled yet its answer comes all the same (sent
        before the server read the cancel, or with the cancel in one loop turn), so that what it handed over is
        given back. In this process a cancel reaches the method itself, which gives back what it made.

        ``sent(t)``: called with the loop's time as the request is written to a connection (again at each
        sending); never in this process.

        ``still()``: asked as the request is about to be written to a connection, and again as it is written (at
        each sending): a batch of several callers' items, some of whom may be a job's handler whose attempt went
        past its lease meanwhile. It returns the request to send (``request`` itself, or another made of the items
        left: written in its place, where it was queued, so that nothing else moves), or ``False`` when no item is
        left: nothing is sent, and :class:`~.attempt_guard.Withdrawn` is raised. Never asked in this process, where
        no call is guarded. A call made by a job's handler is asked of its attempt (see :mod:`.attempt_guard`) as it
        begins and again at those two moments; one refused then is not sent, and nothing else moves."""
        raise NotImplementedError

    def call_first(
        self, method: str, request: Any, response_type: Any = Any, *, write: bool = False
    ) -> asyncio.Future[Any]:
        """:meth:`call` in a task of its own, started now, that every call made after this one waits behind (until
        its answer). Returns the task, whose outcome is the call's."""
        return asyncio.ensure_future(self.call(method, request, response_type, write=write))

    def call_now(self, method: str, request: Any) -> Any:
        """In this process only (``local``): the method's result as the core gives it (a value, or something
        to await: a future, a coroutine, a ``Later``), with no coroutine of the transport in between. Raises
        ``LimitError`` (the request's encoding is over the frame limit), ``ClosedError``."""
        raise NotImplementedError

    def check_size(self, method: str, request: Any, db: str = "") -> None:
        """Raise ``LimitError`` (naming the database ``db``, else what ``request`` names) when ``request`` would
        not fit a frame. For calls that bypass :meth:`call` in this process (``local``); over a socket,
        :meth:`call` checks the encoding it sends, and this does nothing."""

    def sql_database(self, name: str) -> Any:
        """In this process only: the engine's open database ``name`` (a ``SqlDatabase``), or ``None``."""
        return None

    def turn_spent(self) -> bool:
        """In this process only: count a call made without :meth:`call`; whether the turn's budget of calls was
        spent (then await :func:`pass_turn` before making it, and count it again)."""
        return False

    async def close(self) -> None:
        raise NotImplementedError


INLINE_TURN_CALLS = 512
"""The calls of an embedded store's SDK made in one turn of the event loop before the next lets it turn (see
``LocalTransport.turn_spent``)."""

ROLLBACK = "sql.rollback"

QUERY = "sql.query"
WAITED_AT_CLOSE = frozenset({"sql.exec", "sql.commit", "jobs.add", "jobs.cancel", "jobs.retry"})
"""The writes of an embedded store's SDK that its close waits for while they run (not a claim's or a lock's wait,
which the close ends)."""

INLINE_TURN_SECONDS = 0.005
"""Seconds from the first call of an embedded store's SDK in one turn of the event loop after which the next lets
it turn, however few calls were made (see ``LocalTransport.turn_spent``)."""


class LocalTransport(Transport):
    """The engines of this process (embedded): calls go straight to the core, nothing is sent encoded (a
    request's encoding is only measured, so that one past the frame limit is refused as over a socket)."""

    local = True

    def __init__(self, core: Any) -> None:
        super().__init__()
        self.core = core
        self.session = core.new_session(self._push, local=True, name="embedded")
        self.epoch = core.epoch
        self.test_clock = core.clock.is_test
        self.description = f"embedded:{core.directory}"
        limits = core.limits
        self.max_body = limits.frame_body_bytes
        # nothing is encoded in this process, but a request that a socket could not carry is refused all the
        # same: its encoding is measured in a buffer kept for that (no allocation for the usual small one) —
        # except for the methods whose requests are small by other bounds (names, keys, a payload the channel
        # checked against channel_message_bytes), which are the hot ones
        self._measure = msgspec.msgpack.Encoder().encode_into
        self._scratch = bytearray(256)
        small = set(_SMALL_REQUESTS)
        if limits.channel_message_bytes + 65536 <= limits.frame_body_bytes:
            small.add(PUBLISH)
        self._small = frozenset(small)
        self._turn_calls = 0
        self._turn_began = 0.0
        self._writes: set[asyncio.Future[None]] = set()  # (see WAITED_AT_CLOSE)
        # reads on the databases' reader threads under way: ended at close (ClosedError), their statements
        # interrupted, as a socket's close ends its reads at the server (trial IE: a close waited 10 s for one)
        self._reads: set[asyncio.Future[Any]] = set()

    def _push(self, method: str, body: Any) -> None:
        entry = self.push_handlers.get(method)
        if entry is not None:
            entry[0](body)

    async def call(
        self,
        method: str,
        request: Any,
        response_type: Any = Any,
        *,
        write: bool = False,
        retry: bool = True,
        undo: Callable[[bytes], None] | None = None,
        sent: Callable[[float], None] | None = None,
        still: Callable[[], Any] | None = None,
    ) -> Any:
        if self.closed and (method != ROLLBACK or self.session.closed):
            # (a rollback still goes while the close waits for the writes: one may wait for the writer it holds)
            raise ClosedError(f"store {self.core.directory} is closed")
        if asyncio.get_running_loop() is not self.loop:
            raise self.other_loop()
        if self.turn_spent():
            # (before the call, not after: a cancel here leaves nothing done, a lease taken or a job added; before
            # the size check too: a loop of refused calls turns as well, trial HU)
            await pass_turn()
            self.turn_spent()
        if method not in self._small:
            self.check_size(method, request)
        ended: asyncio.Future[None] | None = None
        try:
            result = self.core.invoke(self.session, method, request)
            if isinstance(result, _Future) or type(result) is CoroutineType:
                pass
            elif isinstance(result, msgspec.Struct) or not inspect.isawaitable(result):
                return result
            if write and method in WAITED_AT_CLOSE:
                # (a close waits for it before the engines stop, as a socket's close waits for the writes it sent:
                # trial HY, a big add_many under way was rolled back by an embedded store's close)
                ended = self.loop.create_future()
                self._writes.add(ended)
            elif method == QUERY and type(result) is _Future:
                self.track_read(result)
            return await result
        except InvalidError as exc:
            named = surrogate_named(exc, method, request)
            if named is None:
                raise
            raise named from None
        except UnavailableError as exc:
            raise self._closing(exc) from None
        finally:
            if ended is not None:
                self._writes.discard(ended)
                ended.set_result(None)

    def turn_spent(self) -> bool:
        """Count a call; whether :data:`INLINE_TURN_CALLS` calls were made already in this turn of the loop, or
        :data:`INLINE_TURN_SECONDS` have passed since its first. Most
        calls in this process are answered with nothing to await (a job's state, a publish, a lease taken), so
        that a caller that called in a loop with no other await never let the loop turn, everything else of the
        process waiting, the store's socket too (trial HQ: 3,000 ``queue.get`` in a row, not one other task ran):
        past that many, a call lets the loop turn first."""
        n = self._turn_calls
        if n == 0:
            asyncio.get_running_loop().call_soon(self._end_turn)
            self._turn_calls = 1
            self._turn_began = time.perf_counter()
            return False
        self._turn_calls = n + 1
        # (and past some milliseconds: trial HY, 512 calls of status() with 100 queues held the loop for a second)
        return n >= INLINE_TURN_CALLS or time.perf_counter() - self._turn_began > INLINE_TURN_SECONDS

    def _end_turn(self) -> None:
        self._turn_calls = 0

    async def _call_next_turn(self, method: str, request: Any) -> Any:
        """:meth:`call_now` once the loop has turned (a cancel before leaves nothing done)."""
        await pass_turn()
        result = self.call_now(method, request)
        if isinstance(result, msgspec.Struct) or not inspect.isawaitable(result):
            return result
        return await result

    def call_now(self, method: str, request: Any) -> Any:
        if self.closed:
            raise ClosedError(f"store {self.core.directory} is closed")
        if asyncio.get_running_loop() is not self.loop:
            raise self.other_loop()
        if self.turn_spent():
            return self._call_next_turn(method, request)
        if method not in self._small:
            self.check_size(method, request)
        try:
            result = self.core.invoke(self.session, method, request)
        except UnavailableError as exc:
            raise self._closing(exc) from None
        if method in WAITED_AT_CLOSE:
            # (a db.exec's: waited for by a close, as call's are; the engine's Later, awaited through its future)
            as_future = getattr(result, "future", None)
            waited = as_future() if as_future is not None else result
            if type(waited) is _Future:
                self._writes.add(waited)
                waited.add_done_callback(self._writes.discard)
        elif method == QUERY and type(result) is _Future:
            self.track_read(result)
        return result

    def track_read(self, fut: asyncio.Future[T]) -> asyncio.Future[T]:
        """``fut``, a read's on a reader thread, ended by :meth:`close` if it is still under way then."""
        self._reads.add(fut)
        fut.add_done_callback(self._reads.discard)
        return fut

    def _closing(self, exc: UnavailableError) -> TinystoreError:
        """What a call the engines refused as they stop raises here: the engines stop only with this program's
        ``store.close()`` (``tinystore stop`` refuses an embedded store), which has no next server to try, so
        ``ClosedError`` (trial GT: a transaction waiting for the writer raised "try again later"). Any other
        ``UnavailableError`` (a disk full, a file gone) stays as it is."""
        if exc.extra.get("refused"):
            return ClosedError(f"store {self.core.directory} is closed: {exc.message}")
        return exc

    def check_size(self, method: str, request: Any, db: str = "") -> None:
        scratch = self._scratch
        try:
            self._measure(request, scratch)
        except (TypeError, ValueError, OverflowError, BufferError):
            # not a wire value as it is (a memoryview of a buffer that is not contiguous, a released one): the
            # engine tells what is wrong with it, or takes it (its bytes), as a socket's SDK does
            return
        size = len(scratch)
        if size > 65536:
            self._scratch = bytearray(256)  # do not keep a large buffer
        if size > self.max_body:
            raise too_large(method, request, size, self.max_body, f"database {db}" if db else "")

    def sql_database(self, name: str) -> Any:
        if self.closed:
            raise ClosedError(f"store {self.core.directory} is closed")
        if asyncio.get_running_loop() is not self.loop:
            raise self.other_loop()
        return self.core.sql.databases.get(name)

    async def close(self) -> None:
        """Refuse new calls; end the reads under way (``ClosedError``); wait for the writes under way
        (:data:`WAITED_AT_CLOSE`) up to the close's bound (``close_left``), as a socket's close waits for the
        answers of the writes it sent; then end the session
        (what still runs of it is stopped with the engines). A cancel leaves the session open to the engines'
        stop."""
        if not self.closed:
            self.closed = True
            # (the reads first: one beside a long write ran on for the whole wait for the writes: trial IK)
            for fut in list(self._reads):
                if not fut.done():
                    # (its reader sees it done and interrupts the statement, within some 10,000 instructions)
                    fut.set_exception(ClosedError(f"store {self.core.directory} was closed while the read ran"))
            if self._writes:
                await asyncio.wait(list(self._writes), timeout=self.close_left())
            self.session.close()


def another_store(where: str | os.PathLike[str], found: str, used: str) -> UnavailableError:
    """The error (``gone``) of a client that reached another store than the one of id ``used`` (``Welcome.store``)
    at ``where``: found ``found`` ("" when it has none)."""
    return UnavailableError(
        f"the store at {where} is another store now (id {found or 'none'}; this process used {used}): the one it "
        "used was moved or removed and another made in its place, a backup was restored there (back in time), or "
        "its ID file was lost; not going on with it (open it anew to use it)",
        gone=True,
    )


_DECODERS: dict[Any, Callable[[bytes], Any]] = {}


RECONNECT_TIMEOUT = 30.0
"""Seconds a call waits for its server to come back, unless the store was opened with another ``reconnect_timeout``."""
HANDSHAKE_WAIT = 15.0
"""Seconds a connection waits for the server's answer to its handshake before it gives up (``UnavailableError``:
a server stopped or stuck); less when the client's ``reconnect_timeout`` is (2 s at the least)."""
HANDSHAKE_WAIT_MIN = 2.0
# the socket's buffer of requests not yet taken by the server: new requests wait above HIGH_WATER bytes until it
# is down to LOW_WATER (a frame is never cut: one request of up to the frame limit goes whole)
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1024 * 1024


class _Lost(Exception):
    """The connection dropped before the answer came. ``in_doubt``: nothing said whether the server read the request
    (no GOAWAY came with its last request read): the next server may tell (see ``RemoteTransport._never_read``).
    ``out_of_memory``: this process dropped it, having no memory for what the server sent."""

    def __init__(self, message: str, in_doubt: bool = False, out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt
        self.out_of_memory = out_of_memory


OUT_OF_MEMORY_TRIES = 2
"""A read whose connection this process dropped for want of memory is sent again once; then it fails."""


class _Starved(Exception):
    """The answer came, but this process had no memory to hold it (the connection goes on)."""


IN_DOUBT_WAIT = 10.0
"""Seconds a write whose connection dropped, with nothing said of whether the server read it, waits for the next
connection to learn that (then, or when no connection comes, it is ``OutcomeUnknownError``)."""


class _Withheld(Exception):
    """A request held back as it was to be written (see ``_ClientConn.flush``): not sent; its call asks its guard
    again."""


def _lets(guard: Callable[[str], None], method: str) -> bool:
    """Whether ``guard`` (a job's handler's) lets a call of ``method`` be written."""
    try:
        guard(method)
    except Exception:
        return False
    return True


_Queued = tuple[bytes, int, str, Any, "Callable[[str], None] | None", "Callable[[], Any] | None"]
"""A request of this turn's ``out`` that may still be held back, or written anew (see ``_ClientConn.flush``): its
frame, stream, method and request, its caller's guard, its batch's ``still``."""


class _NotSent(Exception):
    """The connection dropped before the request was written: it never reached the server (or the server said it
    never read it). ``out_of_memory``: the server dropped the connection having no memory to take it in."""

    def __init__(self, out_of_memory: bool = False) -> None:
        super().__init__()
        self.out_of_memory = out_of_memory


class NotRunError(UnavailableError):
    """A call made with ``retry=False`` that the server refused without running it (it is stopping): its caller
    may send it again once the next server is reached."""


class _Refused(Exception):
    """The server refused the request without running it (it is stopping)."""


class _HandshakeClosed(Exception):
    """The server closed the connection before it answered the handshake (no GOAWAY, no ERROR). ``reset``: it was
    reset or broke (``ECONNRESET``, ``EPIPE``): a server that closed it with the HELLO unread (one crowded by
    connections waiting for their handshake, whose refusal the reset overtook) or that died, not one that refused
    it."""

    def __init__(self, message: str, reset: bool = False, crowded: bool = False) -> None:
        super().__init__(message)
        self.reset = reset
        self.crowded = crowded


# how a connection the server closed in its handshake without a word ends: reset, or broken under the HELLO's write
_BROKEN = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


async def _speaks_tls(host: str, port: int) -> bool:
    """Whether what listens at ``host:port`` completes a TLS handshake (its certificate not checked: nothing is sent
    over it), within 2 s: to tell a TLS listener, which closes a plain-text client at once, from a forwarder whose
    backend is not up, which closes every connection alike."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(2.0):
            transport, _ = await loop.create_connection(
                asyncio.Protocol, host, port, ssl=ctx, ssl_handshake_timeout=2.0
            )
    except (OSError, ssl.SSLError, TimeoutError, EOFError):
        return False
    transport.close()
    return True


class _Transient(UnavailableError):
    """A first connection that failed for a reason that passes (nothing listens yet, the server reset it, it is
    crowded with connections waiting for their handshake): :meth:`RemoteTransport.connect` with ``wait`` tries
    again. Never seen by callers: raised as a plain ``UnavailableError`` at the end."""


#: what a server says when it closes a connection because too many wait for their handshake (older servers say
#: only this; newer ones add ``crowded`` to the error's extra)
CROWDED = "too many connections are waiting for their handshake"

# reaching the server failed for a reason that passes: nothing listens yet (a server starting, or restarting), a
# reset or an abort (a server crowded with connections in their TLS handshake closes the oldest), a name the
# resolver could not look up for now
_PASSING = (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError)


def _answered(fut: asyncio.Future[Any]) -> bool:
    """Whether ``fut`` is done with a result (neither cancelled nor failed)."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _full_backlog(exc: BaseException | None) -> bool:
    """Whether ``exc`` says a Unix socket's listen backlog was full: Linux answers the connect with ``EAGAIN`` and
    does not go on with it in the background, so the connection asyncio took as made then fails ``ENOTCONN``."""
    return isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.ENOTCONN)


def _passes(exc: BaseException) -> bool:
    """Whether ``exc``, raised while reaching a server, is of the kind that passes (see ``_PASSING``)."""
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN
    return isinstance(exc, _PASSING)


def backoff(attempt: int) -> float:
    """Seconds to wait before try ``attempt`` (0, 1, ...) to reach a server: exponential backoff with equal
    jitter, 50 ms doubling to a 2 s cap, times uniform(0.5, 1) (never 0: a server restarting is not hammered, nor
    left waiting for a client that drew a long nothing)."""
    return min(2.0, 0.05 * 2.0 ** min(attempt, 16)) * random.uniform(0.5, 1.0)


RESTART_POLL = 0.25
"""Seconds a reconnect waits at most between tries (times uniform(0.5, 1)) in the :data:`RESTART_WATCH` seconds
after a server said it was stopping: a graceful stop is most often a restart, and a worker's leases count from the
stop's last word until it renews them on the next server (trial JH: reached 0.7 s after the next server was up, with
the backoff's longer waits, a 3 s lease was given up before its renewal)."""
RESTART_WATCH = 60.0


def reconnect_delay(attempt: int, stopped_at: float | None, now: float) -> float:
    """Seconds to wait before reconnect try ``attempt`` (0, 1, ...): :func:`backoff`, at most :data:`RESTART_POLL`
    (times uniform(0.5, 1)) within :data:`RESTART_WATCH` seconds of a server's word that it was stopping
    (``stopped_at``, ``time.monotonic()``)."""
    delay = backoff(attempt)
    if stopped_at is not None and now - stopped_at < RESTART_WATCH:
        delay = min(delay, RESTART_POLL * random.uniform(0.5, 1.0))
    return delay


SALVAGE_MAX = 64 * 1024 * 1024
"""At most this many bytes are read from a connection that failed on a write (see ``_ClientConn.salvage``)."""


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark the outcome of ``fut`` as read (a failure nobody awaits is no news)."""
    if not fut.cancelled():
        fut.exception()


class _ClientConn(asyncio.Protocol):
    def __init__(self, owner: RemoteTransport) -> None:
        self.owner = owner
        self.conn = frames.Connection("client")
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.chunks: dict[int, list[bytes]] = {}
        self.welcome: asyncio.Future[Welcome] = self.loop.create_future()
        # its failure is read here too: a connection given up on while it was being made (the connect cancelled
        # as the connection was made: asyncio closes it, and connection_lost fails this future) has nobody left to
        # await it, and it was logged as "Future exception was never retrieved" (24 clients of a killed sidecar)
        self.welcome.add_done_callback(_retrieved)
        self.epoch = 0  # the server's, once the handshake is done
        self.number = 0  # which connection of its transport (Hello.connection)
        self.goaway: str | None = None
        self.goaway_last: int | None = None  # the server's last request read, told in its GOAWAY
        self.stopping = False  # the GOAWAY said the store is stopping (a graceful stop)
        # the calls whose answers this process had no memory for as it dropped the connection (see data_received)
        self.starving: set[int] = set()
        self.passing: set[int] = set()  # streams whose answer's parts are passed over (see starve)
        self.server_starved = False  # the server's GOAWAY said it had no memory to take in what this client sent
        self.lost = False
        self.gone = asyncio.Event()  # set once the connection is lost
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.out: list[bytes] = []
        self.unsent: set[int] = set()  # requests queued but not yet written: safe to send again
        # the requests of this turn's out that a guard may still hold back (see attempt_guard): see _Queued
        self.withheld: list[_Queued] = []
        self.writes: set[int] = set()  # the writes in flight (see RemoteTransport.close)
        # cancelled calls whose answer, should it come after all, must be undone: stream → (undo, barrier); see
        # RemoteTransport.call's ``undo``
        self.orphans: dict[int, tuple[Callable[[bytes], None], int]] = {}
        # answers that came for a call cancelled in that loop turn (its future cancelled, its task not yet told):
        # the call takes its answer from here as it ends
        self.late: dict[int, bytes] = {}
        self.flush_scheduled = False
        self.last_rx = self.loop.time()  # when bytes last came from the server (the keep-alive's clock)
        self.last_tx = self.last_rx  # when bytes last went to it (a client silent too long is dropped by it)
        self.keepalive: asyncio.Task[None] | None = None
        self.paused = False  # the server does not read what we send: new requests wait (see pause_writing)

    def salvage(self) -> None:
        """The connection failed on a write (the server had closed it: EPIPE, a reset) before what the server sent
        last was read: its answers and its GOAWAY, which says the last request it read, may still wait in the
        socket. Read them now, so that the calls it answered are answered and the ones it never read are sent
        again to the next server, writes too (else a client whose loop was busy through a stop would take each
        pending write for one that may have committed). Done where the event loop's transport keeps its socket
        open until ``connection_lost`` returns (asyncio's own); elsewhere (uvloop), nothing is read."""
        sock = getattr(self.transport, "_sock", None)
        if not isinstance(sock, socket.socket) or sock.fileno() < 0:
            return
        chunks: list[bytes] = []
        size = 0
        while size < SALVAGE_MAX:
            try:
                chunk = sock.recv(1 << 16)
            except OSError:  # (nothing more now, or the reset took the rest)
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if chunks:
            self.data_received(b"".join(chunks))

    def going(self) -> bool:
        """Whether the connection is closing: a request written now would be lost unsent."""
        return self.lost or self.goaway is not None or self.transport is None or self.transport.is_closing()

    async def wait_gone(self) -> None:
        """Wait until the connection is lost (aborting it when the server is slow to close it)."""
        try:
            async with asyncio.timeout(15.0):
                await self.gone.wait()
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            await self.gone.wait()

    def send(self, data: bytes, stream: int = 0) -> None:
        """Queue ``data``; what one loop turn queues goes out in one write."""
        self.out.append(data)
        if stream:
            self.unsent.add(stream)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        self.unsent.clear()
        if self.withheld:
            out = self._hold_back(out)
        if out and self.transport is not None and not self.lost:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self.last_tx = self.loop.time()

    def _hold_back(self, out: list[bytes]) -> list[bytes]:
        """``out`` without the requests of a job's handler queued in a loop turn that the event loop was then
        blocked in, past the attempt's lease (trial IO: a publish queued before a 3 s block went out after it), and
        with each batch that held one of them made anew of its other items, in its place (trial IR: a batch sent
        again later went out after the turn's next one). Nothing else is held back or moved (trial IU: holding
        back what came after it put other code's writes, and lock asks, out of order). A request held back is not
        sent: its call raises (its guard's ``LostError``; a batch left with no item, ``Withdrawn``)."""
        withheld, self.withheld = self.withheld, []
        for frame, stream, method, request, guard, still in withheld:
            remade: bytes | None = None
            if guard is not None and not _lets(guard, method):
                pass
            elif still is not None:
                now = still()
                if now is request:
                    continue
                if now is not False:
                    remade = request_frame(stream, method, encode_answer(now))
            else:
                continue
            at = next((i for i, f in enumerate(out) if f is frame), None)
            if at is None:
                continue
            if remade is not None:
                out[at] = remade
                continue
            del out[at]
            fut = self.pending.pop(stream, None)
            if fut is not None and not fut.done():
                fut.set_exception(_Withheld())
            self.release()
        return out

    def answered(self, stream: int, body: bytes | None) -> None:
        """An answer came (``body``; ``None`` for an error) while cancelled calls wait to learn whether theirs
        comes: the answer of a cancelled call is undone. The server reads a ``CANCEL`` before any request sent
        after it and writes its answers in order, so an answer to such a request (a stream past the cancelled
        call's barrier) means the cancelled call's answer came before it or never comes."""
        entry = self.orphans.pop(stream, None)
        if entry is not None:
            if body is not None:
                try:
                    entry[0](body)
                except Exception:
                    log.exception("undoing the answer of a cancelled call")
            return
        for s, (_, barrier) in list(self.orphans.items()):
            if stream > barrier:
                del self.orphans[s]

    def release(self) -> None:
        """A request ended: hand its credit to the next waiting caller."""
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        """Over ``HIGH_WATER`` bytes wait unsent: the server reads no more for now (it is slow, or it holds
        this connection back while its cancelled writes run). New requests wait until :meth:`resume_writing`,
        so what this process buffers stays bounded; cancels and answers to pushes still go out."""
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiters = self.waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.loop.time()
        conn = self.conn
        pending = self.pending
        try:
            conn.receive_data(data)
            while True:
                batch = conn.next_frames()
                if not batch:
                    return
                for kind, flags, stream, method, body in batch:
                    if kind is _RESPONSE and not flags and not self.chunks and not self.passing:
                        # the usual answer: one whole frame
                        fut = pending.pop(stream, None)
                        if self.waiters:
                            self.release()
                        if fut is not None:
                            if not fut.done():
                                fut.set_result(body)
                            elif fut.cancelled():
                                self.late[stream] = body
                        if self.orphans:
                            self.answered(stream, body)
                    else:
                        self.on_frame(kind, flags, stream, method, body)
        except ProtocolError as exc:
            self.goaway = f"protocol error from the server: {exc.message}"
            if not self.welcome.done():
                # (trial CK: an HTTP server on the port answered "frame body of 1213486105 bytes", "HTTP" read as
                # a length)
                self.goaway += " (before its welcome: what listens there does not speak TinyStore's protocol; is it "
                self.goaway += "the store's address and port?)"
            if self.transport is not None:
                self.transport.close()
        except MemoryError:
            # no memory in this process for what came, and not in one answer's frames (below): the bytes buffered
            # (trial EG: each reconnect sent the read again, for ever, with a traceback each). The connection is
            # dropped; the calls whose answers were coming in parts then (else every call pending on it) count it
            # against their being sent again (see RemoteTransport.call)
            self.starving = set(self.chunks) or set(self.pending)
            self.chunks.clear()
            self.goaway = "this process ran out of memory (MemoryError) reading the store's answers"
            if self.transport is not None:
                self.transport.abort()

    def starve(self, stream: int) -> None:
        """The answer of ``stream`` came, but this process had no memory to hold it: its call fails (``_Starved``),
        the connection going on; the rest of its parts, if any, are passed over as they come."""
        self.chunks.pop(stream, None)
        fut = self.pending.pop(stream, None)
        if self.waiters:
            self.release()
        if fut is not None and not fut.done():
            fut.set_exception(_Starved())
        self.orphans.pop(stream, None)

    def on_frame(self, kind: Kind, flags: int, stream: int, method: str, body: bytes) -> None:
        if kind is Kind.RESPONSE:
            passed = self.passing
            if passed and stream in passed:
                if not flags & frames.MORE:
                    passed.discard(stream)  # (its last part: what comes on this stream after it is new)
                return
            if flags & frames.UNREAD:
                self.starve(stream)
                if flags & frames.MORE:
                    self.passing.add(stream)
                return
            if flags & frames.MORE:
                self.chunks.setdefault(stream, []).append(body)
                return
            parts = self.chunks.pop(stream, None)
            if parts is not None:
                parts.append(body)
                try:
                    body = b"".join(parts)
                except MemoryError:
                    del parts
                    self.starve(stream)
                    return
            fut = self.pending.pop(stream, None)
            if self.waiters:
                self.release()
            if fut is not None:
                if not fut.done():
                    fut.set_result(body)
                elif fut.cancelled():
                    self.late[stream] = body
            if self.orphans:
                self.answered(stream, body)
        elif kind is Kind.PUSH:
            self.owner._dispatch_push(method, body)
        elif kind is Kind.ERROR:
            err = decode(body, ErrorBody)
            exc: BaseException = error_from(err.code, err.message, err.extra)
            if err.code == InvalidError.code and err.message.startswith("unknown method ") and _answered(self.welcome):
                # a client newer than the server it reached (one left running across an upgrade: trial GZ)
                welcome = self.welcome.result()
                exc = InvalidError(
                    f"{err.message}: the server (pid {welcome.pid}, tinystore {welcome.server_version}) does not know "
                    "it: if it runs an older TinyStore than this client's (left running across an upgrade), restart "
                    "it with this one (a sidecar: `tinystore stop DIR`, and the next open starts this version)",
                    **err.extra,
                )
            if stream != 0 and err.code == UnavailableError.code and err.extra.get("refused"):
                exc = _Refused(err.message)
                if self.owner._conn is self:
                    self.owner.server_stopped_at = time.monotonic()  # (refused as it stops: GOAWAY comes later)
            if stream == 0:
                if not self.welcome.done():
                    self.welcome.set_exception(exc)
                return
            self.chunks.pop(stream, None)
            fut = self.pending.pop(stream, None)
            if self.waiters:
                self.release()
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            if self.orphans:
                self.answered(stream, None)
        elif kind is Kind.WELCOME:
            self.conn.handshaken = True
            if not self.welcome.done():
                self.welcome.set_result(decode(body, Welcome))
        elif kind is Kind.GOAWAY:
            try:
                goaway = decode(body, GoAway)
                self.goaway, self.goaway_last = goaway.reason, goaway.last_stream
                self.server_starved = goaway.code == "out_of_memory"
                # (an older server does not say ``stopping``: its stop's GOAWAY is the one with this code and a
                # last stream read)
                self.stopping = goaway.stopping or (goaway.code == "unavailable" and goaway.last_stream is not None)
            except Exception:
                self.goaway = "the server closed the connection"
            if self.stopping:
                # told before the connection drops, and so before any reconnect: what the store held for this
                # client (its leases) ends now, not when the next server is reached (LOCK-07)
                self.owner._on_stopping(self)
            # The server answers nothing after a GOAWAY and reads nothing more: drop the connection now, so
            # that the calls still pending fail at once (connection_lost) rather than wait for a close that a
            # write stuck in our buffer (the server stopped reading) could hold back for ever.
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.goaway is None and not self.lost:
            self.salvage()
        self.lost = True
        self.gone.set()
        if not self.welcome.done():
            if self.goaway:
                self.welcome.set_exception(UnavailableError(self.goaway))
            else:
                self.welcome.set_exception(
                    _HandshakeClosed(
                        f": {exc}" if exc else "", reset=isinstance(exc, _BROKEN), crowded=_full_backlog(exc)
                    )
                )
        if self.keepalive is not None:
            self.keepalive.cancel()
        pending, self.pending = self.pending, {}
        last = self.goaway_last
        # the request the server was taking in as its memory ran out: the first it did not read (it reads them in
        # order); only that one counts it against being sent again (trial EK: the small calls written behind a big
        # one failed with it)
        starved = (
            min((s for s in pending if s > last and s not in self.unsent), default=None)
            if self.server_starved and last is not None
            else None
        )
        for stream, fut in pending.items():
            if not fut.done():
                if stream in self.unsent or (last is not None and stream > last):
                    # (after the server's last request read: it never read it)
                    fut.set_exception(_NotSent(out_of_memory=stream == starved))
                else:
                    fut.set_exception(
                        _Lost(
                            self.goaway or str(exc or "connection closed"),
                            in_doubt=last is None,
                            out_of_memory=stream in self.starving,
                        )
                    )
        for w in self.waiters:
            if not w.done():
                w.set_result(None)
        self.owner._on_lost(self)


Endpoint = Callable[[], Awaitable[tuple[str, Any]]]  # () -> ("unix", path) | ("tcp", (host, port, ssl))


class RemoteTransport(Transport):
    """A connection to a server, made again by itself when it drops.

    ``endpoint``: an async function giving where to connect (it may start a sidecar first).
    ``reconnect_timeout``: how long a call waits for the store to come back before ``UnavailableError``.
    ``where``: the store's directory or address, for messages (``description`` unless given).
    ``on_connected``: awaited with the server's ``WELCOME`` after each handshake (the first and each reconnect).
    ``handshake_wait``: seconds one try waits for the handshake (default: see :meth:`_handshake_wait`).

    Keep-alive: when nothing has come from the server, or nothing has gone to it, for ``keepalive_idle``
    seconds (15), the SDK sends a ``store.ping`` (the server drops a connection it hears nothing from for a
    minute: ``server.listener.PEER_SILENCE``); when nothing comes within
    ``keepalive_timeout`` seconds more (10), the server is taken to be frozen or cut off and the connection is
    dropped (reads are sent again after the reconnect; a write raises ``OutcomeUnknownError``: STORE-06). A
    long call (a claim or a lock wait) on a live server is never cut: the server answers the ping. Both are
    attributes, read at each check (tests lower them).

    A token the server refuses at a reconnect (revoked across a restart) fails the calls waiting for the
    connection at once with ``UnauthenticatedError``, rather than after ``reconnect_timeout``; the SDK goes on
    trying in the background with backoff.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        token: str = "",
        name: str = "",
        description: str = "",
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        where: str = "",
        on_connected: ConnectedHook | None = None,
        keepalive_idle: float = 15.0,
        keepalive_timeout: float = 10.0,
        handshake_wait: float | None = None,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.on_connected = on_connected
        self.keepalive_idle = keepalive_idle
        # the same for each of its connections: a new one ends the one before it at the server (see Hello)
        self.instance = uuid.uuid4().hex
        self._connections = itertools.count(1)  # (each connection's number: Hello.connection)
        self.keepalive_timeout = keepalive_timeout
        self._refused: UnauthenticatedError | None = None  # the token was refused at the last reconnect
        self.token = token
        self.name = name or f"pid {os.getpid()}"
        self.description = description
        self.where = where or description
        self.reconnect_timeout = reconnect_timeout
        self.handshake_wait = handshake_wait  # (None: see _handshake_wait)
        self._gone: TinystoreError | None = None  # the store will not come back (see _reconnect_loop)
        self.store_id = ""  # the id of the store its first connection reached (Welcome.store): the only one it joins
        self._conn: _ClientConn | None = None
        self._up = asyncio.Event()
        self.down_since = 0.0  # when (time.monotonic()) the last connection was lost (see _wait_up)
        self._ids = itertools.count(1)
        self._reconnecting: asyncio.Task[None] | None = None
        self._hook_tasks: set[asyncio.Task[Any]] = set()
        self.last_error: BaseException | None = None
        self.welcome: Welcome | None = None
        self.reconnects = 0
        self._turns = {method: _Turns() for method in _PARKING}  # calls of _PARKING methods in flight
        self._park_cap = parking_cap(frames.DEFAULT_MAX_INFLIGHT)
        self._first: asyncio.Task[Any] | None = None  # a call every later one waits behind (see call_first)
        self._firsts: set[asyncio.Task[Any]] = set()  # call_first calls under way (each waits for the one before)

    async def connect(self, *, wait: bool = False, crowd_wait: float = 0.0) -> None:
        """Make the first connection. Raises ``UnavailableError`` / ``UnauthenticatedError`` (and what
        ``endpoint`` raises).

        ``crowd_wait`` (seconds; without ``wait``): a server that is there but crowded (it refused the connection
        because too many connections wait for their handshake, or its socket's queue of connections was full) is
        tried again, with the backoff of reconnects, for this long (trial GY: 3,000 opens at once, most failed
        at once); every other failure is raised at once.

        ``wait``: a failure that passes (nothing listens yet: ``ECONNREFUSED``; the server reset the connection,
        or refused it because too many connections wait for their handshake) is tried again, with the backoff of
        reconnects (:func:`backoff`), until ``reconnect_timeout`` seconds have passed since the first try; then
        ``UnavailableError`` names the store, the time waited and the last failure. A token refused, a
        certificate not trusted, a server that took the connection and did not answer its handshake within
        :data:`HANDSHAKE_WAIT` fail at once. Without ``wait``, every failure is raised at once.

        Cancelled, it leaves no connection open (one in its handshake is closed)."""
        loop = asyncio.get_running_loop()
        if not wait:
            began = loop.time()
            crowd_until = began + crowd_wait
            tries = 0
            while True:
                try:
                    # (each try's handshake bounded by what is left of the wait, 2 s at the least: trial IN, a 0.1 s
                    # reconnect_timeout gave up after 1.3 s, a 1 s one after 5.8 s)
                    self._conn = await (self._connect_once(until=crowd_until) if tries else self._connect_once())
                    break
                except _Transient as exc:
                    left = crowd_until - loop.time()
                    if not exc.extra.get("crowded") or left <= 0:
                        tried = (
                            f"; tried again for {loop.time() - began:.1f}s"
                            if tries and exc.extra.get("crowded")
                            else ""
                        )
                        raise UnavailableError(f"{exc.message}{tried}", **exc.extra) from None
                    tries += 1
                    await asyncio.sleep(min(backoff(tries - 1), left))
            self._up.set()
            return
        began = loop.time()
        deadline = began + self.reconnect_timeout
        attempt = 0
        while True:
            try:
                conn = await self._connect_once(until=deadline)
                break
            except _Transient as exc:
                attempt += 1
                now = loop.time()
                if now >= deadline:
                    raise UnavailableError(
                        f"the store at {self.description} could not be reached for {now - began:.1f}s "
                        f"({attempt} {'try' if attempt == 1 else 'tries'}; reconnect_timeout "
                        f"{self.reconnect_timeout:g}s): {exc.message}",
                        **exc.extra,
                    ) from None
                log.debug("the store at %s: %s; trying again", self.description, exc.message)
                await asyncio.sleep(min(backoff(attempt - 1), deadline - now))
        self._conn = conn
        self._up.set()

    def _handshake_wait(self) -> float:
        """Seconds one try waits for the handshake (TLS's and the store's): :data:`HANDSHAKE_WAIT`, or the
        ``reconnect_timeout`` when it is shorter (a client that gives the store 3 s waited 15 for a stuck one)."""
        if self.handshake_wait is not None:
            return self.handshake_wait
        return min(HANDSHAKE_WAIT, max(HANDSHAKE_WAIT_MIN, self.reconnect_timeout))

    async def _connect_once(self, until: float | None = None) -> _ClientConn:
        """One try. ``until`` (loop time): the deadline of tries that go on while it passes; a try's handshake
        waits no longer than what is left of it (2 s at the least), and a handshake not answered
        at an address (``tcp://``, ``tls://``) passes (``_Transient``): a server out of descriptors leaves new
        connections in its listen queue, and serves them as others leave (trial IG: plain clients failed at 15 s
        where TLS ones, whose TLS handshake timed out, tried again and were served)."""
        loop = asyncio.get_running_loop()
        handshake_wait = self._handshake_wait()
        if until is not None:
            # (2 s at the least, as for a short reconnect_timeout: trial II, a server held up for a second failed a
            # client whose reconnect_timeout was 0.5 s, which a wait of 2 s let through)
            handshake_wait = round(min(handshake_wait, max(HANDSHAKE_WAIT_MIN, until - loop.time())), 1)
        kind, where = await self.endpoint()
        try:
            if kind == "unix":
                check_socket_dir(Path(where))
                _, proto = await loop.create_unix_connection(lambda: _ClientConn(self), where)
            else:
                host, port, ctx = where
                _, proto = await loop.create_connection(
                    lambda: _ClientConn(self),
                    host,
                    port,
                    ssl=ctx,
                    server_hostname=host if ctx else None,
                    # (the TLS handshake has the handshake's time, not asyncio's 60 s: one try overran a
                    # reconnect_timeout of 20 s)
                    ssl_handshake_timeout=handshake_wait if ctx else None,
                )
        except (OSError, ssl.SSLError) as exc:
            hint = ""
            if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLCertVerificationError):
                # (a plain listener answers a ClientHello with bytes that are not TLS: WRONG_VERSION_NUMBER)
                hint = " (if the server listens without TLS, use tcp:// in place of tls://)"
            elif isinstance(exc, ConnectionAbortedError) and kind != "unix" and where[2] is not None:
                # asyncio's "SSL handshake is taking longer than 15.0 seconds", and nothing more (trial HY: tls://
                # to a Redis server, which waits for a line, or to any listener that says nothing first)
                hint = (
                    ": the TLS handshake got no answer; the server is stopped, stuck or overloaded, or what listens "
                    "there does not speak TLS (if the server listens without TLS, use tcp:// in place of tls://)"
                )
            error = _Transient if _passes(exc) else UnavailableError
            detail = str(exc)
            if not detail:  # (trial HU: "cannot reach the store at tls://…: ", and nothing more)
                tls = kind != "unix" and where[2] is not None
                detail = type(exc).__name__ + (": the connection closed during the TLS handshake" if tls else "")
            if _full_backlog(exc):
                raise _Transient(
                    f"cannot reach the store at {self.description or where}: {detail} (its socket's queue of "
                    "connections is full: a burst of clients connecting at once, or a server stopped or stuck)",
                    crowded=True,
                    backlog=True,
                ) from None
            if isinstance(exc, ConnectionRefusedError):  # (asyncio's text: "Connect call failed ('::1', 7600, 0, 0)")
                detail = f"connection refused ({exc}): nothing listens there"
            raise error(f"cannot reach the store at {self.description or where}: {detail}{hint}") from None
        assert proto.transport is not None
        proto.number = next(self._connections)
        plain_tcp = kind != "unix" and where[2] is None
        proto.transport.write(
            proto.conn.send_hello(
                encode(
                    Hello(
                        version=frames.PROTOCOL_VERSION,
                        token=self.token,
                        client=self.name,
                        pid=os.getpid(),
                        instance=self.instance,
                        connection=proto.number,
                    )
                )
            )
        )
        try:
            async with asyncio.timeout(handshake_wait):
                welcome = await proto.welcome
        except TimeoutError:
            proto.transport.close()
            passes = until is not None and kind != "unix"
            raise (_Transient if passes else UnavailableError)(
                f"the store at {self.description or where} did not answer the handshake within {handshake_wait:g}s: "
                "its server took the connection but is stopped (SIGSTOP), stuck or overloaded, or is out of file "
                "descriptors and cannot accept it yet (its log says so); or what listens there is not a TinyStore "
                "server"
            ) from None
        except _HandshakeClosed as exc:
            hint = (
                " (a TLS listener closes a plain-text client: if the server listens with TLS, use tls:// in place "
                "of tcp://)"
                if plain_tcp and not exc.reset
                else ""
            )
            if exc.crowded:
                raise _Transient(
                    f"the store at {self.description or where} took no connection: its socket's queue of connections "
                    f"was full{exc} (a burst of clients connecting at once, or a server stopped or stuck)",
                    crowded=True,
                    backlog=True,
                ) from None
            message = (
                f"the store at {self.description or where} closed the connection during the handshake, before it "
                f"answered{exc}"
            )
            if hint and await _speaks_tls(where[0], where[1]):
                # a TLS listener: told at once (it closes a plain-text client as a forwarder with no backend does)
                raise UnavailableError(
                    f"{message}: it listens with TLS; use tls:// in place of tcp://", tls_listener=True
                ) from None
            # tried again, a clean close too: a forwarder (docker-proxy, kubectl port-forward) takes the connection
            # and closes it while its backend is not up yet (trial HS: a worker started before its server failed at
            # once); the hint stays in the message should it never pass
            raise _Transient(f"{message}{hint}") from None
        except TinystoreError as exc:
            proto.transport.close()
            # the server refused the handshake: its message, naming the store
            message = f"the store at {self.description or where}: {exc.message}"
            if isinstance(exc, UnavailableError) and exc.extra.get("descriptors"):
                # (trial IM: explained as the handshakes' queue, another limit)
                raise _Transient(
                    f"{message}: it serves more clients as others leave (its open-files limit, `ulimit -n`, bounds "
                    "how many it holds)",
                    **{**exc.extra, "crowded": True},
                ) from None
            if isinstance(exc, UnavailableError) and (exc.extra.get("crowded") or exc.message.startswith(CROWDED)):
                raise _Transient(
                    f"{message} (the server closes the connection that waited longest for its handshake while more "
                    "than it allows wait: a burst of clients connecting at once, or peers that connect and say "
                    "nothing)",
                    **{**exc.extra, "crowded": True},
                ) from None
            raise type(exc)(message, **exc.extra) from None
        except asyncio.CancelledError:
            # the connection goes with the cancel: left open, the server would keep it (and a sidecar its idle
            # timer waiting); its handshake is not waited for by anyone any more
            proto.welcome.cancel()
            proto.transport.close()
            raise
        if welcome.store and self.store_id and welcome.store != self.store_id:
            # another store than the one this transport used, made at its path or address meanwhile (trial EA: a
            # client paused through `tinystore stop DIR; mv DIR DIR.old`, and another process's open of DIR, went
            # on writing into that new, empty store): never joined
            proto.transport.close()
            raise another_store(self.description, welcome.store, self.store_id)
        if welcome.store:
            self.store_id = welcome.store
        self.welcome = welcome
        self.epoch = proto.epoch = welcome.epoch
        self.test_clock = welcome.test_clock
        self.max_body = welcome.max_body
        proto.conn.max_inflight = welcome.max_inflight
        self._park_cap = parking_cap(welcome.max_inflight)
        proto.conn.peer_max_body = welcome.max_body
        if self.on_connected is not None:
            try:
                await self.on_connected(welcome)
            except BaseException:
                proto.transport.close()
                raise
        if not proto.lost:
            proto.keepalive = attempt_guard.spawn(self._keepalive(proto))
        return proto

    async def _keepalive(self, conn: _ClientConn) -> None:
        """Probe a server that sent nothing for ``keepalive_idle`` seconds, whether calls wait for it or not (a
        subscription or a lease waits for its pushes: trial AQ found a subscriber on a link cut silently deaf for
        ever); drop the connection when the probe gets nothing back within ``keepalive_timeout`` seconds."""
        loop = conn.loop
        while not conn.lost and not self.closed:
            idle = self.keepalive_idle
            await asyncio.sleep(max(0.01, min(idle / 4, 1.0)))
            if conn.lost or conn.going() or self.closed:
                continue
            now = loop.time()
            if now - conn.last_rx < self.keepalive_idle and now - conn.last_tx < self.keepalive_idle:
                # (a client that only hears pushes sends a probe too: the server drops a connection it heard
                # nothing from for PEER_SILENCE, taken for a peer the network cut off without a close)
                continue
            if len(conn.pending) >= conn.conn.max_inflight:
                continue  # (not reached: the calls leave the last of the credit to the probe)
            stream = next(self._ids)
            probe: asyncio.Future[bytes] = loop.create_future()
            # (retrieved, whoever is there to: a lost connection fails it after this task was cancelled, which
            # logged "Future exception was never retrieved" for a client woken from a long freeze; trial CU)
            probe.add_done_callback(_retrieved)
            conn.pending[stream] = probe
            sent = loop.time()
            conn.send(request_frame(stream, _PING, _PING_BODY), stream)
            wait = self.keepalive_timeout
            await asyncio.wait({probe}, timeout=wait)
            if probe.done():
                continue  # (an answer, or the connection lost, which is no news here)
            conn.pending.pop(stream, None)
            probe.cancel()
            if conn.lost or conn.last_rx > sent:
                continue  # something came (a slow answer in many frames): the server is alive
            silent = loop.time() - conn.last_rx
            log.warning("the store at %s sent nothing for %.0fs: dropping the connection", self.description, silent)
            conn.goaway = (
                f"the store at {self.description} did not answer for {silent:.0f}s (no answer to a keep-alive "
                f"ping within {wait:g}s)"
            )
            if conn.transport is not None:
                conn.transport.abort()
            return

    def _dispatch_push(self, method: str, body: bytes) -> None:
        entry = self.push_handlers.get(method)
        if entry is None:
            return
        handler, body_type = entry
        try:
            handler(decode(body, body_type))
        except Exception:
            log.exception("push handler for %s failed", method)

    def _on_stopping(self, conn: _ClientConn) -> None:
        """``conn``'s server said it is stopping (a graceful stop): tell the hooks (the connection drops next)."""
        if conn is not self._conn or self.closed:
            return
        reason = conn.goaway or "the store is stopping"
        self.server_stopped_at = time.monotonic()
        for hook in list(self.stopping_hooks):
            try:
                hook(reason)
            except Exception:
                log.exception("a hook of a stopping server failed")

    def _on_lost(self, conn: _ClientConn) -> None:
        if conn is not self._conn:
            return
        if attempt_guard.CURRENT.get() is not None:
            # found by a handler's call: the reconnect, and what the hooks start, are the SDK's own (trial IO)
            attempt_guard.free(lambda: self._on_lost(conn))
            return
        self._conn = None
        self._up.clear()
        self.down_since = time.monotonic()
        if self.closed:
            return
        self.last_error = UnavailableError(conn.goaway or "the connection to the store dropped")
        for hook in list(self.lost_hooks):
            try:
                hook()
            except Exception:
                log.exception("a hook of a dropped connection failed")
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = attempt_guard.spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        old_epoch = self.epoch
        attempt = 0
        while not self.closed:
            stopped_at = self.server_stopped_at
            if stopped_at is not None and stopped_at < self.reconnected_at:
                stopped_at = None  # (said by a server before the last reconnect: a kill -9 since keeps the backoff)
            delay = reconnect_delay(attempt, stopped_at, time.monotonic())
            attempt += 1
            await asyncio.sleep(delay)
            try:
                conn = await self._connect_once()
            except UnauthenticatedError as exc:
                # the server is up but refuses the token (revoked across a restart): the calls waiting for
                # the connection fail now, not after reconnect_timeout; trying goes on in the background
                self.last_error = exc
                told = self._refused is not None
                self._refused = exc
                self._up.set()
                if not told:
                    self.failed(UnauthenticatedError(f"{exc.message} (refused when the SDK reconnected)", **exc.extra))
                continue
            except (TinystoreError, OSError) as exc:
                self.last_error = exc
                if isinstance(exc, UnavailableError) and exc.extra.get("gone"):
                    # the store is gone from its path and will not come back there: every waiting call fails now
                    self._gone = exc
                    self._up.set()
                    self.failed(exc)
                    return
                if self._refused is not None:
                    self._refused = None
                    if self._conn is None:
                        self._up.clear()
                continue
            except (MemoryError, RuntimeError) as exc:
                # this process is short of memory or threads ("can't start new thread": trial EG, the loop ended
                # with it, and the store was never reached again): tried again, as for a server not there yet
                self.last_error = UnavailableError(f"this process could not connect: {type(exc).__name__}: {exc}")
                continue
            if self.closed:
                if conn.transport is not None:
                    conn.transport.close()
                return
            self._conn = conn
            self._refused = None
            self.reconnects += 1
            self.reconnected_at = time.monotonic()
            self._up.set()
            log.info("reconnected to the store (epoch %s → %s)", old_epoch, self.epoch)
            for hook in list(self.reconnect_hooks):
                try:
                    await hook(old_epoch, self.epoch)
                except Exception:
                    log.exception("a reconnect hook failed")
            if self._conn is None and not self.closed:
                # lost again while the hooks ran: _on_lost saw this loop still running, so go on here
                old_epoch = self.epoch
                attempt = 0
                continue
            return

    @property
    def connected(self) -> bool:
        conn = self._conn
        return not self.closed and conn is not None and not conn.going()

    async def reached(self, within: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not self.connected:
            if self.closed or self._gone is not None:
                return True  # (nothing to wait for: the next call raises why)
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(left):
                    if self._up.is_set():
                        await asyncio.sleep(0.01)  # (a connection that is going: until it is gone)
                    else:
                        await self._up.wait()
            except TimeoutError:
                return False
        return True

    def give_up(self, exc: TinystoreError) -> None:
        self._gone = exc
        self._up.set()
        self.failed(exc)

    async def _wait_up(self, since: float | None = None) -> _ClientConn:
        """The connection, once the store is reached. ``since``: when (``time.monotonic()``) the call began, given
        by a call: it waits ``reconnect_timeout`` from the later of that and the moment the connection was lost, not
        from now (trial EJ: 30,000 calls queued for their turns as the store stopped failed 160 every 30 s, each
        group waiting afresh, for half an hour)."""
        if self._gone is not None:
            raise self._gone  # (also once closed: what ended it, not "closed")
        if self.closed:
            raise ClosedError(f"store {self.where} is closed")
        wait = self.reconnect_timeout
        if since is not None and not self._up.is_set():
            wait = max(0.0, max(since, self.down_since) + wait - time.monotonic())
        try:
            async with asyncio.timeout(wait):
                await self._up.wait()
        except TimeoutError:
            raise UnavailableError(
                f"the store at {self.description} could not be reached for {self.reconnect_timeout:g}s: "
                f"{self.last_error}"
            ) from None
        if self.closed:
            raise ClosedError(f"store {self.where} is closed")
        if self._gone is not None:
            raise self._gone
        conn = self._conn
        if conn is None:
            refused = self._refused
            if refused is not None:
                raise UnauthenticatedError(f"{refused.message} (refused when the SDK reconnected)", **refused.extra)
            self._up.clear()  # woken for nothing (the refusal was cleared meanwhile): wait again
            return await self._wait_up(since)
        return conn

    async def call(
        self,
        method: str,
        request: Any,
        response_type: Any = Any,
        *,
        write: bool = False,
        retry: bool = True,
        undo: Callable[[bytes], None] | None = None,
        sent: Callable[[float], None] | None = None,
        still: Callable[[], Any] | None = None,
    ) -> Any:
        if asyncio.get_running_loop() is not self.loop:
            raise self.other_loop()
        guard = attempt_guard.CURRENT.get()
        guarded = guard is not None and method not in attempt_guard.LETTING_GO
        if guarded:
            attempt_guard.check(method)  # (a job's handler: nothing goes out once its attempt is past its lease)
        began = time.monotonic()
        first = self._first
        if first is not None:
            if first.done():
                self._first = None
            elif asyncio.current_task() not in self._firsts:
                await asyncio.wait([first])  # (its outcome is its caller's; a cancel here ends this call only)
        turns = None
        extra = None
        if method in _PARKING and not (method in _IN_TX and request.tx):
            # a call that may wait long at the server: once fewer than its method's share of them are in flight
            # (see _PARKING); a cancel while it waits for its turn sends nothing. A write made inside an open
            # transaction's fn may go past its method's share, a few at once for each transaction (TX_EXTRA):
            # behind the connection's writes that wait (for another connection's transaction), it waited until
            # its own transaction's tx_idle (trial BH); without a bound, a fn that spawned a thousand took all
            # the credit its own statements need (trial BI); with one bound for all, other transactions' fns took
            # it (trial BJ)
            turns = self._turns[method]
            if not turns.take(self._park_cap):
                # (a transaction begun inside one's fn too: behind the begins that wait for the writer the fn's own
                # transaction holds, it waited for a turn until that one's tx_idle: trial HA)
                mark = open_tx_mark() if method in _IN_TX or method == "sql.begin" else None
                if mark is None:
                    await self._turn(turns)
                elif await self._turn_or_extra(turns, mark):
                    extra = mark
                    turns = None
        try:
            try:
                body = encode_answer(request)  # (not encode: see encode_answer)
            except (TypeError, ValueError, OverflowError) as exc:  # ValueError: text that is not valid Unicode
                raise unsendable(method, request, exc) from None
            if len(body) > self.max_body:
                # the server would refuse the frame and close the connection: refuse it here, send nothing
                raise too_large(method, request, len(body), self.max_body)
            starved = 0  # connections this process dropped, out of memory, while this call waited for its answer
            refused = False  # a stopping server answered it unrun (then only unread sends, if any)
            while True:
                conn = self._conn
                if conn is None or (self.closed and (method != ROLLBACK or conn.lost)):
                    # (a rollback still goes while the close waits for the writes sent: one may wait for the writer
                    # it holds, trial ID)
                    if not self.closed:
                        self._no_tx_elsewhere(method, request, None)
                    try:
                        conn = await self._wait_up(began)
                    except UnavailableError as exc:
                        if refused and write:  # (trial EQ: the error did not say the write had not run)
                            raise UnavailableError(
                                f"{_about(method, request)}: not run (the server stopped before it ran it), and "
                                f"{exc.message}"
                            ) from None
                        raise
                if conn.lost or conn.goaway is not None or conn.transport is None or conn.transport.is_closing():
                    # aborted, or the server said goodbye, and not yet lost: wait for the next connection
                    # rather than write into this one (a write would be lost unsent, yet OutcomeUnknownError)
                    self._no_tx_elsewhere(method, request, conn.goaway)
                    await conn.wait_gone()
                    continue
                pending = conn.pending
                if len(pending) >= conn.conn.max_inflight - 1 or conn.paused:
                    # request credit used up (or the socket pushes back): wait for an answer before sending more.
                    # The last one is the keep-alive probe's: a link cut silently under a full credit is found too
                    # (trial AQ: 1,024 calls waited on it for ever)
                    w: asyncio.Future[None] = conn.loop.create_future()
                    conn.waiters.append(w)
                    await w
                    continue
                if guarded:
                    # asked again as it goes: the waits above (a turn, credit, the next connection) may have taken
                    # it past its lease (trial IO: 40 writes that waited for a turn went out 3 s after the attempt
                    # was lost)
                    attempt_guard.check(method)
                if still is not None:
                    now = still()
                    if now is False:
                        raise attempt_guard.Withdrawn(method)
                    if now is not request:
                        request = now  # (a batch without the items of a handler past its lease)
                        body = encode_answer(request)
                stream = next(self._ids)
                # (made before the call is pending: a MemoryError here leaves nothing behind, trial EG)
                frame = request_frame(stream, method, body)
                fut: asyncio.Future[bytes] = conn.loop.create_future()
                pending[stream] = fut
                if write:
                    conn.writes.add(stream)
                # conn.send(...), inline: what this loop turn queues goes out in one write
                conn.out.append(frame)
                conn.unsent.add(stream)
                if guarded or still is not None:
                    conn.withheld.append((frame, stream, method, request, guard if guarded else None, still))
                if sent is not None:
                    sent(conn.loop.time())  # (no later than the write: a lower bound of when the server reads it)
                if not conn.flush_scheduled:
                    conn.flush_scheduled = True
                    conn.loop.call_soon(conn.flush)
                try:
                    if write:
                        try:
                            raw = await fut
                        finally:
                            conn.writes.discard(stream)
                    else:
                        raw = await fut
                except _Withheld:
                    continue  # (asked again above: not sent)
                except _NotSent as exc:
                    if exc.out_of_memory:
                        # the server had no memory to take in what came (trial EJ: sent again for ever, 18 a second)
                        starved += 1
                        if starved >= OUT_OF_MEMORY_TRIES:
                            raise UnavailableError(
                                f"{_about(method, request)}: the server is out of memory: the request could not be "
                                f"read, and was not run ({starved} tries; try again later, or send less at once)"
                            ) from None
                    # never read: sent again, but a transaction's call only on its own connection (trial BX)
                    self._no_tx_elsewhere(method, request, conn.goaway)
                    continue
                except _Starved:
                    starved += 1
                    if write or (not retry and method != "sql.query"):
                        # (a transaction's statement too: it ran there, or failed there, and is never sent again;
                        # trial EJ: it was, and ran twice in the transaction)
                        raise OutcomeUnknownError(
                            f"{_about(method, request)}: its answer came, but this process ran out of memory "
                            "(MemoryError) reading it; the write may or may not have taken effect (not sent again)"
                        ) from None
                    if not retry:
                        raise UnavailableError(
                            f"{_about(method, request)}: the answer could not be read: this process ran out of memory "
                            "(MemoryError) reading it (a transaction's read is not sent again; the transaction goes on)"
                        ) from None
                    if starved >= OUT_OF_MEMORY_TRIES:
                        raise UnavailableError(
                            f"{_about(method, request)}: the answer could not be read: this process ran out of memory "
                            f"(MemoryError) reading it ({starved} tries): ask for less at a time (a LIMIT, fewer or "
                            "smaller columns)"
                        ) from None
                    continue  # (a read: sent again, once)
                except _Lost as exc:
                    if exc.out_of_memory:
                        starved += 1
                        if starved >= OUT_OF_MEMORY_TRIES and not write:
                            raise UnavailableError(
                                f"{_about(method, request)}: the answer could not be read: {exc} ({starved} tries): "
                                "ask for less at a time (a LIMIT, fewer or smaller columns)"
                            ) from None
                    if write and exc.in_doubt and await self._never_read(conn, stream):
                        # the server stopped, or the connection was cut, before it read this one: sent again (a
                        # transaction's call is not: its transaction ended with the connection)
                        self._no_tx_elsewhere(method, request, "the connection to the store ended before it was read")
                        continue
                    if write:
                        raise OutcomeUnknownError(
                            f"{_about(method, request)}: the connection dropped before the answer came ({exc}); "
                            "the write may or may not have taken effect"
                        ) from None
                    if not retry:
                        tx = getattr(request, "tx", 0)
                        if tx:  # (a commit is a write, above: it may have committed)
                            # the same error as the transaction's next call raises (SqlTx._check): whether a call
                            # was under way as the connection dropped is chance (trial CZ: ClosedError here)
                            raise UnavailableError(
                                f"{_about(method, request)}: the connection to "
                                f"the store dropped before the answer came ({exc}); the transaction was rolled back "
                                "with it (nothing of it was committed)"
                            ) from None
                        raise ClosedError(
                            f"{_about(method, request)}: the connection to the store dropped ({exc})", dropped=True
                        ) from None
                    continue
                except _Refused as exc:
                    self._no_tx_elsewhere(method, request, f"{exc}; the store stopped")
                    if not retry:
                        raise NotRunError(f"{_about(method, request)}: {exc}") from None
                    # it was not run: safe to send again (a write too) once the next server is reached
                    refused = True
                    await conn.wait_gone()
                    continue
                except asyncio.CancelledError:
                    if conn.pending.pop(stream, None) is not None and not conn.lost and conn.transport is not None:
                        conn.send(conn.conn.send_cancel(stream))
                        conn.release()
                        if undo is not None:  # its answer may be on its way: undone should it come
                            conn.orphans[stream] = (undo, next(self._ids))
                    else:
                        # answered in the loop turn of the cancel (before or after it): nobody will see the answer
                        answer = conn.late.pop(stream, None) if conn.late else None
                        if answer is None and fut.done() and not fut.cancelled() and fut.exception() is None:
                            answer = fut.result()
                        if undo is not None and answer is not None:
                            undo(answer)
                    raise
                dec = _DECODERS.get(response_type)
                if dec is None:
                    dec = decoder_for(response_type).decode
                    _DECODERS[response_type] = dec
                return dec(raw)
        finally:
            if turns is not None:
                turns.release(self._park_cap)
            elif extra is not None:
                extra.given_back()

    async def _never_read(self, lost: _ClientConn, stream: int) -> bool:
        """Whether request ``stream`` of connection ``lost``, which dropped with nothing said of what the server
        read (its GOAWAY unread: trial BW's client, its loop blocked through a stop, the GOAWAY queued behind
        32 MiB of answers; or a network cut), was never read by that server: the next connection's ``WELCOME``
        brings the facts the store keeps of this transport's connections (``Welcome.last_reads``: a server that
        stopped gracefully noted each of its connections, one that ended a connection as the client's next one
        came noted that one); only a fact of ``lost`` itself (its server's epoch and its number) counts (trial BX:
        one of a later connection, after two cuts, cleared a write the server had read). Waits for the next
        connection, at most :data:`IN_DOUBT_WAIT` seconds; ``False`` when none comes or nothing is said of it."""
        if self.closed:
            return False
        try:
            async with asyncio.timeout(min(IN_DOUBT_WAIT, self.reconnect_timeout)):
                while True:
                    conn = await self._wait_up()
                    if conn is not lost:
                        break
                    await lost.wait_gone()
        except (TimeoutError, TinystoreError):
            return False
        w = self.welcome
        if w is None or not lost.number:
            return False
        return any(e == lost.epoch and c == lost.number and stream > last for e, c, last in w.last_reads)

    def call_first(
        self, method: str, request: Any, response_type: Any = Any, *, write: bool = False
    ) -> asyncio.Task[Any]:
        """:meth:`call` in a task of its own, started now, that every call made after this one waits behind (until
        its answer): what the caller does next, even without awaiting it, reaches the server after it (a test
        clock's ``advance``). Returns the task, whose outcome is the call's."""
        before = self._first

        async def in_turn() -> Any:
            if before is not None and not before.done():
                await asyncio.wait([before])  # (the one made before it: they reach the server in the order made)
            return await self.call(method, request, response_type, write=write)

        task: asyncio.Task[Any] = asyncio.ensure_future(in_turn())
        self._firsts.add(task)
        task.add_done_callback(self._firsts.discard)
        self._first = task
        return task

    def _no_tx_elsewhere(self, method: str, request: Any, why: str | None) -> None:
        """A call of a transaction (``request.tx``) is never sent on another connection than the one it began on
        (another session, perhaps another server, where its id means nothing): when that connection ended or the
        server refused the call (it is stopping), the transaction ended with it, rolled back by the server.
        Raises ``UnavailableError`` saying so; nothing for a call outside a transaction."""
        tx = getattr(request, "tx", 0)
        if tx:
            raise UnavailableError(
                f"{_about(method, request)}: {why or 'the connection to the store ended'}; the transaction was rolled "
                "back with it (nothing of it was committed)"
            )

    async def _turn_or_extra(self, turns: _Turns, mark: _TxMark) -> bool:
        """Wait for a turn of ``turns`` or for a place among the writes past the share that the transaction of
        ``mark`` may have (TX_EXTRA), whichever comes first: True for the latter (counted in ``mark.extra``). A write
        of a transaction's fn that found both full waited for a general turn only, which writes waiting for the
        transaction itself held: until tx_idle (trial BK)."""
        while True:
            if mark.open and mark.extra < TX_EXTRA:
                mark.extra += 1
                return True
            if not mark.open:
                await self._turn(turns)
                return False
            if turns.count < self._park_cap:
                turns.count += 1
                return False  # (ahead of the writes that wait for a turn: it is a transaction's own)
            w: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
            turns.waiters.append(w)  # type: ignore[arg-type]
            mark.waiters.append(w)
            try:
                got = await w
            except asyncio.CancelledError:
                if w.done() and not w.cancelled():  # what it was given goes to the next
                    if w.result() is None:
                        turns.release(self._park_cap)
                    else:
                        mark.wake_next()
                raise
            if got is None:
                return False  # a general turn, handed to it (counted)

    async def _turn(self, turns: _Turns) -> None:
        """Wait for a turn of ``turns`` (counted once it is had), after the calls that wait already."""
        if turns.take(self._park_cap):
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turns.waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                turns.release(self._park_cap)  # the turn it was handed goes to the next
            raise

    def abort(self) -> None:
        """Drop the connection now, as a network fault would (tests of reconnects use this)."""
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.abort()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._up.set()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnecting
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.lost:
            # the writes sent and not yet answered: their answers waited for, a while (trial HQ: a close with 300
            # inserts in flight failed 140 that had committed with ClosedError, which says they had not, and a
            # caller that retried on it wrote them twice)
            if conn.out:
                # what was asked before the close goes out now, and its answer is waited for as the others' (a
                # flush due later wrote it during the wait, unwaited for, or after the GOAWAY, unread)
                conn.flush()
            sent = [f for s, f in conn.pending.items() if s in conn.writes]
            if sent:
                await asyncio.wait(sent, timeout=max(0.1, self.close_left()))
        self._conn = None
        if conn is not None and conn.transport is not None:
            with contextlib.suppress(Exception):
                conn.transport.write(conn.conn.send_goaway(encode(GoAway(reason="client closed"))))
            conn.transport.close()
            pending, conn.pending = conn.pending, {}
            for stream, fut in pending.items():
                if fut.done():
                    continue
                if stream in conn.writes and stream not in conn.unsent:
                    fut.set_exception(
                        _Lost(f"the store {self.where} was closed before its answer came (in {CLOSE_WRITES_WAIT:g} s)")
                    )
                else:
                    fut.set_exception(ClosedError(f"store {self.where} was closed"))
        if conn is not None and conn.keepalive is not None:  # no task of this connection outlives the close
            conn.keepalive.cancel()
            with contextlib.suppress(BaseException):
                await conn.keepalive
