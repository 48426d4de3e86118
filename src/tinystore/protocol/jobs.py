"""Bodies of the jobs engine's methods and pushes.

Times on the wire are integer milliseconds since the Unix epoch; durations are integer milliseconds. Values,
results, progress and step results travel as JSON text (the queue's type is the SDK's business; the server
stores and returns the text as is). The fence is a plain int (it fits in 63 bits: it counts the claims of one
job).

Methods (request body → reply body):

- ``jobs.open``: :class:`OpenQueue` → :class:`QueueInfo` (the options the store keeps for the queue).
- ``jobs.add``: :class:`Add` → ``list[str]`` (one id per item, in order; an existing job's id for a known key).
- ``jobs.claim``: :class:`Claim` → ``list[Claimed]`` (waits up to ``Claim.wait_ms`` for due jobs).
- ``jobs.unwait``: :class:`Unwait` → ``int`` (how many waiting claims of that worker were ended empty).
- ``jobs.renew``: :class:`Renew` → ``list[str]`` (the ids whose attempt is no longer this fence's: lost).
- ``jobs.report``: :class:`Report` → ``bool`` (whether the report changed the job; a stale fence: ``False``).
- ``jobs.release``: :class:`Release` → ``int`` (claimed jobs handed back unstarted: not counted as attempts).
- ``jobs.release_claim``: :class:`ReleaseClaim` → ``int`` (the same, for the attempts of a claim whose answer
  the caller never got: its call was cancelled, or the connection dropped).
- ``jobs.progress``: :class:`Progress` → ``bool``.
- ``jobs.step``: :class:`Step` → ``bool``.
- ``jobs.get``: :class:`Get` → :class:`JobRow` or ``None``.
- ``jobs.list``: :class:`List` → :class:`Page`.
- ``jobs.cancel``: :class:`Get` → ``bool``; ``jobs.retry``: :class:`Get` → ``bool``.
- ``jobs.wait``: :class:`Wait` → :class:`JobRow` or ``None`` (once the job differs from what the caller saw).
- ``jobs.queues``: :class:`Empty` → ``list[QueueInfo]``; ``jobs.find``: :class:`Find` → :class:`JobRow` or ``None``.
- push ``jobs.cancel``: :class:`CancelRun`, to the client running an attempt that was cancelled or lost.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from ..errors import InvalidError, PermissionDeniedError
from .values import shown, valid_text

CANCEL_PUSH = "jobs.cancel"
EVENTS_CHANNEL = "tinystore-jobs"
"""The channel job events are published on, under ``(queue, job_id)``."""
RESERVED_CHANNELS = frozenset({EVENTS_CHANNEL})
"""Channels only the store itself publishes on: a client's publish there is refused (see
:func:`check_client_publish`), so nobody can fake a job event."""

STATES = ("queued", "running", "succeeded", "failed", "dead", "cancelled")
ENDED = ("succeeded", "dead", "cancelled")
LIST_STATES = (*STATES, "stuck")
"""What ``list(state=...)`` takes: a state, or ``"stuck"`` (running past ``expected``)."""


DELAY_MAX_MS = 100 * 365 * 86400 * 1000
"""The longest delay (and retry or snooze ``after``): 100 years, as every duration of the SDK."""
RUN_AT_MAX_MS = 253402300799999
"""The latest time a job may be due: the end of year 9999 (UTC), the last a ``datetime`` can tell."""
KEY_MAX = 512
"""The longest idempotency key, in characters."""
TEXT_MAX = 256
"""The longest tenant, user, type or step name, in characters."""
PRIORITY_MAX = (1 << 63) - 1
"""The highest priority (and ``-PRIORITY_MAX`` the lowest): it fits in 64 bits."""
LIST_MAX = 1000
"""The most jobs a page of ``jobs.list`` holds (its ``limit``)."""


class Options(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A queue's options. In :class:`OpenQueue` only the ones the caller gave are set (``None``: not given);
    in :class:`QueueInfo` every one is set. Durations in ms; ``max_running*``: 0 means no limit."""

    database: str | None = None
    attempts: int | None = None
    backoff_first_ms: int | None = None
    backoff_cap_ms: int | None = None
    lease_ms: int | None = None
    timeout_ms: int | None = None
    expected_ms: int | None = None
    max_running: int | None = None
    max_running_per_tenant: int | None = None
    keep_ms: int | None = None


