"""Job queues in the SDK: :class:`Queue`, :class:`Job`, :class:`JobPage`, :class:`Run`, :class:`Outcome`,
:class:`Worker`.

A queue is opened lazily: its first awaited call sends its options to the store, which keeps the options of
every queue (the first open decides; a later open with other options raises ``InvalidError`` naming the
option). Values travel as JSON of the queue's type (a dataclass, msgspec Struct, TypedDict, or plain JSON).

Workers claim jobs from the store (the server decides which job goes where: priority, then the tenant served
least recently, within ``max_running`` and ``max_running_per_tenant``), run the handler, renew the attempt's
lease every third of it, and report how it ended with the attempt's fence: a report of an attempt that is no
longer current changes nothing (JOB-08).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import functools
import inspect
import itertools
import logging
import math
import os
import re
import shlex
import time
import traceback as _traceback
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, cast, overload

import msgspec

from ..clock import Clock, Timer
from ..durations import Duration, seconds
from ..errors import (
    ClosedError,
    CorruptError,
    InvalidError,
    LimitError,
    LostError,
    OutcomeUnknownError,
    PermanentError,
    TinystoreError,
    UnavailableError,
)
from ..names import check_name, not_a_type, type_name
from ..protocol.jobs import (
    ADD_MAX,
    CANCEL_PUSH,
    ENDED,
    KEY_MAX,
    PRIORITY_MAX,
    RELEASE_MAX,
    RENEW_MAX,
    RUN_AT_MAX_MS,
    Add,
    Attempt,
    CancelRun,
    Claim,
    Claimed,
    ErrorEntry,
    Find,
    Get,
    JobEvent,
    JobRow,
    NewJob,
    OpenQueue,
    Options,
    Page,
    Progress,
    QueueInfo,
    Release,
    ReleaseClaim,
    Renew,
    Report,
    Step,
    Unwait,
    Wait,
    check_concurrency,
    check_job_id,
    check_list,
    check_options,
    check_step_name,
    check_text,
    is_int,
    snapshot,
)
from ..protocol.jobs import JobState as JobState  # (public: tinystore.JobState)
from ..protocol.jobs import List as ListRequest
from ..protocol.store import Empty
from ..protocol.values import json_problem, key_changed, plain_int, shown, valid_text
from . import attempt_guard
from .sql import in_open_tx

if TYPE_CHECKING:
    from .sql import Database, SqlTx
    from .store import Store

__all__ = ["Job", "JobError", "JobEvent", "JobPage", "Outcome", "Queue", "Run", "Worker"]

log = logging.getLogger("tinystore.jobs")
CANCEL_WAIT = 10.0
"""Seconds a stopping worker waits for its cancelled handlers to end."""
CLOSE_GRACE = 10.0
"""Seconds the handlers running get to end when the store closes (a worker's, and run_due's), before their cancel,
unless ``store.close(grace=...)`` says."""


def _close_grace(store: Store) -> float:
    return CLOSE_GRACE if store._close_grace is None else store._close_grace


T = TypeVar("T")
R = TypeVar("R")

PROGRESS_INTERVAL = 0.1
"""Seconds between two progress sends of one attempt (at most 10 a second)."""
ENCODE_TURN = 2000
"""The values of an add_many encoded in one loop turn (see ``Queue._many_in_turns``)."""
CLAIM_WAIT = 30.0
"""Seconds a worker's claim waits in the store for a job before it asks again."""

_encoder = msgspec.json.Encoder()


def _json(value: Any, what: str, keys: bool = True, loose: list[Any] | None = None) -> str:
    """``value`` as JSON text, or ``InvalidError`` (``what`` does not encode as JSON: why) for a value that would
    not come back as it went in: what JSON cannot hold (NaN, infinities, ints past 64 bits), an object that does
    not encode, and, when ``keys``, a dict key that is not a str (see :func:`~tinystore.protocol.jobs.json_problem`).
    ``keys=False`` where a declared type reads the keys back (a queue's own type); the keys that are not str are
    then appended to ``loose``, for the caller to see that the type reads them back."""
    try:
        problem = json_problem(msgspec.to_builtins(value), keys, loose)
        text = "" if problem is not None else _encoder.encode(value).decode()
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise InvalidError(f"{what} does not encode as JSON: {_text_of(exc)}") from None
    if problem is not None:
        raise InvalidError(f"{what} does not encode as JSON: {problem}")
    return text


def _lost_to_a_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is the ``LostError`` of a lease that ended with its store's graceful stop (LOCK-07)."""
    return isinstance(exc, LostError) and exc.extra.get("store_stopping") is True


def _text_of(value: object) -> str:
    """``str(value)``, or ``""`` when that raises."""
    try:
        return str(value)
    except BaseException:  # a broken __str__ must not hide the error it describes
        return ""


def _describe(exc: BaseException) -> str:
    """A readable error text for an exception a handler raised: ``Type: message``, the type's name alone when the
    message is empty or ``str()`` fails; never longer than the store keeps, always valid Unicode."""
    name = type(exc).__name__
    text = _text_of(exc)
    return _clean(f"{name}: {text}" if text else name)


def _decode_error(exc: BaseException) -> str:
    """msgspec's own text for a value that does not decode; ``Type: message`` for what a type's code raised."""
    return _clean(_text_of(exc)) if isinstance(exc, msgspec.DecodeError) else _describe(exc)


ERROR_MAX = 2000
"""Error texts are cut to this many characters (the store keeps no more)."""


def _clean(text: str) -> str:
    """An error text that can be sent and stored: at most ``ERROR_MAX`` characters, lone surrogates escaped."""
    if not isinstance(text, str):
        text = _text_of(text) or type(text).__name__
    if len(text) > ERROR_MAX:
        text = text[: ERROR_MAX - 1] + "…"
    if not valid_text(text):
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


TRACEBACK_MAX = 4000
"""Tracebacks are cut to their last this many characters (the store keeps no more)."""


TRACEBACK_HEAD = 1000
"""A traceback cut to ``TRACEBACK_MAX`` keeps this many characters of its start (the rest from its end)."""


def _lost_of(current: Sequence[_Attempt], lost: Sequence[str]) -> list[_Attempt]:
    """The attempts of ``current`` that a renewal's answer ``lost`` (an id for each attempt of the request that is
    no longer current) names. Two attempts of one job may be renewed together (one cancelled whose handler still
    cleans up, and its job's next, after a ``retry``): an id named once is the lower fence's, as a higher fence
    supersedes it (trial FM: both were stopped, and the retried job ended "worker lost", dead with attempts=1)."""
    told = collections.Counter(lost)
    out: list[_Attempt] = []
    for a in current:
        if told[a.claimed.id] == 0:
            continue
        same = sorted((b for b in current if b.claimed.id == a.claimed.id), key=lambda b: b.claimed.fence)
        if a in same[: told[a.claimed.id]]:
            out.append(a)
    return out