OPTION_NAMES = {
    "database": "database",
    "attempts": "attempts",
    "backoff_first_ms": "backoff (first)",
    "backoff_cap_ms": "backoff (cap)",
    "lease_ms": "lease",
    "timeout_ms": "timeout",
    "expected_ms": "expected",
    "max_running": "max_running",
    "max_running_per_tenant": "max_running_per_tenant",
    "keep_ms": "keep",
}
"""How an error names each option (the name of the ``store.queue`` argument)."""
LEASE_MIN_MS = 1_000
LEASE_MAX_MS = 3_600_000
DURATION_MAX_MS = 366 * 86400 * 1000
KEEP_MAX_MS = 3660 * 86400 * 1000


def _secs(ms: int) -> str:
    """Milliseconds as seconds for a message, never in exponent notation (``31708800s``, ``0.5s``)."""
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"


def check_options(queue: str, o: Options) -> None:
    """Refuse options out of their bounds: ``InvalidError`` naming the queue and the option
    (``queue q: option lease: ...``). ``None`` fields are not given and pass."""

    def bad(what: str, why: str) -> InvalidError:
        return InvalidError(f"queue {queue}: option {what}: {why}")

    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if o.database is not None and not isinstance(o.database, str):
        raise bad("database", f"{o.database!r} is not a database name")
    for name in Options.__struct_fields__:
        v = getattr(o, name)
        if name != "database" and v is not None and not is_int(v):
            raise bad(OPTION_NAMES[name], f"{shown(v)} is not an int")
    if o.attempts is not None and not 1 <= o.attempts <= 1000:
        raise bad("attempts", f"{shown(o.attempts)} is not between 1 and 1000")
    for name in ("backoff_first_ms", "backoff_cap_ms", "timeout_ms", "expected_ms"):
        v = getattr(o, name)
        if v is not None and not 0 < v <= DURATION_MAX_MS:
            raise bad(OPTION_NAMES[name], f"{_secs(v)} is not above 0 and at most a year")
    if o.backoff_first_ms is not None and o.backoff_cap_ms is not None and o.backoff_first_ms > o.backoff_cap_ms:
        raise bad("backoff", "the first delay is above the cap")
    if o.lease_ms is not None and not LEASE_MIN_MS <= o.lease_ms <= LEASE_MAX_MS:
        low, high = LEASE_MIN_MS / 1000, LEASE_MAX_MS / 1000
        raise bad("lease", f"{_secs(o.lease_ms)} is not between {low:g}s and {high:g}s")
    if o.keep_ms is not None and not 0 <= o.keep_ms <= KEEP_MAX_MS:
        raise bad("keep", f"{_secs(o.keep_ms)} is not between 0 and ten years")
    for name in ("max_running", "max_running_per_tenant"):
        v = getattr(o, name)
        if v is not None and not 0 <= v <= 1_000_000:
            raise bad(name, f"{shown(v)} is not between 0 (no limit) and 1,000,000")


class OpenQueue(msgspec.Struct, kw_only=True):
    queue: str
    options: Options = msgspec.field(default_factory=Options)


class QueueInfo(msgspec.Struct, kw_only=True):
    """A queue as the store keeps it: its options (all set) and counts by state (those it knows); ``error``: why
    its jobs cannot be read now (its database's file is missing), its counts then empty."""

    queue: str
    options: Options
    counts: dict[str, int] = {}
    stuck: int = 0
    error: str | None = None


class NewJob(msgspec.Struct, array_like=True):
    """One job to add. ``value``: JSON text. ``delay_ms`` / ``at_ms``: when it is due (neither: now)."""

    value: str
    key: str | None = None
    tenant: str = ""
    user: str | None = None
    type: str | None = None
    priority: int = 0
    delay_ms: int | None = None
    at_ms: int | None = None


ADD_MAX = 100_000
"""Jobs of one ``jobs.add``, all or none (trial DK: 1.8 million were decoded, 0.3 s of the server's loop, before
their count was refused)."""


class Add(msgspec.Struct, kw_only=True):
    """``jobs.add``: add ``jobs`` to ``queue``, all or none; inside transaction ``tx`` when not 0."""

    queue: str
    jobs: Annotated[list[NewJob], msgspec.Meta(max_length=ADD_MAX)]
    tx: int = 0


class Claim(msgspec.Struct, kw_only=True):
    """``jobs.claim``: up to ``n`` due jobs, waiting up to ``wait_ms`` for one. ``worker``: the caller's worker
    id (for ``jobs.unwait``). ``due_before_ms``: only jobs due at or before it (``run_due``); 0: any due."""

    queue: str
    n: int = 1
    wait_ms: int = 0
    worker: str = ""
    due_before_ms: int = 0
    token: str = ""


class Claimed(msgspec.Struct, kw_only=True):
    """A claimed attempt: run it, renew it every third of ``lease_ms``, report it with ``fence``."""

    id: str
    fence: int
    attempt: int
    value: str
    steps: dict[str, Any]
    lease_ms: int
    timeout_ms: int
    tenant: str = ""
    key: str | None = None
    type: str | None = None
    user: str | None = None
    priority: int = 0
    progress: Any = None
    # milliseconds (real time) from when the store read the claim to when it granted this attempt (its lease counts
    # from then): the worker counts the lease from no later than its claim's sending + this, so that an answer read
    # long after it was sent (a worker process paused, SIGSTOP) is not run past its lease; None from an older server
    waited_ms: int | None = None


class Unwait(msgspec.Struct, kw_only=True):
    queue: str
    worker: str


class Attempt(msgspec.Struct, array_like=True):
    id: str
    fence: int


RENEW_MAX = 10_000
"""Attempts of one ``jobs.renew`` (the SDK sends at most this many a call; trial DJ: 4 million in one frame kept the
server's loop 0.8 s)."""


class Renew(msgspec.Struct, kw_only=True):
    queue: str
    attempts: Annotated[list[Attempt], msgspec.Meta(max_length=RENEW_MAX)]


RELEASE_MAX = 10_000
"""Attempts of one ``jobs.release`` (the SDK sends at most this many a call; trial DK: 5 million in one frame kept
the server's loop 0.4 s)."""


class Release(msgspec.Struct, kw_only=True):
    queue: str
    attempts: Annotated[list[Attempt], msgspec.Meta(max_length=RELEASE_MAX)]


class ReleaseClaim(msgspec.Struct, kw_only=True):
    """``jobs.release_claim``: hand back what the claim named ``token`` got, if its answer never arrived."""

    queue: str
    token: str


class Report(msgspec.Struct, kw_only=True):
    """``jobs.report``: how attempt ``fence`` of job ``id`` ended.

    ``outcome``: ``"succeeded"`` (``result``: JSON text or ``None``), ``"error"`` (a failed attempt: retried
    after the backoff, or after ``after_ms`` when set), ``"fail"`` (dead at once), ``"snooze"`` (queued again
    after ``after_ms``; the attempt is not counted). ``progress``: the last progress not yet sent (JSON text).
    ``traceback``: where a handler's raise came from (Python's formatted traceback), kept with the error.
    """

    queue: str
    id: str
    fence: int
    outcome: str
    result: str | None = None
    error: str | None = None
    after_ms: int | None = None
    progress: str | None = None
    traceback: str | None = None


class Progress(msgspec.Struct, kw_only=True):
    queue: str
    id: str
    fence: int
    progress: str