def _handler_tb(exc: BaseException) -> TracebackType | None:
    """The traceback of ``exc`` from the handler's frame on: the worker's own frames above it left out."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _exc_info(exc: BaseException) -> tuple[type[BaseException], BaseException, TracebackType | None]:
    """``exc`` as a log record's ``exc_info``, its traceback from the handler's frame on, as the job keeps it (trial
    FG: the worker's log began with a frame of the SDK)."""
    return type(exc), exc, _handler_tb(exc)


def _traceback_of(exc: BaseException) -> str | None:
    """Where ``exc`` was raised from, as Python prints it, from the handler's frame on (the worker's own frames
    above it left out); text that can be sent and stored. A longer one than ``TRACEBACK_MAX`` characters is cut in
    its middle: its start (where the handler called) and its end (the innermost frames and the error) are kept, so
    that a huge message does not push every frame out (trial CB). ``None`` when it cannot be formatted."""
    try:
        text = "".join(_traceback.format_exception(type(exc), exc, _handler_tb(exc)))
    except Exception:  # (an exception whose str() or frames fail to format)
        return None
    if len(text) > TRACEBACK_MAX:
        cut = "\n…\n"
        text = text[:TRACEBACK_HEAD] + cut + text[-(TRACEBACK_MAX - TRACEBACK_HEAD - len(cut)) :]
    if not valid_text(text):
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


def _check_handler(queue: str, what: str, handler: Any) -> None:
    """Refuse a handler that cannot be called as ``handler(value, run)``: every job would fail with it."""
    if not callable(handler):
        raise InvalidError(f"queue {queue}: {what}: the handler {handler!r} is not callable")
    call = inspect.getattr_static(type(handler), "__call__", None) if not inspect.isroutine(handler) else None
    if inspect.isasyncgenfunction(handler) or (call is not None and inspect.isasyncgenfunction(call)):
        # (its call gives an async generator, which no job can end with: every attempt failed, "does not encode")
        raise InvalidError(
            f"queue {queue}: {what}: the handler {handler!r} is an async generator function: a handler is a coroutine "
            "function (or a plain one) that returns the job's result"
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin or a C callable without a signature: it is tried as it is
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        # (trial BU: "cannot be called as handler(value, run): too many positional arguments", for one parameter)
        raise InvalidError(
            f"queue {queue}: {what}: the handler {getattr(handler, '__qualname__', handler)!r} must take two "
            f"arguments, as handler(value, run) (called with two: {exc})"
        ) from None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _when(ms: int | None) -> datetime | None:
    """``ms`` since the Unix epoch as an aware UTC datetime, exact to the ms (no float on the way)."""
    if ms is None:
        return None
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:  # a time no datetime holds (kept by an older version)
        return datetime.max.replace(tzinfo=UTC) if ms > 0 else datetime.min.replace(tzinfo=UTC)


def _epoch_ms(at: datetime) -> int:
    """``at`` (a naive datetime is read as UTC) in whole ms since the Unix epoch, rounded down, computed from the
    datetime's integer parts: exact up to the end of 9999, where a float timestamp rounds up past it."""
    delta = (at if at.tzinfo is not None else at.replace(tzinfo=UTC)) - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _ms(value: Duration) -> int:
    return round(seconds(value) * 1000)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a handler returns to end its attempt otherwise than with a result: made by :meth:`Run.retry`,
    :meth:`Run.snooze` and :meth:`Run.fail`. ``kind``: ``"retry"``, ``"snooze"`` or ``"fail"``; ``after``:
    seconds or ``None``; ``reason``: the error kept on the job."""

    kind: str
    after: float | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JobError:
    """One failed attempt of a job: its number, the error (``Type: message``), when (aware UTC datetime), and, when
    its handler raised, where from: the traceback as Python prints it (``traceback.format_exception``), at most
    4,000 characters (a longer one keeps its first 1,000 and its end, ``…`` between); ``None`` for an attempt that
    did not raise (a timeout, ``worker lost``, ``run.retry``, ``run.fail``, ``PermanentError``)."""

    attempt: int
    error: str
    at: datetime
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Job(Generic[T]):
    """A job as the store keeps it (JOB-02). Times are aware UTC datetimes (``None`` when not yet).

    ``state``: ``queued``, ``running``, ``succeeded``, ``failed`` (a retry is due at ``run_at``), ``dead`` or
    ``cancelled``. ``attempts``: attempts started (counted at each claim); ``max_attempts``: the queue's
    ``attempts``. ``progress``: the last progress (JSON value); ``result``: what the handler returned (JSON
    value); ``error``: the last error; ``errors``: the failed attempts, oldest first; ``steps``: the results of
    finished steps; ``fence``: the current (or last) attempt's fence; ``stuck``: running past ``expected``.
    """

    id: str
    queue: str
    state: JobState
    value: T
    attempts: int
    max_attempts: int
    fence: int
    key: str | None
    tenant: str | None
    user: str | None
    type: str | None
    priority: int
    progress: Any
    result: Any
    error: str | None
    errors: list[JobError]
    steps: dict[str, Any]
    run_at: datetime | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    stuck: bool = False

    @property
    def ended(self) -> bool:
        """``True`` once the job is ``succeeded``, ``dead`` or ``cancelled``."""
        return self.state in ENDED


@dataclass(frozen=True, slots=True)
class JobPage(Generic[T]):
    """A page of jobs, newest first; ``next`` is the cursor for the next page (``after=``), or ``None``."""

    jobs: list[Job[T]]
    next: str | None


def _as_step_type(value: Any, type: Any, what: str) -> Any:
    """A step's result ``value`` (as JSON decodes it) as ``type`` (as it is when ``None``); ``InvalidError`` naming
    ``what`` when it does not fit."""
    if type is None:
        return value
    try:
        return msgspec.convert(value, type, strict=False)
    except msgspec.ValidationError as exc:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidError(f"{what} {shown} does not fit {type_name(type)}: {exc}") from None


class Run:
    """What a handler gets beside the value: the attempt, and ways to report on it.

    ``job_id`` (str), ``attempt`` (1 for the first run), ``fence`` (int; grows with each attempt of the job:
    write it beside the job's effects and refuse a write whose fence is below the one stored, so a late attempt
    cannot overwrite a newer one), ``cancelled`` (an ``asyncio.Event`` set when the job was cancelled or the
    attempt lost; the handler's task is cancelled too), ``tenant``, ``key``, ``type``, ``user``, ``priority``,
    ``progress`` (the job's last progress when this attempt began: where an earlier attempt got to), ``queue``.
    """

    def __init__(self, attempt: _Attempt) -> None:
        self._a = attempt
        c = attempt.claimed
        self.job_id = c.id
        self.attempt = c.attempt
        self.fence = c.fence
        self.tenant = c.tenant or None
        self.key = c.key
        self.type = c.type or None  # ("" in a row written before "" was kept as none)
        self.user = c.user or None
        self.priority = c.priority
        self.progress = c.progress
        self.queue = attempt.runner.queue.name
        self.cancelled = asyncio.Event()
        self._where = f"queue {self.queue}: job {self.job_id}"
        self._steps = dict(c.steps)
        self._stepped: set[str] = set()  # the steps this attempt has returned
        self._stepping: set[str] = set()  # the steps this attempt runs now

    def set_progress(self, progress: Any) -> None:
        """Keep ``progress`` (any JSON value, such as ``{"done": 120, "total": 300}``, at most 4 KiB) on the job
        and publish it (JOB-10). Sent at most 10 times a second: a newer value replaces one not yet sent; the
        last one goes with the attempt's end. May be called from another thread, such as the blocking work the
        handler gives to ``asyncio.to_thread`` (otherwise it would raise "no running event loop"). Raises
        ``InvalidError`` (not JSON), ``LimitError`` (too big)."""
        text = _json(progress, f"queue {self.queue}: job {self.job_id}: the progress")
        limit = self._a.runner.queue.store.limits.job_progress_bytes
        if len(text.encode()) > limit:
            raise LimitError(
                f"queue {self.queue}: job {self.job_id}: the progress is {len(text.encode())} bytes of JSON, "
                f"over the {limit} bytes allowed",
                limit=limit,
                wanted=len(text.encode()),
            )
        loop = self._a.runner.loop
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:  # (no loop runs in this thread)
            here = False
        if here:
            self._a.set_progress(text)
            return
        # the last value at once (a plain handler that blocks the loop while it waits for this thread reports before
        # the loop runs the call below: trial DB), and its sending on the loop
        self._a.last_progress = text
        try:
            loop.call_soon_threadsafe(self._a.set_progress, text)
        except RuntimeError:  # the loop has closed (a thread that outlived it): the attempt is over, as on the loop
            pass

    @overload
    async def step(self, name: str, fn: Callable[[], object], *, type: builtins.type[R]) -> R: ...
    @overload
    async def step(self, name: str, fn: Callable[[], object], *, type: None = None) -> Any: ...
    async def step(self, name: str, fn: Callable[[], object], *, type: Any = None) -> Any:
        """Run step ``name`` once across the job's attempts (JOB-12): when an earlier attempt finished it, return
        its kept result without calling ``fn``; otherwise call ``fn()`` (awaiting what is awaitable), keep its
        result (JSON, at most 1 MiB) on the job, and return it. The result comes back as JSON decodes it (or as
        ``type`` when given), the same on the first run and on a resumed one.

        Raises what ``fn`` raises (nothing is kept then), ``InvalidError`` (a result that is not JSON, or that does
        not fit ``type``: nothing is kept then either; a kept result that does not fit ``type``; a bad name, an
        ``fn`` that is not callable, a ``type`` msgspec cannot convert to, a call from inside a transaction of the
        queue's own database), ``LimitError``, ``LostError`` (the attempt is no longer current: the job was
        cancelled or taken by another worker; the step's result was not kept). A cancel while ``fn`` runs keeps
        nothing.

        A name is one step: a second call of a name this attempt has already had returned raises ``InvalidError``
        (else ``for url in urls: await run.step("fetch", ...)`` would get the first URL's result for every URL);
        give each its own, ``f"fetch:{url}"``. So does a call of a name whose step runs now (steps run at once by
        ``asyncio.gather``). A step whose ``fn`` raised may be called again.
        """
        check_step_name(self._where, name)
        where = f"queue {self.queue}: job {self.job_id}: step {name!r}"
        if name in self._stepped:
            raise InvalidError(
                f"{where}: this attempt has run this step already; each step needs a name of its own (a step in a "
                "loop: a name for each round, such as f'fetch:{url}')"
            )
        if name in self._stepping:
            # (trial DA: steps of one name run at once, by gather, all ran, and the one kept was the last to end)
            raise InvalidError(
                f"{where}: this attempt runs this step already (called again before it returned, as by "
                "asyncio.gather); each step needs a name of its own, such as f'embed:{chunk}'"
            )
        if not callable(fn):
            raise InvalidError(f"{where}: fn must be a function called with no arguments, not {fn!r}")
        if type is not None:
            try:
                msgspec.json.Decoder(type)
            except TypeError as exc:
                raise InvalidError(f"{where}: type {type!r} is not a type a result can be read as ({exc})") from None
        if name in self._steps:
            kept = _as_step_type(self._steps[name], type, f"{where}: its result, kept by an earlier attempt,")
            self._stepped.add(name)
            return kept
        self._a.runner.queue._not_in_own_tx(f"step {name!r}")
        self._stepping.add(name)
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            text = _json(result, f"queue {self.queue}: job {self.job_id}: the result of step {name!r}")
            if type is not None:
                _as_step_type(msgspec.json.decode(text), type, f"{where}: its result (not kept)")
            ok = await self._a.runner.call(
                "jobs.step",
                Step(queue=self.queue, id=self.job_id, fence=self.fence, name=name, result=text),
                bool,
            )
        finally:
            self._stepping.discard(name)
        if not ok:
            raise LostError(
                f"queue {self.queue}: job {self.job_id}: attempt {self.attempt} is no longer current "
                f"(cancelled, or its lease ran out); step {name!r} was not kept"
            )
        value = msgspec.json.decode(text)
        self._steps[name] = value
        self._stepped.add(name)
        return _as_step_type(value, type, f"{where}: its result")

    def retry(self, after: Duration | None = None) -> Outcome:
        """Return this from the handler to fail this attempt and retry the job after ``after`` (default: the
        queue's backoff). It counts as a failed attempt: past ``attempts`` the job is ``dead``. Raises
        ``InvalidError`` for an ``after`` that is no duration (raised in the handler, that fails the attempt)."""
        if after is None:
            return Outcome("retry", None, "retry asked by the handler")
        return Outcome("retry", seconds(after, f"{self._where}: retry: after"), "retry asked by the handler")

    def snooze(self, after: Duration) -> Outcome:
        """Return this from the handler to run the job again after ``after`` (a duration: seconds, a timedelta or
        text such as ``"30s"``); the attempt is not counted. Raises ``InvalidError`` for an ``after`` that is no
        duration (raised in the handler, that fails the attempt)."""
        return Outcome("snooze", seconds(after, f"{self._where}: snooze: after"))

    def fail(self, reason: str | None = None) -> Outcome:
        """Return this from the handler to end the job ``dead`` at once, with ``reason`` (a str) kept (JOB-04);
        without one (``None``, as ``PermanentError()``), the job's error says the handler gave no reason.
        Raises ``InvalidError`` for a reason of another type: raised in the handler, that is the handler's
        error (a failed attempt, retried), not the job's end."""
        if reason is None:
            reason = ""
        if not isinstance(reason, str):
            raise InvalidError(
                f"{self._where}: fail: reason {shown(reason)} is not a str (say why the job cannot succeed)"
            )
        return Outcome("fail", None, reason)


Handler = Callable[[T, Run], object]
"""A job handler: ``handler(value, run)``, a function or a coroutine function; what it returns (awaited) ends the
attempt (see :meth:`Queue.work`)."""


class _Attempt:
    """One claimed attempt being run by a :class:`_Runner`."""

    def __init__(self, runner: _Runner, claimed: Claimed) -> None:
        self.runner = runner
        self.claimed = claimed
        self.key = (claimed.id, claimed.fence)
        self.task: asyncio.Task[None] | None = None
        self.why: str | None = None  # why the task was cancelled: lost, cancelled, stopping
        self.handed_back = False  # stopped before its end, its job handed back (the attempt not counted)
        self.reporting = False
        # its handler ended past its lease, as this worker counts it (its loop was blocked): until the store takes
        # its report, what the tasks the handler started send is refused (see _Runner._guard)
        self.late = False
        self.over = False  # its task has ended (its report sent, or none to send): it is renewed no more
        self.began = False  # its task ran (a task cancelled before its first step runs none of its code)
        self.freed = False  # its worker slot was given back (the handler ended; its report may be under way)
        self.renewed_at = time.monotonic()
        self.lease = claimed.lease_ms / 1000
        self.pending_progress: str | None = None
        self.last_progress: str | None = None  # the last value set, sent or not: it goes with the attempt's end
        self.progress_sent_at = 0.0
        self.progress_handle: asyncio.TimerHandle | None = None
        self.expired = False  # the handler's timeout fired (and cancelled the task)
        self.run = Run(self)

    def time_out(self) -> None:
        """The handler ran past its timeout: cancel it (``_run_attempt`` tells this cancel from others)."""
        if self.task is not None and not self.task.done() and not self.reporting:
            self.expired = True
            self.run.cancelled.set()
            self.task.cancel()

    def stop(self, why: str) -> None:
        """Cancel the handler (unless it is already reporting its end)."""
        if self.why is None:
            self.why = why
        # every reason (lost, cancelled, the worker stopping): the handler must stop, and a part of it the
        # task's cancel does not reach (a thread) learns it here (trial GV: not at a stop, nor at a timeout)
        self.run.cancelled.set()
        if self.task is not None and not self.task.done() and not self.reporting and self.began:
            self.task.cancel()  # (not yet begun, it sees ``why`` as it begins: see _Runner._execute)

    def set_progress(self, text: str) -> None:
        self.pending_progress = self.last_progress = text
        if self.progress_handle is not None or self.reporting:
            return
        wait = self.progress_sent_at + PROGRESS_INTERVAL - time.monotonic()
        self.progress_handle = self.runner.loop.call_later(max(0.0, wait), self._send_progress)

    def _send_progress(self) -> None:
        self.progress_handle = None
        text, self.pending_progress = self.pending_progress, None
        if text is None or self.reporting:
            return
        self.progress_sent_at = time.monotonic()
        c = self.claimed
        self.runner.spawn(
            self.runner.call_quiet(
                "jobs.progress", Progress(queue=self.runner.queue.name, id=c.id, fence=c.fence, progress=text), bool
            )
        )

    def take_progress(self) -> str | None:
        if self.progress_handle is not None:
            self.progress_handle.cancel()
            self.progress_handle = None
        self.pending_progress = None
        # the last value set, even when already sent: a send still under way when the attempt ends may reach the
        # store after its end and be refused (trial DA: the job kept {"done": 3} of 5)
        return self.last_progress


_registries: weakref.WeakKeyDictionary[Store, dict[tuple[str, str, int], _Attempt]] = weakref.WeakKeyDictionary()


def _registry(store: Store) -> dict[tuple[str, str, int], _Attempt]:
    """The attempts this SDK runs, by (queue, job id, fence), and the push handler that cancels them."""
    reg = _registries.get(store)
    if reg is None:
        reg = _registries[store] = {}
        table = reg

        def on_cancel(body: CancelRun) -> None:
            a = table.get((body.queue, body.id, body.fence))
            if a is not None:
                a.stop(body.reason)

        store.transport.on_push(CANCEL_PUSH, on_cancel, CancelRun)
    return reg


class _Runner:
    """Runs claimed attempts of one queue with one handler: renews their leases, sends progress, reports."""

    def __init__(self, queue: Queue[Any], handler: Handler[Any], worker: str) -> None:
        self.queue = queue
        self.handler = handler
        self.worker = worker
        self.loop = asyncio.get_running_loop()
        # an embedded store's test clock: handlers' timeouts follow it, as the store's leases and expected times do
        core = queue.store._core
        self.test_clock: Clock | None = core.clock if core is not None and core.clock.is_test else None
        self.hold_fatal = False
        self.fatal: BaseException | None = None
        self.attempts: dict[tuple[str, int], _Attempt] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.renewer: asyncio.Task[None] | None = None
        self.renew_due = asyncio.Event()  # set when an attempt starts whose renewal is due before the loop wakes
        self.renew_at = math.inf  # when the renewal loop wakes next (monotonic)
        self.registry = _registry(queue.store)
        self.finished = 0
        self.handling = 0  # attempts whose handler has not ended yet: the worker's slots in use
        self.slot = asyncio.Event()  # set when a slot is given back
        self.idle = asyncio.Event()
        self.idle.set()
        # the worker's own task (None for run_due): a cancel of an attempt's task that comes while this one is
        # cancelled too is the program ending (asyncio.run cancels every task), else the handler's own doing
        self.owner: asyncio.Task[Any] | None = None
        self.grace: asyncio.Timeout | None = None  # the grace of a stop under way
        self.grace_end: float | None = None  # (loop time) no stop's grace lasts past it (see shorten)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def call(self, method: str, request: Any, response_type: Any = Any) -> Any:
        return await self.queue.store._call(method, request, response_type, write=False, retry=True)

    async def call_quiet(self, method: str, request: Any, response_type: Any = Any) -> Any:
        try:
            return await self.call(method, request, response_type)
        except (TinystoreError, OSError) as exc:
            log.debug("queue %s: %s failed: %s", self.queue.name, method, exc)
            return None

    def start(self, claimed: Claimed, sent: float | None = None) -> _Attempt:
        """Run ``claimed``, got by a claim sent at ``sent`` (``time.monotonic()``). Its lease counts from no later
        than ``sent`` + the time the store held the claim (``waited_ms``): an answer read after the lease had run out
        as this worker counts it (its process was paused, SIGSTOP, while the answer waited in its socket) is not
        run: the store ends that attempt as lost (else its handler would run whole after the store had ended the job
        dead, and a write guarded by its fence be taken, no later attempt's fence being above it)."""
        a = _Attempt(self, claimed)
        if sent is not None and claimed.waited_ms is not None and not self.queue.store.transport.local:
            a.renewed_at = min(a.renewed_at, sent + claimed.waited_ms / 1000)  # (looked at as its task first runs)
        self.attempts[a.key] = a
        self.registry[(self.queue.name, claimed.id, claimed.fence)] = a
        self.handling += 1
        self.idle.clear()
        a.task = self.loop.create_task(self._execute(a))
        a.task.add_done_callback(lambda t: self._done(a, t))
        if self.renewer is None or self.renewer.done():
            self.renewer = self.loop.create_task(self._renew_loop())
        elif a.renewed_at + a.lease / 3 < self.renew_at:
            self.renew_due.set()  # (due before the loop wakes: a shorter lease; not for each job of a busy queue)
        return a

    def _past_lease(self, a: _Attempt) -> bool:
        """Whether attempt ``a``, not begun, is past its lease as this worker counts it (its process was paused, or
        its loop blocked, since the claim): then it is marked lost, never to run (the store ends it as lost)."""
        transport = self.queue.store.transport
        if transport.local or a.why is not None:
            return a.why is not None
        if time.monotonic() < _lease_end(a, getattr(transport, "server_stopped_at", None)):
            return False
        a.why = "lost"  # (its task returns at once, running nothing)
        log.warning(
            "queue %s: job %s: attempt %d was claimed %s ago, past its lease (was this process paused, or its event "
            "loop blocked?): not run; the store ends the attempt as lost",
            self.queue.name,
            a.claimed.id,
            a.claimed.attempt,
            f"{time.monotonic() - a.renewed_at:.1f}s",
        )
        return True

    def free(self, a: _Attempt) -> None:
        """The handler of ``a`` ended: its slot goes back to the worker, which may claim again while the report is
        under way (the store counts the job as running until the report comes, so ``max_running`` holds)."""
        if not a.freed:
            a.freed = True
            self.handling -= 1
            self.slot.set()

    def _done(self, a: _Attempt, task: asyncio.Task[None]) -> None:
        if not a.reporting:  # (its job cancelled, or its attempt lost: no report; late or not as it ended)
            self._mark_late(a)
        a.over = True
        self.free(a)
        if not task.cancelled():
            task.exception()  # retrieved: only KeyboardInterrupt or SystemExit end it so, and they went on already
        self.attempts.pop(a.key, None)
        self.registry.pop((self.queue.name, a.claimed.id, a.claimed.fence), None)
        self.finished += 1
        if not self.attempts:
            self.idle.set()

    def _mark_late(self, a: _Attempt) -> None:
        """As attempt ``a``'s handler has ended: mark it ``late`` when it ended past its lease as this worker counts
        it, so that the tasks it started send nothing more (see :meth:`_guard`; trial IW: a handler that blocked its
        loop past the lease, then returned, left a task that wrote after the store had given the job to another
        attempt; trial IY: so did one stopped with its worker that held the loop in its clean-up)."""
        transport = self.queue.store.transport
        if transport.local:
            return
        a.late = (
            a.late or a.why == "lost" or time.monotonic() > _lease_end(a, getattr(transport, "server_stopped_at", None))
        )

    def _guard(self, a: _Attempt, method: str) -> None:
        """Before a call of attempt ``a``'s handler is sent (see :mod:`.attempt_guard`): raise ``LostError``, and
        stop the handler, once this worker counts ``a`` past its lease (its renewal had not come through: its
        process was paused, or its event loop blocked). The store may have ended the attempt and another worker run
        the job: what the handler would send now came after that (trial IL: its write went out first, as the
        process woke, before its worker's renewal looked at the lease). A handler stopped for another reason (its job
        cancelled, its worker stopping) is looked at the same way while it ends: it is renewed meanwhile, so only a
        clean-up that held the loop past the lease is refused (trial IY). Once the attempt is over, what the tasks it
        started send is refused only when it ended past its lease and the store did not take its report (trial IW:
        such a task wrote after another attempt had begun); otherwise nothing (trial IN: tasks refused after their
        job's cancel, as if the process had been paused)."""
        if a.reporting or a.handed_back or a.over:
            if not a.late:
                return
            raise LostError(
                f"queue {self.queue.name}: job {a.claimed.id}: attempt {a.claimed.attempt} ended past its lease (its "
                "worker could not renew it in time: was this process paused, or its event loop blocked?), and the "
                f"store did not take its end: {method}, sent by a task its handler started, was not sent; the store "
                "may have ended the attempt, and another worker may run the job"
            )
        if a.why != "lost":
            # (a handler stopped for another reason, its job cancelled or its worker stopping, is still renewed while
            # it ends: its clean-up may write, unless it too held the loop past the lease: trial IY, or its renewal
            # found it so, trial JA)
            transport = self.queue.store.transport
            if not a.late and time.monotonic() <= _lease_end(a, getattr(transport, "server_stopped_at", None)):
                return
            if a.why is not None:
                raise LostError(
                    f"queue {self.queue.name}: job {a.claimed.id}: attempt {a.claimed.attempt} is past its lease (its "
                    "worker could not renew it in time: was this process paused, or its event loop blocked?) as its "
                    f"handler ends: {method} was not sent; the store ends the attempt, and another worker may run the "
                    "job"
                )
            log.warning(
                "queue %s: job %s: attempt %d is past its lease, not renewed for %.1fs (was this process paused, or "
                "its event loop blocked?): its handler is stopped, and %s was not sent",
                self.queue.name,
                a.claimed.id,
                a.claimed.attempt,
                time.monotonic() - a.renewed_at,
                method,
            )
            a.stop("lost")
        raise LostError(
            f"queue {self.queue.name}: job {a.claimed.id}: attempt {a.claimed.attempt} is past its lease (its "
            f"worker could not renew it in time: was this process paused, or its event loop blocked?): {method} "
            "was not sent; the store ends the attempt, and another worker may run the job"
        )

    async def _renew_loop(self) -> None:
        """Renew the running attempts, all in one call, when the first of them is a third of its lease past its
        last renewal. An attempt started meanwhile wakes the loop: its lease may be shorter than those it slept for
        (trial BQ: a lease shortened by `configure` while a job ran was renewed every third of the old one, and
        healthy attempts were lost)."""
        while self.attempts:
            self.renew_due.clear()
            due = self.renew_at = min(a.renewed_at + a.lease / 3 for a in self.attempts.values())
            wait = due - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self.renew_due.wait()
                if self.renew_due.is_set():
                    continue  # (an attempt started: look again at when the first renewal is due)
            self.renew_at = math.inf  # (renewing: an attempt that starts meanwhile is renewed with the next call)
            current = list(self.attempts.values())
            if not current:
                return
            lease = min(a.lease for a in current)
            sent = time.monotonic()
            transport = self.queue.store.transport
            try:
                # (no longer than until the first attempt's lease ends: looked at then, not half a lease later, when
                # the store has ended it and another worker runs the job; trial CV)
                async with asyncio.timeout(max(min(lease / 3, self._lease_left(current, transport)), 0.05)):
                    lost = []
                    for at in range(0, len(current), RENEW_MAX):  # (in parts the server takes)
                        part = [Attempt(a.claimed.id, a.claimed.fence) for a in current[at : at + RENEW_MAX]]
                        lost += await self.call(
                            "jobs.renew", Renew(queue=self.queue.name, attempts=part), builtins.list[str]
                        )
            except (TinystoreError, OSError, TimeoutError) as exc:
                log.debug("queue %s: renewal failed: %s", self.queue.name, exc)
                stopped_at = getattr(transport, "server_stopped_at", None)
                for a in current:
                    if a.reporting or a.why is not None:
                        continue  # its handler has ended (its report is on its way), or it was told already
                    if not transport.local and time.monotonic() > _lease_end(a, stopped_at):
                        log.warning("queue %s: job %s: no renewal for the whole lease: lost", self.queue.name, a.key[0])
                        a.stop("lost")
                # then again (the attempts' renewals stay due), and no later than the first lease's end
                await asyncio.sleep(max(min(lease / 6, 2.0, self._lease_left(current, transport)), 0.0))
                continue
            told_lost = _lost_of(current, lost)
            stopped_at = getattr(transport, "server_stopped_at", None)
            for a in current:
                if (
                    a.why is not None
                    and a.why != "lost"
                    and (sent > _lease_end(a, stopped_at) or (a.why != "cancelled" and a in told_lost))
                ):
                    # a handler stopped for another reason (its worker stopping, its job cancelled) that held the
                    # loop past its lease as it ended, or whose attempt the store ended meanwhile: what it and its
                    # tasks send from now on is refused, this renewal's fresh count notwithstanding (trial JA: a
                    # clean-up that waited for the next renewal after holding the loop wrote after the next attempt)
                    a.late = True
                a.renewed_at = sent  # (one the store says is lost too: told now, not renewed again until it ends)
            for a in told_lost:
                if a.why is None:  # (one told already, cancelled, cleans up: not cancelled again, trial FM)
                    a.stop("lost")

    @staticmethod
    def _lease_left(current: builtins.list[_Attempt], transport: Any) -> float:
        """Seconds until the first lease of ``current`` ends as this worker counts it (see :meth:`_renew_loop`);
        ``math.inf`` in this process's store (no lease)."""
        if transport.local:
            return math.inf
        stopped_at = getattr(transport, "server_stopped_at", None)
        ends = [_lease_end(a, stopped_at) for a in current if not a.reporting and a.why is None]
        return min(ends, default=math.inf) - time.monotonic()

    async def _report(self, a: _Attempt, outcome: str, **kw: Any) -> None:
        """Report how attempt ``a`` ended. Raises nothing but a cancel: a report the store refuses is sent again as
        a failed attempt saying why; one that cannot get through is sent again (backoff up to 5 s) until it does or
        the store is closed (then it is left to the attempt's lease, with an error in the log)."""
        a.reporting = True
        self._mark_late(a)
        self.free(a)
        c = a.claimed
        if kw.get("error") is not None:
            kw["error"] = _clean(kw["error"])
        report = Report(
            queue=self.queue.name, id=c.id, fence=c.fence, outcome=outcome, progress=a.take_progress(), **kw
        )

        def failed(why: str) -> Report:
            return Report(queue=self.queue.name, id=c.id, fence=c.fence, outcome="error", error=_clean(why))

        # a store that cannot take the report now (unreachable, restarting, its disk full) is asked again, with
        # backoff up to 5 s, for as long as it is open: the job ends as its handler did once the store can write
        # again (its lease cannot run out meanwhile: that too is a write), not "worker lost" and run again
        delay = 0.2
        refusals = 0
        while True:
            try:
                took = await self.call("jobs.report", report, bool)
                if took:
                    a.late = False  # (the store had not ended the attempt: what its handler's tasks send may go)
                return
            except (UnavailableError, OutcomeUnknownError, ClosedError) as exc:
                if self.queue.store._closed:
                    break
                if self.queue.store._gone_for_good() is not None:
                    # (trial IA: a store restored from a backup in its place, "another store now", was tried again
                    # every 5 s, a warning each time, until the worker ended)
                    break
                log.warning(
                    "queue %s: job %s: report failed (%s); trying again in %gs", self.queue.name, c.id, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except (InvalidError, LimitError) as exc:
                refusals += 1
                if refusals > 3:
                    break
                report = failed(f"the attempt's report was refused: {exc.message}")
            except Exception as exc:  # not the store's refusal: a report that cannot even be sent
                refusals += 1
                if refusals > 3:
                    break
                log.error("queue %s: job %s: report failed: %s", self.queue.name, c.id, _describe(exc), exc_info=exc)
                report = failed(f"the attempt's report failed: {_describe(exc)}")
        if self.queue.store._closed:
            return
        gone = self.queue.store._gone_for_good()
        log.error(
            "queue %s: job %s: attempt %d: its end could not be reported%s; it stays running until its lease runs out",
            self.queue.name,
            c.id,
            c.attempt,
            f" (the store will not be reached again: {gone.message})" if gone is not None else "",
        )

    async def _execute(self, a: _Attempt) -> None:
        """Run attempt ``a`` and report its end, whatever way the handler ends: no attempt is left unreported,
        and nothing is left for "Task exception was never retrieved"."""
        a.began = True
        if a.why is not None or self._past_lease(a):
            # stopped before its task first ran (in the loop turn it was made: trial BU): its handler never runs;
            # handed back uncounted, unless the store already ended the attempt (lost, cancelled)
            if a.why not in ("lost", "cancelled"):
                a.reporting = True
                self.free(a)
                await self.hand_back([a.claimed])
            return
        try:
            await self._run_attempt(a)
        except (KeyboardInterrupt, SystemExit) as exc:
            if self.hold_fatal:  # run_due: raised in its caller's task, not out of the event loop
                self.fatal = exc
                return
            raise
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a fault of the worker itself (the handler's own raises are handled inside)
            c = a.claimed
            text = _describe(exc)
            log.error("queue %s: job %s: running the attempt failed: %s", self.queue.name, c.id, text, exc_info=exc)
            if not a.reporting:
                await self._report(a, "error", error=f"the worker failed: {text}")

    async def _stopped(self, a: _Attempt, exc: BaseException) -> None:
        """The handler raised the ``LostError`` of a lock or semaphore it held that ended with the store's graceful
        stop (LOCK-07; alone, or all of a TaskGroup's errors): the store's doing, not the job's. Not counted, as a
        snooze, due again at once (trial GN: each stop cost such a job an attempt; enough of them made it dead)."""
        log.info(
            "queue %s: job %s: attempt %d ended as the store stopped (%s): not counted, it runs again",
            self.queue.name,
            a.claimed.id,
            a.claimed.attempt,
            _describe(exc),
        )
        await self._report(a, "snooze", after_ms=0)

    async def _run_attempt(self, a: _Attempt) -> None:
        q = self.queue
        c = a.claimed
        run = a.run
        try:
            value = q._decode(c.value)
        except Exception as exc:
            # a failed attempt, retried after the backoff (trial GV: it ended dead at once): after a deploy that
            # changed the type, a worker of the old type may still take it, or a `retry` once the code is mended
            why = exc.message if isinstance(exc, TinystoreError) else _describe(exc)
            log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, why)  # (as every other: HD)
            await self._report(a, "error", error=why)
            return
        timeout = c.timeout_ms / 1000
        timed_out = False
        # the timeout as asyncio.timeout keeps it (its cancel is told from others by the task's cancel count),
        # for the price of one timer
        loop = self.loop
        clock = self.test_clock
        now: Callable[[], float] = loop.time if clock is None else clock.now
        deadline = now() + timeout
        timer: asyncio.TimerHandle | Timer = (
            loop.call_at(deadline, a.time_out) if clock is None else clock.call_at(deadline, a.time_out)
        )
        guarded = (
            None if self.queue.store.transport.local else attempt_guard.CURRENT.set(functools.partial(self._guard, a))
        )
        try:
            try:
                try:
                    result = self.handler(value, run)
                    if inspect.isawaitable(result):
                        result = await result
                finally:
                    if guarded is not None:
                        attempt_guard.CURRENT.reset(guarded)
            except asyncio.CancelledError:
                if not a.expired:
                    raise
                a.expired = False
                if a.task is None or a.task.uncancel() > 0:
                    raise  # cancelled from elsewhere too: that cancel goes on
                timed_out = True
            finally:
                timer.cancel()
            if a.expired:  # it fired, yet the handler ended without its cancel (it caught it): count that cancel
                a.expired = False  # back; the attempt timed out all the same
                if a.task is not None:
                    a.task.uncancel()
                timed_out = True
            elif not timed_out and now() > deadline:
                timed_out = True  # a handler that blocked the loop past its timeout (the timer could not fire)
        except asyncio.CancelledError as exc:
            if a.why in ("lost", "cancelled"):
                return  # the store already decided this attempt's end
            task = asyncio.current_task()
            if a.why is None and (task is None or task.cancelling() == 0):
                # Nobody cancelled this task: the handler raised CancelledError itself (or let one of its own
                # tasks' cancels through). A failed attempt like any other raise, counted, so it ends dead.
                text = _describe(exc)
                log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text)
                await self._report(a, "error", error=text, traceback=_traceback_of(exc))
                return
            owner = self.owner
            if a.why is None and task is not None and owner is not None and not owner.done() and not owner.cancelling():
                # this attempt's task alone was cancelled, and not by its worker: by the handler itself
                # (asyncio.current_task().cancel()) or code it handed its task to. Handing the job back uncounted
                # would run it again at once, for ever: a failed attempt, counted, so it ends dead.
                task.uncancel()
                text = "CancelledError: the attempt's task was cancelled, not by its worker"
                log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text)
                await self._report(a, "error", error=text)
                return
            # stopped with its worker, or cancelled from outside (the event loop ending): hand the job back,
            # this attempt not counted
            a.reporting = a.handed_back = True
            self._mark_late(a)
            self.free(a)
            await self.hand_back([c], ANSWER_WAIT)  # (else left to its lease: trial CS)
            if a.why is None:
                raise
            return
        except PermanentError as exc:
            text = exc.message if isinstance(exc.message, str) else _text_of(exc)
            await self._report(a, "fail", error=text or f"{type(exc).__name__} (the handler gave no reason)")
            return
        except ExceptionGroup as group:
            # raised by a TaskGroup (or asyncio.gather's callers that group): made only of PermanentErrors, it is
            # the handler's PermanentError all the same (JOB-04; trial DA: it was retried, its error the group's)
            if all(_lost_to_a_stop(e) for e in _leaves(group)):
                await self._stopped(a, group)  # (a lock held in a TaskGroup's task: trial GP)
                return
            permanent, others = group.split(PermanentError)
            if permanent is not None and others is None:
                reasons = dict.fromkeys(
                    (e.message if isinstance(e.message, str) else _text_of(e)) or "the handler gave no reason"
                    for e in _leaves(permanent)
                )
                await self._report(a, "fail", error="; ".join(reasons))
                return
            text = _describe(group)
            log.info(
                "queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text, exc_info=_exc_info(group)
            )
            await self._report(a, "error", error=text, traceback=_traceback_of(group))
            return
        except LostError as exc:
            if a.why in ("lost", "cancelled"):
                return  # this attempt itself was lost (its lease, or the job cancelled): the store decided its end
            if _lost_to_a_stop(exc):
                await self._stopped(a, exc)
                return
            # the handler's own (a lock's lease it held ran out, or raised by its code; also as a worker's stop
            # cancels it, where it went unreported: trial CT): a failed attempt like any other raise, with its
            # traceback and its log line (trial CQ: neither was kept)
            text = _describe(exc)
            log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text, exc_info=_exc_info(exc))
            await self._report(a, "error", error=text, traceback=_traceback_of(exc))
            return
        except Exception as exc:
            text = _describe(exc)
            # with its traceback (trial BZ: the job's error names the exception, not where it was raised)
            log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text, exc_info=_exc_info(exc))
            await self._report(a, "error", error=text, traceback=_traceback_of(exc))
            return
        except BaseException as exc:
            # GeneratorExit, KeyboardInterrupt, SystemExit or another BaseException: the attempt failed all the
            # same (an embedded store has no lease to notice it otherwise). KeyboardInterrupt and SystemExit then
            # go on: they are meant to end the program.
            text = _describe(exc)
            log.warning(
                "queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, text, exc_info=_exc_info(exc)
            )
            await self._report(a, "error", error=text, traceback=_traceback_of(exc))
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return
        if timed_out:
            await self._report(a, "error", error=f"timed out after {timeout:g}s")
            return
        if a.why in ("lost", "cancelled"):
            return
        if isinstance(result, Outcome):
            after = None if result.after is None else round(result.after * 1000)
            if result.kind == "retry":
                await self._report(a, "error", error=result.reason or "retry", after_ms=after)
            elif result.kind == "snooze":
                await self._report(a, "snooze", after_ms=after or 0)
            else:
                await self._report(a, "fail", error=result.reason or "run.fail (the handler gave no reason)")
            return
        try:
            text = _json(result, f"queue {q.name}: job {c.id}: the result")
            limit = q.store.limits.job_value_bytes
            if len(text.encode()) > limit:
                raise LimitError(
                    f"queue {q.name}: job {c.id}: the result is {len(text.encode())} bytes of JSON, over the "
                    f"{limit} bytes allowed",
                    limit=limit,
                    wanted=len(text.encode()),
                )
        except (InvalidError, LimitError) as exc:
            # a failed attempt, logged as every other is (docs/jobs.md: at INFO; trial DO: this one was at ERROR)
            # (``Type: message``, as a handler's own raise reads: trial EF)
            log.info("queue %s: job %s: attempt %d failed: %s", q.name, c.id, c.attempt, _describe(exc))
            await self._report(a, "error", error=_describe(exc))
            return
        await self._report(a, "succeeded", result=text)

    async def hand_back(self, claimed: builtins.list[Claimed], wait: float | None = None) -> None:
        """Hand back attempts claimed and not run (their jobs queued again, due now, the attempts not counted);
        errors are not raised. ``wait``: seconds to wait for the store's answer (else left to the leases)."""
        with contextlib.suppress(TinystoreError, OSError):
            try:
                async with asyncio.timeout(wait):
                    for at in range(0, len(claimed), RELEASE_MAX):  # (in parts the server takes)
                        part = [Attempt(c.id, c.fence) for c in claimed[at : at + RELEASE_MAX]]
                        await self.call("jobs.release", Release(queue=self.queue.name, attempts=part), int)
            except TimeoutError:
                if wait is None:
                    raise

    def waited_at_close(self) -> int:
        """The handlers a close of the store waits for: those running, but the one that closes it (see stop)."""
        closer = self.queue.store._closer
        return self.handling - sum(1 for a in self.attempts.values() if a.task is not None and a.task is closer)

    def shorten(self, grace: float) -> None:
        """A stop, under way or still to begin its grace, lets running attempts finish for no more than ``grace``
        seconds from now (also when asked before the stop's grace has begun)."""
        end = asyncio.get_running_loop().time() + grace
        if self.grace_end is None or end < self.grace_end:
            self.grace_end = end
        timeout = self.grace
        if timeout is not None:
            when = timeout.when()
            if when is None or end < when:
                timeout.reschedule(end)

    async def stop(self, grace: float) -> None:
        """Let running attempts finish for ``grace`` seconds, then cancel them (their jobs are handed back).
        While it waits, ``self.grace`` is its timeout: a later :meth:`Worker.stop` may move it sooner.

        The attempt whose handler closes the store (it awaits the very close that stops this) is neither waited
        for nor stopped: it could not end first (else the close would wait 10 s for it, then hand its job back
        uncounted, to run again at every start). It ends after the close, unreported: its lease (or, embedded, the
        next start) ends it, counted."""
        closer = self.queue.store._closer

        def others() -> list[_Attempt]:
            return [a for a in self.attempts.values() if a.task is None or a.task is not closer]

        end = asyncio.get_running_loop().time() + grace
        if self.grace_end is not None:
            end = min(end, self.grace_end)
        if others() and end > asyncio.get_running_loop().time():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(end) as self.grace:
                    if len(others()) == len(self.attempts):
                        await self.idle.wait()
                    else:
                        await asyncio.wait([a.task for a in others() if a.task is not None])
            self.grace = None
        for a in others():
            a.stop("stopping")
        of = {a.task: a for a in others() if a.task is not None}
        if of:
            # handlers get CANCEL_WAIT to end; an attempt whose handler has ended and whose end is still being
            # reported (a server that does not answer) gets ANSWER_WAIT (trial CS: it was waited for as a stubborn
            # handler, and named one)
            deadline = self.loop.time() + CANCEL_WAIT
            reports_until = self.loop.time() + ANSWER_WAIT
            pending: set[asyncio.Task[Any]] = set(of)
            while pending:
                handlers = any(not of[t].reporting for t in pending)
                left = (deadline if handlers else min(deadline, reports_until)) - self.loop.time()
                if left <= 0:
                    break
                _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            stubborn = {t for t in pending if not of[t].reporting}
            reporting = len(pending) - len(stubborn)
            if reporting:
                log.warning(
                    "queue %s: %d attempt(s) ended, and their ends could not be reported yet (the store does not "
                    "answer): the worker stops without waiting; they are sent again until the store closes",
                    self.queue.name,
                    reporting,
                )
            if stubborn:
                # (trial CD: stop returned while such a handler ran on, and said nothing)
                log.warning(
                    "queue %s: %d handler(s) still run %gs after their cancel (a handler that catches "
                    "CancelledError must raise it again): the worker stops without them; their attempts are left "
                    "to their leases, and count (worker lost), or, in a store embedded in this process (no lease), "
                    "run on and end as they end",
                    self.queue.name,
                    len(stubborn),
                    CANCEL_WAIT,
                )
        if self.renewer is not None:
            self.renewer.cancel()
            with contextlib.suppress(BaseException):
                await self.renewer
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=5)


class Worker:
    """Runs a queue's jobs with a handler, ``concurrency`` at a time, until :meth:`stop` or the store closes.

    Made by :meth:`Queue.work`. ``ran``: attempts finished so far (any outcome). ``running``: handlers running now.
    """

    def __init__(self, queue: Queue[Any], handler: Handler[Any], concurrency: int) -> None:
        check_concurrency(queue.name, "work", concurrency)
        self.queue = queue
        self.concurrency = int(concurrency)  # (an int subclass as a plain int: trial GR)
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._runner = _Runner(queue, handler, self.id)
        self._stopping = False
        self._stop_task: asyncio.Task[None] | None = None
        self._gone = False  # the store closed under the worker
        self._asked = 0  # attempts asked for by claims under way
        self._failures = 0  # claims failed in a row (their backoff grows)
        self._fault: Exception | None = None  # what broke a claim that was not the store's refusal
        self._claims: set[asyncio.Task[None]] = set()  # claims under way
        self._task = attempt_guard.spawn(self._loop())  # (the SDK's own: see attempt_guard.spawn)
        self._runner.owner = self._task
        queue.store._stop_hooks.append(self._stop_at_close)
        queue.store._close_shorteners.append(self._runner.shorten)

    @property
    def ran(self) -> int:
        """How many attempts this worker's handlers have finished (whatever their outcome) since it started."""
        return self._runner.finished

    @property
    def running(self) -> int:
        """How many of this worker's handlers run now (at most its ``concurrency``)."""
        return self._runner.handling

    @property
    def error(self) -> BaseException | None:
        """What ended this worker by itself, or ``None`` (it runs, or :meth:`stop` or the store's close ended
        it): an ``InvalidError`` when the queue's options differ from the store's, or what broke its claims."""
        task = self._task
        if not task.done() or task.cancelled():
            return None
        return task.exception()

    async def wait(self) -> None:
        """Wait until this worker ends: returns once :meth:`stop` (or the store's close) has stopped it, raises
        what ended it by itself (:attr:`error`: ``InvalidError`` for options that differ from the store's, which
        the worker finds when it opens the queue). A worker process's main task can ``await worker.wait()``
        rather than sleep for ever beside a worker that has ended. A cancel of ``wait`` leaves the worker
        running."""
        await asyncio.wait([self._task])  # (neither raises what ended it nor cancels it)
        error = self.error
        if error is not None:
            raise error
        if self._stop_task is not None:  # else the store closed under it: it claims nothing more
            await asyncio.wait([self._stop_task])

    async def _loop(self) -> None:
        """Keep the worker's slots busy: whenever slots are free and no claim under way asks for them, claim that
        many. Claims overlap: slots freed while one claim waits for its commit are claimed at once by another,
        so a busy worker's handlers never wait for each other's claims."""
        q = self.queue
        runner = self._runner
        try:
            await q._ensure()
        except TinystoreError as exc:
            log.error("queue %s: the worker could not open the queue, and ended: %s", q.name, exc.message)
            raise
        claims = self._claims
        try:
            while not self._stopping and not self._gone:
                if self._fault is not None:
                    raise self._fault  # not the store's refusal (those are handled in _claim_some): the worker's own
                free = self.concurrency - runner.handling - self._asked
                if free > 0:
                    self._asked += free
                    t = attempt_guard.spawn(self._claim_some(free))
                    claims.add(t)
                    t.add_done_callback(claims.discard)
                    continue
                runner.slot.clear()
                await runner.slot.wait()  # a slot given back, a claim ended, or stop()
        finally:
            if claims:
                # a claim under way is cancelled, whatever ended the loop: it ends its wait in the store and hands
                # back what it got. (stop()'s unwait alone misses a claim still on its way to the store, which
                # would then wait there and take jobs for a worker that is gone.)
                for t in claims:
                    t.cancel()
                await asyncio.wait(list(claims), timeout=10)

    async def _hand_back_now(self, got: builtins.list[Claimed]) -> None:
        """Hand back attempts claimed for a worker that is stopping (errors logged, not raised)."""
        await self._runner.hand_back(got)

    async def _claim_some(self, n: int) -> None:
        """One claim of up to ``n`` attempts for free slots; starts what it gets. A failed claim waits out its
        backoff before its slots may be claimed again."""
        q = self.queue
        runner = self._runner
        try:
            try:
                written: list[float] = []  # when the claim was written to the connection (it may wait its turn)
                got = await claim(q.store, q.name, n, CLAIM_WAIT, self.id, sent=written.append)
                self._failures = 0
            except ClosedError:
                if q.store._closed or q.store.transport.closed:
                    self._gone = True
                    return
                self._failures += 1
                await asyncio.sleep(min(2.0, 0.05 * 2**self._failures))
                return
            except OutcomeUnknownError:
                # the connection dropped under the claim: what it got is handed back once the store is reached
                # again (claim()), and the worker claims again then; nothing to warn of (trial AU)
                self._failures += 1
                log.info("queue %s: a claim was cut by a lost connection; what it got is handed back", q.name)
                await asyncio.sleep(min(2.0, 0.05 * 2**self._failures))
                return
            except (TinystoreError, OSError) as exc:
                gone = q.store._gone_for_good()
                if gone is not None:
                    # (trial CY: it claimed every 2 s for ever, and wait() never returned to the process's supervisor)
                    log.error("queue %s: the store will not be reached again, and the worker ends: %s", q.name, gone)
                    self._fault = gone
                    return
                self._failures += 1
                if self._failures in (1, 10):
                    log.warning("queue %s: claim failed: %s", q.name, exc)
                await asyncio.sleep(min(2.0, 0.05 * 2**self._failures))
                return
            if self._stopping:
                if got:
                    # the stop cancels this task once its loop ends: the hand-back goes on all the same (left
                    # undone, the attempts stay running until their lease runs out, and count as lost; an
                    # embedded store's own workers have no lease at all)
                    back = attempt_guard.spawn(self._hand_back_now(got))
                    try:
                        await asyncio.shield(back)
                    except asyncio.CancelledError:
                        await asyncio.wait([back], timeout=10)
                        raise
                return
            sent = written[-1] if written else None
            for c in got:
                runner.start(c, sent)
        except Exception as exc:
            self._fault = exc
        finally:
            self._asked -= n
            runner.slot.set()

    async def stop(self, grace: Duration = "10s") -> None:
        """Stop claiming; let running handlers finish for ``grace`` (10 s), then cancel them: their jobs are
        handed back to the queue, due now, the cancelled attempt not counted. Idempotent; also run when the store
        closes. Raises ``InvalidError`` for a ``grace`` that is no duration (before anything stops); nothing
        else: a store that is gone leaves the attempts to their leases.

        A cancel of ``stop``, once it has begun (a task of ``stop()`` cancelled before it first ran ran none of
        it, as any coroutine), leaves the stop going on; a later call waits for it (with a shorter ``grace``, it
        cuts the grace short), so when any call returns, no handler of this worker runs, but one that ignores
        its cancel (catches ``CancelledError`` and goes on, or blocks its thread) for :data:`CANCEL_WAIT` (10 s)
        more: ``stop`` then logs a warning and returns without it, its attempt left to its lease (it counts, as
        ``worker lost``). So ``stop`` takes at most ``grace`` + 10 s, and a moment for the hand-backs (2 s more
        when the store does not answer: it is not waited for longer)."""
        grace_s = seconds(grace, f"queue {self.queue.name}: worker stop: grace")
        task = self._stop_task
        if task is None:
            self._stopping = True
            self._runner.slot.set()
            task = self._stop_task = attempt_guard.spawn(self._stop(grace_s))
        else:
            self._runner.shorten(grace_s)
        await asyncio.shield(task)

    async def _stop_at_close(self) -> None:
        """The store closes: :meth:`stop` with the close's grace (10 s unless given), saying so when handlers run
        (trial BU: a program stopped by Ctrl-C sat silent for 10 s)."""
        grace = _close_grace(self.queue.store)
        if self._stop_task is None and self._runner.waited_at_close() and grace > 0:
            log.warning(
                "queue %s: the store is closing: its worker lets %d running handler(s) finish for up to %gs, then "
                "cancels them (their jobs go back to the queue); store.close(grace=...) or worker.stop(grace) chooses",
                self.queue.name,
                self._runner.waited_at_close(),
                grace,
            )
        await self.stop(grace)

    async def _stop(self, grace: float) -> None:
        q = self.queue
        wait = 5.0  # for the claims under way to end (the unwait ends them at the store)
        if q.store.transport.connected:  # else its claims ended with the connection: no waiting for a reconnect
            # (bounded: a server that does not answer held stop until the connection was found dead; trial CS)
            wait = 0.0  # (unanswered: the claims would not end either; trial CT: 5 s more)
            with contextlib.suppress(TinystoreError, OSError, TimeoutError):
                async with asyncio.timeout(ANSWER_WAIT):
                    await q.store._call("jobs.unwait", Unwait(queue=q.name, worker=self.id), int, retry=False)
                    wait = 5.0
        with contextlib.suppress(BaseException):
            async with asyncio.timeout(wait):
                await asyncio.shield(self._task)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self._runner.stop(grace)
        with contextlib.suppress(ValueError):
            q.store._stop_hooks.remove(self._stop_at_close)
        with contextlib.suppress(ValueError):
            q.store._close_shorteners.remove(self._runner.shorten)

    def __repr__(self) -> str:
        error = self.error
        state = f" ended: {error}" if error is not None else " stopped" if self._task.done() else ""
        return f"<tinystore.Worker queue={self.queue.name} running={self.running} ran={self.ran}{state}>"


_handing_back: set[asyncio.Task[Any]] = set()
# claim tokens: random once per process, then counted (a random token per claim costs a system call, which lets
# go of the GIL on the loop's hot path)
_TOKEN_PREFIX = uuid.uuid4().hex
_tokens = itertools.count(1)


def _new_token_prefix() -> None:  # a forked child draws its own
    global _TOKEN_PREFIX
    _TOKEN_PREFIX = uuid.uuid4().hex


os.register_at_fork(after_in_child=_new_token_prefix)


async def claim(
    store: Store,
    queue: str,
    n: int,
    wait: float,
    worker: str = "",
    due_before: float = 0.0,
    sent: Callable[[float], None] | None = None,
) -> builtins.list[Claimed]:
    """Claim up to ``n`` due attempts of ``queue``, waiting up to ``wait`` seconds in the store for one. ``sent``:
    called with ``time.monotonic()`` as the claim is written to the connection (never in this process).

    Cancel-safe: when this call is cancelled, or its answer is lost with the connection, what the store had
    claimed for it is handed back (queued again, the attempt not counted) by a short call made after it; a
    cancel ends once that call is answered (at most :data:`HAND_BACK_WAIT` seconds); a store that cannot be
    reached leaves those attempts to their lease. Raises ``ClosedError``,
    ``UnavailableError``, ``OutcomeUnknownError`` (the answer was lost; handed back as said), ``InvalidError``.
    """
    token = f"{_TOKEN_PREFIX}-{next(_tokens)}"
    req = Claim(
        queue=queue,
        n=n,
        wait_ms=round(wait * 1000),
        worker=worker,
        due_before_ms=math.floor(due_before * 1000),
        token=token,
    )
    try:
        got: builtins.list[Claimed] = await store._call(
            "jobs.claim",
            req,
            builtins.list[Claimed],
            write=True,
            retry=False,
            sent=None if sent is None else lambda _: sent(time.monotonic()),
        )
        return got
    except asyncio.CancelledError:
        if not store._closed:
            # the cancel ends once what the claim got is handed back (a worker's stop() returns with its jobs
            # queued: trial AR saw them running, attempt counted, for a moment over a socket), at most 10 s
            task = attempt_guard.spawn(_hand_back(store, queue, token))
            _handing_back.add(task)
            task.add_done_callback(_handing_back.discard)
            if store.transport.connected:  # (else it goes once the store is reached again: trial AW's stop
                await asyncio.wait([task], timeout=HAND_BACK_WAIT)  # waited 5 s for a server that was gone)
        raise
    except (OutcomeUnknownError, ClosedError):
        if not store._closed:  # (the connection is gone: handed back once the store is reached again)
            task = attempt_guard.spawn(_hand_back(store, queue, token))
            _handing_back.add(task)
            task.add_done_callback(_handing_back.discard)
        raise


def _lease_end(a: _Attempt, stopped_at: float | None) -> float:
    """When (``time.monotonic()``) the worker gives attempt ``a`` up unless renewed. Its lease counts from its last
    renewal, or from the last word of a server that said it was stopping (``stopped_at``), if later: a server that
    stops gracefully ends no lease while it stops (trial CS: a stop longer than a lease made a healthy worker's job
    "worker lost"), and the next one gives each running attempt a fresh lease as it starts. Not for ever: a next
    server this worker cannot reach ends the attempt and runs the job again (trial CT: the handler ran on beside the
    new attempt). A little early: see :func:`_early`."""
    renewed = a.renewed_at if stopped_at is None else max(a.renewed_at, stopped_at)
    return renewed + a.lease - _early(a.lease)


def _early(lease: float) -> float:
    """How long before its lease ends, as a worker counts it, the worker gives an attempt it could not renew up: a
    quarter of the lease, 2 s at most. The store counts the lease from a moment a little later (its own renewal; a
    next server, from its start, which a worker hears of only as the last one's connection closes): the handler is
    cancelled before the store ends the attempt and another worker may run the job (trial CV: 10 ms apart)."""
    return min(lease / 4, 2.0)


HAND_BACK_WAIT = 10.0
ANSWER_WAIT = 2.0
"""Seconds a stopping worker waits for the store to answer what it tells it (stop claiming, a job handed back,
an attempt's end) before going on without the answer."""
"""Seconds a cancelled claim waits for its hand-back before its cancel goes on regardless."""


async def _hand_back(store: Store, queue: str, token: str) -> None:
    with contextlib.suppress(TinystoreError, OSError):
        await store._call("jobs.release_claim", ReleaseClaim(queue=queue, token=token), int, write=False, retry=True)


_opened: weakref.WeakKeyDictionary[Store, dict[str, tuple[Options, QueueInfo]]] = weakref.WeakKeyDictionary()


class QueueOptions(TypedDict, total=False):
    """The options of a queue, as :meth:`Store.queue <tinystore.Store.queue>` and :class:`Queue` take them."""

    database: Database | str | None
    attempts: int | None
    backoff: tuple[Duration, Duration] | None
    lease: Duration | None
    timeout: Duration | None
    expected: Duration | None
    max_running: int | None
    max_running_per_tenant: int | None
    keep: Duration | None


class Queue(Generic[T]):
    """A durable job queue of the store. Get one with ``store.queue(name, Type, **options)``.

    Options (``None``: what the store keeps for the queue, or the default for a new queue):

    - ``database``: a :class:`~tinystore.Database` (or its name) whose file holds the jobs, so that
      ``tx.with_(queue).add(...)`` commits with the application's rows (JOB-06); default: the store's own
      jobs database.
    - ``attempts`` (5): attempts before ``dead``. ``backoff``: ``(first, cap)`` durations (10 s, 270 s): a failed
      attempt ``n`` is retried after ``min(cap, first × 3^(n-1)) × uniform(0.8, 1.0)``.
    - ``lease`` (30 s, 1 s .. 1 h): an attempt not renewed for this long is lost and retried ("worker lost").
    - ``timeout`` (1 min): a handler running longer is cancelled; a failed attempt. ``expected`` (30 s): a job
      running longer is reported once as stuck (JOB-11); at or past ``timeout``, never (its handler is cancelled
      first: the store logs a warning when it keeps such options).
    - ``max_running``, ``max_running_per_tenant``: how many jobs run at once, over every worker of the store.
    - ``keep`` (7 d): ended jobs are deleted this long after they ended, their keys with them.

    The options are the store's: the first open of a queue keeps them, and an open whose options differ from
    the kept ones raises ``InvalidError`` naming the option (at the queue's first awaited call).

    Besides what each call lists, every awaited call may raise ``ClosedError`` (the store was closed) and
    ``UnavailableError`` (the store stayed unreachable past the reconnect timeout); ``InvalidError`` for a bad
    name or option comes at once, from ``store.queue``. Calls that read are sent again after a reconnect;
    calls that write raise ``OutcomeUnknownError`` when their answer was lost.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        type: Any = None,
        *,
        database: Database | str | None = None,
        attempts: int | None = None,
        backoff: tuple[Duration, Duration] | None = None,
        lease: Duration | None = None,
        timeout: Duration | None = None,
        expected: Duration | None = None,
        max_running: int | None = None,
        max_running_per_tenant: int | None = None,
        keep: Duration | None = None,
    ) -> None:
        check_name("queue", name)
        self.store = store
        self.name = name
        self.type = type
        db_name: Any = database
        if db_name is not None and not isinstance(db_name, str):
            if getattr(db_name, "store", store) is not store:
                raise InvalidError(
                    f"queue {name}: option database: database {getattr(db_name, 'name', '?')} belongs to another store"
                )
            db_name = getattr(db_name, "name", db_name)
        if db_name is not None:
            try:
                check_name("database", db_name)
            except InvalidError as exc:
                raise InvalidError(f"queue {name}: option database: {exc.message}") from None

        def ms(option: str, value: Duration | None) -> int | None:
            if value is None:
                return None
            s = seconds(value, f"queue {name}: option {option}")
            # in whole milliseconds, but never 0 for a value above 0 (trial DD: timeout=0.0004 was refused as "0s is
            # not above 0")
            return max(round(s * 1000), 1) if s > 0 else 0

        first = cap = None
        if backoff is not None:
            if not isinstance(backoff, tuple | builtins.list) or len(backoff) != 2:
                raise InvalidError(
                    f"queue {name}: option backoff: {shown(backoff)} is not (first, cap), two durations such as "
                    '("10s", "270s")'
                )
            first, cap = ms("backoff", backoff[0]), ms("backoff", backoff[1])
        for label, v in (
            ("attempts", attempts),
            ("max_running", max_running),
            ("max_running_per_tenant", max_running_per_tenant),
        ):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidError(f"queue {name}: option {label}: {shown(v)} is not an int")
        for label, v in (("max_running", max_running), ("max_running_per_tenant", max_running_per_tenant)):
            if v is not None and not 1 <= v <= 1_000_000:
                # (the wire's own bound says "0 (no limit)", the command line's way: not this API's, trial DE)
                raise InvalidError(
                    f"queue {name}: option {label}: {shown(v)} is not between 1 and 1,000,000 (None: no limit)"
                )
        self._given = Options(
            database=db_name,
            attempts=plain_int(attempts),
            backoff_first_ms=first,
            backoff_cap_ms=cap,
            lease_ms=ms("lease", lease),
            timeout_ms=ms("timeout", timeout),
            expected_ms=ms("expected", expected),
            max_running=plain_int(max_running),
            max_running_per_tenant=plain_int(max_running_per_tenant),
            keep_ms=ms("keep", keep),
        )
        check_options(name, self._given)
        self._info: QueueInfo | None = None
        self._opening: asyncio.Future[QueueInfo] | None = None
        try:
            self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type if type is not None else Any)
        except TypeError as exc:
            raise InvalidError(f"queue {name}: {not_a_type(type, exc)}") from None
        self._plain = type is None or type is Any

    # -- opening -------------------------------------------------------------------------------

    async def _ensure(self) -> QueueInfo:
        if self._info is not None:
            return self._info
        cache = _opened.setdefault(self.store, {})
        hit = cache.get(self.name)
        if hit is not None and hit[0] == self._given:
            self._info = hit[1]
            return hit[1]
        if self._opening is None or (self._opening.done() and self._opening.exception() is not None):
            # (a task of the SDK's own, which each caller waits for: begun in the context of a handler past its
            # lease, its refusal was every later caller's: trial IN)
            self._opening = attempt_guard.spawn(
                self.store._call("jobs.open", OpenQueue(queue=self.name, options=self._given), QueueInfo, write=False)
            )
            # retrieved here too: a caller cancelled while it waits must not leave its error unretrieved
            self._opening.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            info: QueueInfo = await asyncio.shield(self._opening)
        except InvalidError as exc:
            raise _hint_here(self.store, exc) from None
        self._info = info
        cache[self.name] = (self._given, info)
        return info

    async def options(self) -> dict[str, Any]:
        """The options the store keeps for this queue, asked of the store now (``tinystore jobs DIR configure`` may
        have changed them since this process opened the queue): durations in seconds, ``max_running*`` ``None``
        for none. Raises ``InvalidError`` when this queue's options differ from them, ``UnavailableError`` when the
        store cannot be reached within ``reconnect_timeout`` (or the queue's database is missing), ``ClosedError``
        once the store is closed. A cancel leaves nothing behind (the queue may have been opened in the store).
        """
        try:
            info: QueueInfo = await self.store._call(
                "jobs.open", OpenQueue(queue=self.name, options=self._given), QueueInfo, write=False
            )
        except InvalidError as exc:
            raise _hint_here(self.store, exc) from None
        self._info = info
        _opened.setdefault(self.store, {})[self.name] = (self._given, info)
        o = info.options

        def s(ms: int | None) -> float | None:
            return None if ms is None else ms / 1000

        return {
            "database": o.database,
            "attempts": o.attempts,
            "backoff": (s(o.backoff_first_ms), s(o.backoff_cap_ms)),
            "lease": s(o.lease_ms),
            "timeout": s(o.timeout_ms),
            "expected": s(o.expected_ms),
            "max_running": o.max_running or None,
            "max_running_per_tenant": o.max_running_per_tenant or None,
            "keep": s(o.keep_ms),
        }

    def _not_in_own_tx(self, what: str) -> None:
        """Refuse a call that writes to this queue's database from inside a transaction of that database (it
        would wait for the transaction, which waits for it)."""
        info = self._info
        if info is not None and info.options.database and in_open_tx((id(self.store), info.options.database)):
            raise InvalidError(
                f"queue {self.name}: {what} inside a transaction of database {info.options.database}, where the "
                "queue's jobs live, would wait for itself; call it outside the transaction"
                + (
                    ", or add through the transaction, to commit the job with its rows: tx.with_(queue).add(...)"
                    if what.startswith("add")
                    else ""
                )
            )

    # -- values --------------------------------------------------------------------------------

    def _encode(self, value: Any, what: str) -> str:
        loose: list[Any] = []
        text = _json(value, f"queue {self.name}: {what}: the value", keys=self._plain, loose=loose)
        if not self._plain:
            # an instance of the type too: neither a dataclass nor a Struct checks its fields' types when made
            try:
                back = self._decoder.decode(text)
            except Exception as exc:  # a ValidationError, or what the type's own __post_init__ raised
                kind = type_name(self.type)
                raise InvalidError(
                    f"queue {self.name}: {what}: the value does not encode as {kind}: {_decode_error(exc)}"
                ) from None
            if loose:
                # keys that are not str come back as they went only where the type says so (dict[int, ...]); a bare
                # dict or Any reads {1: 2} back as {"1": 2}: refused rather than changed (trial IP)
                changed = key_changed(msgspec.to_builtins(value), msgspec.to_builtins(back))
                if changed is not None:
                    raise InvalidError(
                        f"queue {self.name}: {what}: the value does not encode as JSON: {changed} (JSON object "
                        f"keys are text; the queue's type, {type_name(self.type)}, reads this one back as text: a "
                        "type reads keys back as ints only where it says so, as dict[int, ...] does)"
                    )
        limit = self.store.limits.job_value_bytes
        size = len(text.encode()) if not text.isascii() else len(text)
        if size > limit:
            raise LimitError(
                f"queue {self.name}: {what}: the value is {size} bytes of JSON, over the {limit} bytes allowed",
                limit=limit,
                wanted=size,
            )
        return text

    def _decode(self, text: str) -> Any:
        try:
            return self._decoder.decode(text)
        except Exception as exc:  # a DecodeError, or what the type's own __post_init__ raised
            raise InvalidError(
                f"queue {self.name}: the job's value does not decode as {type_name(self.type)}: {_decode_error(exc)}"
            ) from None

    def _new(
        self,
        value: Any,
        what: str,
        key: str | None,
        tenant: str | None,
        user: str | None,
        type: str | None,
        priority: int,
        delay: Duration | None,
        at: datetime | float | None,
        shared: str | None = None,
        key_what: str | None = None,
    ) -> NewJob:
        """A job to add; errors name ``what`` (``add``, ``add_many: values[2]``): for the arguments all the jobs
        of a call share (all but the value and the key), ``shared`` when given (``add_many``; trial CH: a tenant
        too long was "values[0]: tenant"); for the key, ``key_what`` when given (``add_many: keys[2]``; trial EF)."""
        where = f"queue {self.name}: {key_what or what}"
        where_value = what
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= KEY_MAX):
            raise InvalidError(f"{where}: key {shown(key)}: an idempotency key is a str of 1 to {KEY_MAX} characters")
        check_text(where, "key", key, KEY_MAX)
        what = shared or what
        where = f"queue {self.name}: {what}"
        if not is_int(priority):
            raise InvalidError(f"{where}: priority {shown(priority)} is not an int")
        if not -PRIORITY_MAX <= priority <= PRIORITY_MAX:
            raise InvalidError(
                f"{where}: priority {shown(priority)} does not fit in 64 bits (-{PRIORITY_MAX} .. {PRIORITY_MAX})"
            )
        for label, v in (("tenant", tenant), ("user", user), ("type", type)):
            check_text(where, label, v)
        delay_ms = at_ms = None
        if delay is not None:
            if isinstance(delay, int | float) and not isinstance(delay, bool) and delay < 0:
                raise InvalidError(f"queue {self.name}: {what}: delay {shown(delay)} is negative")
            if isinstance(delay, timedelta) and delay.total_seconds() < 0:
                raise InvalidError(f"queue {self.name}: {what}: delay {delay} is negative")
            delay_ms = round(seconds(delay, f"queue {self.name}: {what}: delay") * 1000)
        if at is not None:
            if delay is not None:
                raise InvalidError(f"queue {self.name}: {what}: give delay or at, not both")
            if isinstance(at, datetime):
                at_ms = _epoch_ms(at)
            elif (
                isinstance(at, int | float) and not isinstance(at, bool) and (isinstance(at, int) or math.isfinite(at))
            ):
                at_ms = math.floor(at * 1000)  # (an int of any size: math.isfinite(10**400) raises, trial GK)
            else:
                raise InvalidError(f"queue {self.name}: {what}: at {at!r} is not a datetime or epoch seconds")
            if not 0 <= at_ms <= RUN_AT_MAX_MS:
                told = at.isoformat() if isinstance(at, datetime) else f"{shown(at)} (epoch seconds)"
                raise InvalidError(f"queue {self.name}: {what}: at {told} is not between 1970 and the end of 9999")
        return NewJob(
            value=self._encode(value, where_value),
            key=key,
            tenant=tenant or "",
            user=user or None,  # ("" is none, as for a tenant: trial JF)
            type=type or None,
            priority=int(priority),
            delay_ms=delay_ms,
            at_ms=at_ms,
        )

    def _job(self, row: JobRow) -> Job[T]:
        """Raises ``CorruptError`` for a row whose value is not JSON (the store writes JSON only)."""
        try:
            value = self._decoder.decode(row.value)
        except Exception:  # no longer the queue's type: the job shows its value as plain JSON
            try:
                value = msgspec.json.decode(row.value)
            except msgspec.DecodeError as exc:
                raise CorruptError(
                    f"queue {self.name}: job {row.id}: its kept value is not JSON ({exc}); the store writes JSON "
                    "only: the row was written by other means"
                ) from None
        return _job_of(row, value)

    # -- calls ---------------------------------------------------------------------------------

    async def add(
        self,
        value: T,
        *,
        key: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        type: str | None = None,
        priority: int = 0,
        delay: Duration | None = None,
        at: datetime | float | None = None,
    ) -> str:
        """Add a job; returns its id (str). With ``key``, a job of the queue that holds the key (its row still
        kept: an ended job too, until ``keep`` deletes it) makes this add nothing and return that job's id
        (JOB-05). ``tenant``/``user``: who owns it (fair
        scheduling uses the tenant); ``type``: a label such as ``"ingest_file"``; ``priority``: higher runs
        first; ``delay`` (a duration) or ``at`` (a datetime, or epoch seconds; a naive datetime is read as UTC): when it
        is due (default: now).

        Raises ``InvalidError`` (a value that does not encode as the queue's type, a key of 0 or over 512
        characters, a negative delay, both ``delay`` and ``at``, an ``at`` before 1970 or after 9999, a
        ``priority`` that is not an int or past 64 bits, a ``tenant``, ``user`` or ``type`` that is not a str of at
        most 256 characters, options differing from the store's; a call inside a transaction of the
        database the queue's jobs live in: use ``tx.with_(queue).add`` there), ``LimitError`` (a value over 1 MiB
        of JSON), ``OutcomeUnknownError`` (the answer was lost: it may have been added; adding again with the
        same key is safe). A cancel after the request was sent may leave the job added.
        """
        job = self._new(value, "add", key, tenant, user, type, priority, delay, at)
        await self._ensure()
        self._not_in_own_tx("add")
        ids: builtins.list[str] = await self.store._call(
            "jobs.add", Add(queue=self.name, jobs=[job]), builtins.list[str], write=True
        )
        return ids[0]

    async def add_many(
        self,
        values: Sequence[T],
        *,
        keys: Iterable[str | None] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        type: str | None = None,
        priority: int = 0,
        delay: Duration | None = None,
        at: datetime | float | None = None,
    ) -> builtins.list[str]:
        """Add many jobs in one write, all or none; returns their ids in order (``keys``: one per value, or
        ``None``; 100,000 jobs at most, and 16 MiB encoded: ``frame_body_bytes``). Otherwise as :meth:`add`: a
        value that fails names its place (``add_many: values[2]``), and nothing is added then. Raises as
        :meth:`add` does (``InvalidError``, ``LimitError``, ``OutcomeUnknownError``,
        ``UnavailableError``, ``ClosedError``); a cancel of this call after it was sent leaves all of the jobs added
        or none."""
        jobs = await self._many_in_turns(values, keys, tenant, user, type, priority, delay, at)
        await self._ensure()
        self._not_in_own_tx("add_many")
        try:
            ids: builtins.list[str] = await self.store._call(
                "jobs.add", Add(queue=self.name, jobs=jobs), builtins.list[str], write=True
            )
        except LimitError as exc:
            raise _as_add_many(self.name, len(jobs), exc) from None
        return ids

    async def _many_in_turns(
        self,
        values: Sequence[Any],
        keys: Iterable[str | None] | None,
        tenant: str | None,
        user: str | None,
        type: str | None,
        priority: int,
        delay: Duration | None,
        at: datetime | float | None,
        *,
        checked: tuple[builtins.list[Any], builtins.list[str | None] | None] | None = None,
    ) -> builtins.list[NewJob]:
        """The jobs of an add_many, :data:`ENCODE_TURN` values encoded in each loop turn: 100,000 values took the
        loop for a second or two, every other task of the process waiting (an embedded store's clients too).
        ``checked``: what :meth:`_many_args` gave already."""
        listed, keyed = checked if checked is not None else self._many_args(values, keys)
        jobs: builtins.list[NewJob] = []
        for start in range(0, len(listed), ENCODE_TURN):
            if start:
                await asyncio.sleep(0)
            stop = min(start + ENCODE_TURN, len(listed))
            jobs.extend(self._many_slice(listed, keyed, start, stop, tenant, user, type, priority, delay, at))
        return jobs

    def _many_args(
        self, values: Sequence[Any], keys: Iterable[str | None] | None
    ) -> tuple[builtins.list[Any], builtins.list[str | None] | None]:
        """``values`` and ``keys`` as lists, checked (their kinds, how many): ``InvalidError``, ``LimitError``."""
        if isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Iterable):
            raise InvalidError(
                f"queue {self.name}: add_many takes a list of values, not {builtins.type(values).__name__} "
                "(for one value, use add)"
            )
        listed = builtins.list(values)
        if len(listed) > ADD_MAX:  # (as the store refuses them, before each is encoded and sent: trial DK)
            raise LimitError(
                f"queue {self.name}: {len(listed):,} jobs in one add; at most {ADD_MAX:,}",
                limit=ADD_MAX,
                wanted=len(listed),
            )
        if keys is None:
            return listed, None
        if isinstance(keys, str | bytes | bytearray | Mapping) or not isinstance(keys, Iterable):
            raise InvalidError(
                f"queue {self.name}: add_many: keys takes a list of keys (str or None), one per value, not "
                f"{builtins.type(keys).__name__}"
            )
        keyed = builtins.list(keys)
        if len(keyed) != len(listed):
            raise InvalidError(f"queue {self.name}: add_many: {len(keyed)} keys for {len(listed)} values")
        return listed, keyed

    def _many_slice(
        self,
        values: builtins.list[Any],
        keys: builtins.list[str | None] | None,
        start: int,
        stop: int,
        tenant: str | None,
        user: str | None,
        type: str | None,
        priority: int,
        delay: Duration | None,
        at: datetime | float | None,
    ) -> builtins.list[NewJob]:
        return [
            self._new(
                values[i],
                f"add_many: values[{i}]",
                keys[i] if keys is not None else None,
                tenant,
                user,
                type,
                priority,
                delay,
                at,
                shared="add_many",
                key_what=f"add_many: keys[{i}]",
            )
            for i in range(start, stop)
        ]

    async def get(self, job_id: str) -> Job[T] | None:
        """The job ``job_id`` as the store keeps it, or ``None`` (unknown, or deleted after ``keep``). Raises
        ``InvalidError`` for an id that is not a str, ``UnavailableError`` when the store cannot be reached within
        ``reconnect_timeout`` (the read is sent again across reconnects until then), ``ClosedError`` once the store
        is closed. A read: a cancel leaves nothing behind."""
        check_job_id(self.name, "get", job_id)
        await self._ensure()
        row: JobRow | None = await self.store._call("jobs.get", Get(queue=self.name, id=job_id), JobRow | None)
        return None if row is None else self._job(row)

    async def list(
        self,
        state: JobState | Literal["stuck"] | None = None,
        tenant: str | None = None,
        type: str | None = None,
        limit: int = 50,
        after: str | None = None,
        user: str | None = None,
    ) -> JobPage[T]:
        """Jobs of this queue, newest first, at most ``limit`` (1..1000), after the cursor ``after`` (a page's
        ``next``), filtered by ``state`` (one of the states, or ``"stuck"``), ``tenant``, ``type`` and ``user``
        (``""``: the jobs without one). The list comes from the rows, so a page that is reopened finds every job.
        Raises ``InvalidError`` for a bad argument, before anything is sent: a state that is not one of those, a
        ``limit`` that is not an int from 1 to 1000, a ``tenant``, ``type`` or ``user`` that is not a str (or
        ``None``) of at most 256 characters, a cursor that is not a page's ``next`` (a job id);
        ``UnavailableError`` and ``ClosedError`` as :meth:`get`. A read: a cancel leaves nothing behind."""
        req = ListRequest(
            queue=self.name, state=state, tenant=tenant, type=type, limit=plain_int(limit), after=after, user=user
        )
        check_list(self.name, req)
        await self._ensure()
        page: Page = await self.store._call("jobs.list", req, Page)
        return JobPage([self._job(r) for r in page.jobs], page.next)

    async def cancel(self, job_id: str) -> bool:
        """Cancel a job (JOB-09): a waiting job never runs; a running job's handler is cancelled (its
        ``run.cancelled`` set) and the job ends ``cancelled``, not retried. Returns ``True`` when it changed the
        job to ``cancelled``; ``False`` when it had already ended or the id is unknown (nothing changes).
        Raises ``OutcomeUnknownError`` when the answer was lost (cancelling again is safe); a cancel of this call
        after it was sent may leave the job cancelled, and then wholly: its running handler is told all the same.
        ``InvalidError`` for an id that is not a str."""
        check_job_id(self.name, "cancel", job_id)
        await self._ensure()
        self._not_in_own_tx("cancel")
        ok: bool = await self.store._call("jobs.cancel", Get(queue=self.name, id=job_id), bool, write=True)
        return ok

    async def retry(self, job_id: str) -> bool:
        """Put a ``dead`` or ``cancelled`` job back to ``queued``, due now, attempts from 0 (its finished steps
        stay). Returns ``False`` for a job in another state or an unknown id. Raises ``OutcomeUnknownError`` when
        the answer was lost; a cancel of this call after it was sent may leave the job queued again, and then
        wholly: it runs as any job added. ``InvalidError`` for an id that is not a str."""
        check_job_id(self.name, "retry", job_id)
        await self._ensure()
        self._not_in_own_tx("retry")
        ok: bool = await self.store._call("jobs.retry", Get(queue=self.name, id=job_id), bool, write=True)
        return ok

    async def watch(self, job_id: str) -> AsyncIterator[Job[T]]:
        """Yield the job now, then again at each change (state, attempts, progress, stuck) until it ends; nothing
        for an unknown id. Waits in the store (no polling), across reconnects and a restart of the store;
        ``break`` stops it. Raises ``ClosedError`` when the store is closed, ``UnavailableError`` once it has been
        unreachable for the store's ``reconnect_timeout`` (30 s unless given to ``open``), as other calls do;
        ``InvalidError`` for an id that is not a str."""
        check_job_id(self.name, "watch", job_id)
        await self._ensure()
        row: JobRow | None = await self.store._call("jobs.get", Get(queue=self.name, id=job_id), JobRow | None)
        loop = asyncio.get_running_loop()
        patience = float(getattr(self.store.transport, "reconnect_timeout", 30.0))
        while row is not None:
            yield self._job(row)
            if row.state in ENDED:
                return
            seen = snapshot(row)
            down_since: float | None = None  # when the calls that fail since began
            while True:
                asked = loop.time()
                try:
                    nxt: JobRow | None = await self.store._call(
                        "jobs.wait", Wait(queue=self.name, id=job_id, seen=seen, wait_ms=30_000), JobRow | None
                    )
                except (UnavailableError, ClosedError):
                    if self.store._closed or self.store.transport.closed:
                        raise
                    down_since = asked if down_since is None else down_since
                    if loop.time() - down_since >= patience:
                        raise
                    await asyncio.sleep(0.2)  # the store is stopping or restarting: wait for it to come back
                    continue
                down_since = None
                if nxt is None or snapshot(nxt) != seen:
                    row = nxt
                    break

    def work(self, handler: Handler[T], concurrency: int = 1) -> Worker:
        """Run this queue's jobs with ``handler(value, run)`` (a function or a coroutine function),
        ``concurrency`` at a time, in the background until ``await worker.stop()`` or the store closes.

        What the handler returns ends the attempt: a value (JSON, at most 1 MiB; ``None`` is fine) → ``succeeded``
        with it as the result; ``run.retry(after)`` or a raise or a timeout → a failed attempt, retried with
        backoff until ``attempts``, then ``dead``; ``run.fail(reason)`` or ``PermanentError`` → ``dead`` at once;
        ``run.snooze(after)`` → again after ``after``, not counted. A value that does not decode as the queue's type
        is a failed attempt too (the handler is not called). Raises ``InvalidError`` for a bad concurrency and for a
        handler that cannot be called as ``handler(value, run)`` or is an async generator function (rather than
        failing every job).
        The worker opens the queue in the background: options that differ from the store's are logged as an
        error and end the worker (``await queue.options()`` first to have that ``InvalidError`` raised here).
        """
        if self.store._closed:
            raise ClosedError(f"queue {self.name}: work: the store is closed")
        check_concurrency(self.name, "work", concurrency)
        _check_handler(self.name, "work", handler)
        return Worker(self, handler, concurrency)

    async def run_due(self, handler: Handler[T], concurrency: int = 1) -> int:
        """Run the jobs due now (due at the store's time when this is called) with ``handler``, ``concurrency``
        at a time, and return how many attempts ran. A job made due again by its own run waits for the next call.
        A cancel stops the handlers running (their jobs are handed back, not counted); so does the store's close,
        after letting them run 10 s to their end, as a worker's (it returns then, with the attempts that ended). A
        handler that raises ``KeyboardInterrupt`` or ``SystemExit`` fails its attempt, and the exception is raised
        here, once the attempts running with it have ended. Raises ``InvalidError`` (a ``concurrency`` that is not an
        int of 1 to 1000, a ``handler`` that is not callable), ``ClosedError``, ``UnavailableError``."""
        check_concurrency(self.name, "run_due", concurrency)
        concurrency = int(concurrency)  # (an int subclass as a plain int: trial GR)
        _check_handler(self.name, "run_due", handler)
        if self.store._closed:
            raise ClosedError(f"queue {self.name}: run_due: the store is closed")
        runner = _Runner(self, handler, f"{os.getpid()}-due-{uuid.uuid4().hex[:8]}")
        runner.hold_fatal = True
        runner.owner = asyncio.current_task()  # (an attempt's task cancelled while this one is not: a failed attempt)
        ran = 0
        began = False  # some attempt began
        settled = asyncio.Event()  # set while no claim is under way
        settled.set()

        async def at_close() -> None:
            # the store closes: as a worker's, the handlers running get 10 s to end, then are cancelled (their
            # jobs handed back); trial DA: the close returned at once, and a handler ran on unreported ("worker
            # lost"). A claim under way ends first: what it took is handed back (trial DB: a run_due begun just
            # before the close ran its handler after it, the result lost)
            await settled.wait()
            grace = _close_grace(self.store)
            if runner.waited_at_close() and grace > 0:
                log.warning(
                    "queue %s: the store is closing: run_due lets %d running handler(s) finish for up to %gs, then "
                    "cancels them (their jobs go back to the queue)",
                    self.name,
                    runner.waited_at_close(),
                    grace,
                )
            await runner.stop(grace)

        # (at once, before the first wait: a close that begins meanwhile must wait for this run_due too)
        self.store._stop_hooks.append(at_close)
        self.store._close_shorteners.append(runner.shorten)
        try:
            await self._ensure()
            now = await self.store.clock.now()
            while True:
                if self.store._closed:
                    if not began:  # (closed before any handler ran: as any call on a closed store)
                        raise ClosedError(f"queue {self.name}: run_due: the store is closed")
                    return ran  # the attempts that ended; those the close stopped were handed back (see at_close)
                settled.clear()
                try:
                    written: list[float] = []
                    got = await claim(self.store, self.name, concurrency, 0.0, runner.worker, now, written.append)
                    if got and self.store._closed:
                        # claimed as the close began: not run, handed back (not counted)
                        await runner.hand_back(got, ANSWER_WAIT)
                        got = []
                        continue
                finally:
                    settled.set()
                if not got:
                    return ran
                began = True
                sent = written[-1] if written else None
                attempts = [runner.start(c, sent) for c in got]
                await asyncio.wait([a.task for a in attempts if a.task is not None])
                # the attempts that ran to an end (a failure too); not those stopped and handed back
                ran += sum(1 for a in attempts if not a.handed_back)
                if runner.fatal is not None:  # a handler raised KeyboardInterrupt or SystemExit: it goes on here
                    raise runner.fatal
                if any(a.task is not None and a.task.cancelled() for a in attempts):
                    return ran  # cancelled from outside the worker (the event loop is ending): their jobs went back
        finally:
            with contextlib.suppress(ValueError):
                self.store._stop_hooks.remove(at_close)
            with contextlib.suppress(ValueError):
                self.store._close_shorteners.remove(runner.shorten)
            await runner.stop(0)

    def _bind_tx(self, tx: SqlTx) -> TxQueue[T]:
        if tx.db.store is not self.store:
            # its transaction id means nothing to this queue's store (or names another client's transaction)
            raise InvalidError(f"queue {self.name}: the transaction belongs to another store")
        return TxQueue(self, tx)

    def __repr__(self) -> str:
        return f"<tinystore.Queue {self.name}>"


def _leaves(group: BaseExceptionGroup[Any]) -> list[Any]:
    """The exceptions of ``group`` that are not groups themselves, in order."""
    out: list[Any] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


_HINT = re.compile(r"; to change what the store keeps: tinystore jobs (.+?) configure ")


def _hint_here(store: Store, exc: InvalidError) -> InvalidError:
    """``exc``, whose hint names the command that changes a queue's kept options, with the store as this client
    reaches it: the server's directory means nothing to a client over TCP (trial DA), which gives the command the
    address (its token in ``$TINYSTORE_TOKEN``)."""
    if store.mode != "remote" or _HINT.search(exc.message) is None:
        return exc
    address = shlex.quote(store.transport.description)
    command = f"; to change what the store keeps: TINYSTORE_TOKEN=<admin token> tinystore jobs {address} configure "
    message = _HINT.sub(lambda m: command, exc.message)
    return InvalidError(message, **exc.extra)


class TxQueue(Generic[T]):
    """A queue bound to an open transaction (``tx.with_(queue)``): its adds commit with the transaction and the
    jobs run only once it commits, never if it rolls back (JOB-06). The queue must live in the transaction's
    database (``database=`` of the queue), else ``InvalidError``."""

    def __init__(self, queue: Queue[T], tx: SqlTx) -> None:
        self.queue = queue
        self.tx = tx

    async def _check(self) -> None:
        if self.tx.read_only:
            raise InvalidError(
                f"queue {self.queue.name}: a read-only transaction of database {self.tx.name} cannot add jobs (use "
                "db.tx without read_only=True)"
            )
        info = await self.queue._ensure()
        if info.options.database != self.tx.name:
            raise InvalidError(
                f"queue {self.queue.name}: its jobs live in database {info.options.database}; a transaction of "
                f"database {self.tx.name} cannot add to it (open the queue with database=that database)"
            )
        self.tx._check()

    def add(
        self,
        value: T,
        *,
        key: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        type: str | None = None,
        priority: int = 0,
        delay: Duration | None = None,
        at: datetime | float | None = None,
    ) -> Coroutine[Any, Any, str]:
        """As :meth:`Queue.add`, inside the transaction (a coroutine: await it; one never awaited fails the
        transaction, see ``Database.tx``). The id is returned at once; the job exists for others once the
        transaction commits."""
        job = self.queue._new(value, "add", key, tenant, user, type, priority, delay, at)
        return self.tx._watch(self._add_one(job), f"tx.with_(queue {self.queue.name}).add")

    def add_many(
        self,
        values: Sequence[T],
        *,
        keys: Sequence[str | None] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        type: str | None = None,
        priority: int = 0,
        delay: Duration | None = None,
        at: datetime | float | None = None,
    ) -> Coroutine[Any, Any, builtins.list[str]]:
        """As :meth:`Queue.add_many`, inside the transaction (a coroutine: await it, as :meth:`add`)."""
        checked = self.queue._many_args(values, keys)
        if len(checked[0]) <= ENCODE_TURN:
            jobs = self.queue._many_slice(*checked, 0, len(checked[0]), tenant, user, type, priority, delay, at)
            return self.tx._watch(self._add(jobs, many=True), f"tx.with_(queue {self.queue.name}).add_many")
        # (past ENCODE_TURN values, encoded in turns as the coroutine runs: a value that fails raises at the await)
        made = functools.partial(
            self.queue._many_in_turns, values, keys, tenant, user, type, priority, delay, at, checked=checked
        )
        return self.tx._watch(self._add_made(made), f"tx.with_(queue {self.queue.name}).add_many")

    async def _add_made(self, made: Callable[[], Coroutine[Any, Any, builtins.list[NewJob]]]) -> builtins.list[str]:
        return await self._add(await made(), many=True)

    async def _add_one(self, job: NewJob) -> str:
        return (await self._add([job]))[0]

    async def _add(self, jobs: builtins.list[NewJob], many: bool = False) -> builtins.list[str]:
        await self._check()
        try:
            ids: builtins.list[str] = await self.queue.store._call(
                "jobs.add", Add(queue=self.queue.name, jobs=jobs, tx=self.tx.id), builtins.list[str], retry=False
            )
        except LimitError as exc:
            if not many:
                raise
            raise _as_add_many(self.queue.name, len(jobs), exc) from None
        return ids


def _as_add_many(queue: str, n: int, exc: LimitError) -> LimitError:
    """``exc`` named as the caller called it (``add_many``), not by the wire's method (trial EF, EH: "queue q:
    jobs.add: the request is ... bytes encoded")."""
    wire = f"queue {queue}: jobs.add: the request is "
    if not exc.message.startswith(wire):
        return exc
    return LimitError(
        f"queue {queue}: add_many: {n:,} jobs are {exc.message[len(wire) :]}; add them in smaller batches",
        limit=exc.limit,
        wanted=exc.wanted,
    )


def _job_of(row: JobRow, value: Any) -> Job[Any]:
    return Job(
        id=row.id,
        queue=row.queue,
        state=cast(JobState, row.state),
        value=value,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        fence=row.fence,
        key=row.key,
        tenant=row.tenant or None,  # (kept as "" in the row; None when unset, as user and type: trial BZ)
        user=row.user or None,  # ("" in a row written before "" was kept as none: trial JH)
        type=row.type or None,
        priority=row.priority,
        progress=row.progress,
        result=None if row.result is None else msgspec.json.decode(row.result),
        error=row.error,
        errors=[_error_of(e) for e in row.errors],
        steps=dict(row.steps),
        run_at=_when(row.run_at_ms),
        created_at=_when(row.created_at_ms),
        started_at=_when(row.started_at_ms),
        finished_at=_when(row.finished_at_ms),
        stuck=row.stuck,
    )


def _error_of(e: ErrorEntry) -> JobError:
    at = _when(e.at_ms)
    assert at is not None
    return JobError(e.attempt, e.error, at, e.traceback)


# -- store-wide helpers (the command line) ---------------------------------------------------------


async def queues(store: Store) -> builtins.list[QueueInfo]:
    """Every queue the store knows, with its options and its jobs counted by state."""
    out: builtins.list[QueueInfo] = await store._call("jobs.queues", Empty(), builtins.list[QueueInfo])
    return out


async def configure(store: Store, queue: str, options: Options) -> QueueInfo:
    """Change the options the store keeps for ``queue`` (see the CLI's ``tinystore jobs DIR configure``);
    ``None`` fields stay as they are. Needs the admin capability. Raises ``InvalidError`` (no such queue, an
    option out of bounds, a change of database), ``PermissionDeniedError``."""
    options = msgspec.structs.replace(
        options, **{f: plain_int(getattr(options, f)) for f in Options.__struct_fields__ if f != "database"}
    )  # (an int subclass as a plain int: trial GR)
    info: QueueInfo = await store._call(
        "jobs.configure", OpenQueue(queue=queue, options=options), QueueInfo, write=True, retry=False
    )
    return info


async def find(store: Store, job_id: str) -> Job[Any] | None:
    """Job ``job_id`` in whichever queue holds it (its value as plain JSON), or ``None``."""
    row: JobRow | None = await store._call("jobs.find", Find(id=job_id), JobRow | None)
    return None if row is None else _job_of(row, msgspec.json.decode(row.value))


async def list_jobs(
    store: Store,
    queue: str = "",
    state: str | None = None,
    tenant: str | None = None,
    type: str | None = None,
    limit: int = 50,
    after: str | None = None,
    user: str | None = None,
) -> tuple[JobPage[Any], list[str]]:
    """Jobs of ``queue`` (every queue when empty), newest first, values as plain JSON; and, for every queue, the
    errors of the queues whose jobs could not be read (their database's file missing), each naming its queue."""
    page: Page = await store._call(
        "jobs.list",
        ListRequest(queue=queue, state=state, tenant=tenant, type=type, limit=plain_int(limit), after=after, user=user),
        Page,
    )
    return JobPage([_job_of(r, msgspec.json.decode(r.value)) for r in page.jobs], page.next), page.unreadable


async def cancel_job(store: Store, queue: str, job_id: str) -> bool:
    ok: bool = await store._call("jobs.cancel", Get(queue=queue, id=job_id), bool, write=True)
    return ok


async def retry_job(store: Store, queue: str, job_id: str) -> bool:
    ok: bool = await store._call("jobs.retry", Get(queue=queue, id=job_id), bool, write=True)
    return ok