class Step(msgspec.Struct, kw_only=True):
    queue: str
    id: str
    fence: int
    name: str
    result: str


class Get(msgspec.Struct, kw_only=True):
    queue: str
    id: str


class Find(msgspec.Struct, kw_only=True):
    id: str


class List(msgspec.Struct, kw_only=True):
    """``jobs.list``: jobs of ``queue`` (every queue when empty), newest first, ``limit`` at most, after cursor
    ``after`` (a job id), filtered by ``state`` (``"stuck"``: running past expected), ``tenant``, ``type``,
    ``user``."""

    queue: str = ""
    state: str | None = None
    tenant: str | None = None
    type: str | None = None
    limit: int = 50
    after: str | None = None
    user: str | None = None


class ErrorEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One failed attempt as a job's row keeps it (in ``errors``, JSON): ``traceback`` only when its handler raised."""

    attempt: int
    error: str
    at_ms: int
    traceback: str | None = None


class JobRow(msgspec.Struct, kw_only=True):
    """A job as stored. Times in ms since the Unix epoch; ``value``/``result``: JSON text; ``progress``: the
    decoded JSON value."""

    id: str
    queue: str
    state: str
    attempts: int
    max_attempts: int
    fence: int
    value: str
    key: str | None = None
    tenant: str = ""
    user: str | None = None
    type: str | None = None
    priority: int = 0
    progress: Any = None
    result: str | None = None
    error: str | None = None
    errors: list[ErrorEntry] = []
    steps: dict[str, Any] = {}
    run_at_ms: int = 0
    created_at_ms: int = 0
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    stuck: bool = False


class Page(msgspec.Struct, kw_only=True):
    """Reply of ``jobs.list``: a page of jobs; ``next``, the cursor of the next page (``None``: no more);
    ``unreadable``, for a list of every queue, the errors of the queues whose jobs could not be read (their
    database missing), each naming its queue: the page holds the other queues' jobs."""

    jobs: list[JobRow]
    next: str | None = None
    unreadable: list[str] = []


class Wait(msgspec.Struct, kw_only=True):
    """``jobs.wait``: the job once it differs from ``seen`` (state, attempts, fence, progress JSON), or after
    ``wait_ms`` as it is then."""

    queue: str
    id: str
    seen: str = ""
    wait_ms: int = 30_000


class CancelRun(msgspec.Struct, kw_only=True):
    """Push ``jobs.cancel``: stop running attempt ``fence`` of job ``id``. ``reason``: ``"cancelled"`` (the job
    was cancelled) or ``"lost"`` (its lease ran out and the attempt no longer counts)."""

    queue: str
    id: str
    fence: int
    reason: str


JobState = Literal["queued", "running", "succeeded", "failed", "dead", "cancelled"]
"""The states of a job (JOB-02): ``failed`` means a retry is due; ``succeeded``, ``dead`` and ``cancelled`` are
ended."""


class JobEvent(msgspec.Struct):
    """A job event, published on the channel ``tinystore-jobs`` under ``(queue, job_id)``.

    ``kind``: ``"state"`` (the job changed state), ``"progress"`` (the handler reported progress) or
    ``"stuck"`` (the job runs past its expected time). ``state``, ``progress``, ``attempts`` and ``error`` are
    the job's at that moment.
    """

    kind: Literal["state", "progress", "stuck"]
    job_id: str
    state: JobState
    progress: Any = None
    attempts: int = 0
    error: str | None = None


def snapshot(row: JobRow) -> str:
    """What ``jobs.wait`` compares: a change of state, attempts, fence or progress is a change."""
    return msgspec.json.encode([row.state, row.attempts, row.fence, row.progress, row.stuck]).decode()


def check_client_publish(channel: str) -> None:
    """Refuse a client's publish on a channel the store keeps for its own events (``tinystore-jobs``):
    raises ``PermissionDeniedError``. The store's own events do not go through this check."""
    if channel in RESERVED_CHANNELS:
        raise PermissionDeniedError(
            f"channel {channel}: the store publishes its own job events there; clients may subscribe but not publish"
        )


JOB_ID = re.compile(r"[0-9a-hjkmnp-tv-z]{26}")
"""What a job id looks like: 26 characters of lower-case Crockford base32."""


def is_job_id(value: object) -> bool:
    """``True`` for text shaped like a job id (whether or not such a job exists)."""
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def check_text(where: str, label: str, value: object, limit: int = TEXT_MAX) -> None:
    """Refuse ``value`` unless it is ``None`` or a str of valid Unicode of at most ``limit`` characters:
    ``InvalidError`` starting with ``where`` (``queue q: list``) and naming ``label`` (``tenant``)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidError(f"{where}: {label} {shown(value)} is not a str (or None)")
    if not valid_text(value):
        raise InvalidError(f"{where}: {label} {shown(value)} is not valid Unicode text (it holds a lone surrogate)")
    if len(value) > limit:
        raise InvalidError(f"{where}: {label} {shown(value)}: at most {limit} characters")


def is_int(value: object) -> bool:
    """``True`` for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_list(queue: str, req: List) -> None:
    """Refuse a ``jobs.list`` request with a bad argument: ``InvalidError`` naming the queue and the argument
    (``queue q: list: limit '5' is not an int from 1 to 1000``)."""
    where = f"queue {queue or '(all)'}: list"
    if not is_int(req.limit) or not 1 <= req.limit <= LIST_MAX:
        raise InvalidError(f"{where}: limit {shown(req.limit)} is not an int from 1 to {LIST_MAX}")
    if req.state is not None and (not isinstance(req.state, str) or req.state not in LIST_STATES):
        raise InvalidError(f"{where}: state {shown(req.state)} is not one of {', '.join(LIST_STATES)} (or None)")
    for label, v in (("tenant", req.tenant), ("type", req.type), ("user", req.user)):
        check_text(where, label, v)
    check_cursor(queue, req.after)


def check_step_name(where: str, name: object) -> str:
    """``name`` when it names a step: a str of valid Unicode, 1 to 256 characters, without quotes or backslashes
    (it is a JSON path in the store); ``InvalidError`` starting with ``where`` (``queue q: job …``) otherwise."""
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= TEXT_MAX
        or '"' in name
        or "\\" in name
        or not valid_text(name)
    ):
        raise InvalidError(
            f"{where}: step name {shown(name)}: a str of 1 to {TEXT_MAX} characters, without quotes or backslashes"
        )
    return name


def check_concurrency(queue: str, what: str, value: object) -> int:
    """``value`` when it is an int from 1 to 1000; ``InvalidError`` naming the queue and the call otherwise."""
    if not is_int(value) or not 1 <= value <= 1000:  # type: ignore[operator]
        raise InvalidError(f"queue {queue}: {what}: concurrency {shown(value)} is not an int from 1 to 1000")
    return value  # type: ignore[return-value]


def check_job_id(queue: str, what: str, value: object) -> str:
    """``value`` when it is a str of valid Unicode; ``InvalidError`` naming the queue and the call otherwise (an
    unknown id is not an error: the call finds nothing)."""
    if not isinstance(value, str):
        raise InvalidError(f"queue {queue}: {what}: job id {shown(value)} is not a str (a job id is what add returned)")
    if not valid_text(value):
        raise InvalidError(
            f"queue {queue}: {what}: job id {shown(value)} is not valid Unicode text (a job id is what add returned)"
        )
    return value


def check_cursor(queue: str, after: object) -> None:
    """Refuse a list cursor (``after``) that is not a job id: a page's ``next`` is one."""
    if after is not None and not is_job_id(after):
        shown = after[:40] if isinstance(after, str) else after
        raise InvalidError(
            f"queue {queue or '(all)'}: list: cursor after={shown!r} is not a job id (pass the next of a page, or None)"
        )
