"""Live updates to a browser: server-sent events over ASGI (Starlette, FastAPI, any ASGI server).

Two ways in, both ASGI responses (Starlette and FastAPI return them as they are):

- :func:`event_stream` serves a channel branch: each message is an event whose ``id`` is the message's id,
  a browser that reconnects with ``Last-Event-ID`` resumes after it while the branch's log holds it, and
  anything the stream cannot deliver (a gap, an id the log no longer holds, a malformed id) becomes one
  event ``reload`` with the exact count (SSE-03). The streams of a branch in one process share one
  subscription, so a thousand tabs of one chat cost the store one subscriber.
- :func:`sse_response` serves any producer given ``send`` and ``closed``, such as the seed's
  ``stream(chat_id, send, closed)``.

Framing follows the WHATWG HTML Living Standard, section "Server-sent events" (9.2, the
``text/event-stream`` format and its parsing rules): :func:`encode_event` writes one ``data:`` line per line
of the data (CR LF, CR and LF are all line breaks), ``event:`` and ``id:`` fields that cannot hold a line
break (nor, for ``id``, a NUL, which makes browsers ignore the field), ``retry:`` in milliseconds, and ends
every event with a blank line. An idle stream sends a comment line (``: keep-alive``) every ``keepalive``.
Responses carry ``Content-Type: text/event-stream``, ``Cache-Control: no-cache`` and
``X-Accel-Buffering: no`` (nginx), no ``Content-Length``, no compression (Starlette's ``GZipMiddleware``
passes ``text/event-stream`` through), and every event is handed to the server as soon as it is produced.

The response races its body against the client's disconnect, as Starlette's ``StreamingResponse`` does: a
task reads the ASGI ``receive`` channel, and on ``http.disconnect`` the stream stops writing, sets
``closed``, and gives the producer :data:`STOP_WITHIN` seconds to return before cancelling it; the channel
subscription of :func:`event_stream` is stopped within that bound too (SSE-04). Nothing is left running.
:func:`end_streams` ends every stream of the process when its server shuts down (by itself at SIGTERM and
SIGINT).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
import math
import os
import re
import signal
import socket
import struct
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .durations import Duration, seconds
from .errors import InvalidError, LimitError, TinystoreError, UnavailableError
from .protocol.values import at_path
from .socket_queue import unsent_in_socket

if TYPE_CHECKING:
    from .client.channels import Channel, Message, Missed, Subscription

__all__ = [
    "KEEPALIVE",
    "MAX_PENDING",
    "STOP_WITHIN",
    "EventSourceResponse",
    "SendEvent",
    "encode_comment",
    "encode_event",
    "end_streams",
    "event_stream",
    "sse_response",
]

log = logging.getLogger("tinystore.sse")

KEEPALIVE = 15.0
"""Seconds of silence after which a stream sends a comment line, so proxies and load balancers keep it open."""

UNREACHED_WAIT = 5.0
"""Seconds a stream asked for while the SDK is not connected to the store waits for it (a restart's reconnect takes
less); then it answers 503, ``Retry-After`` 5 s, rather than wait out the SDK's ``reconnect_timeout``."""

STOP_WITHIN = 5.0
"""Seconds a producer (or a channel subscription) is given to end after the browser went away; then it is
cancelled."""

MAX_PENDING = 1024 * 1024
"""Bytes of events a stream holds for a browser that does not read them: an event that comes when more wait ends the
stream at once, what waits dropped (the browser reconnects); one event, however big, goes when less waits. Only a
producer that does not await ``send`` can get that far ahead."""

BACKLOG = 64 * 1024
"""Bytes of events waiting for a browser past which a channel stream stops taking messages from its
subscription (so the branch's log, not this process, holds the backlog, and drops it into a ``reload``)."""

KEEPALIVE_COMMENT = b": keep-alive\n\n"

STALL = 60.0
"""Seconds one write to a browser may wait (its connection takes nothing: a tab frozen in the background, a
client that never reads) before the stream ends; the browser, if it comes back, reconnects and resumes. Without
it such a stream held its events (up to half of ``max_pending``) for as long as its connection stayed open."""

END_GRACE = 0.5
"""Seconds a write to a browser may still wait once the server stops (:func:`end_streams`): a browser that takes
nothing then is not waited for (trial FI: such a stream held a Ctrl-C of the demo until uvicorn cancelled it, with
an ERROR and its traceback); one that reads gets what is queued."""

FIRST_CHUNK = b": ok\n\n"
"""Written right after the headers, so that the browser's ``EventSource`` opens at once."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MESSAGE_ID = re.compile(r"[0-9]{1,30}-[0-9]{1,30}")


# ---------------------------------------------------------------------------------------------- framing


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: what a browser decoding it would show, U+FFFD
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def _check_field(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise InvalidError(f"sse: the {name} field {value[:40]!r} holds a line break, which would end the field")
    if name == "id" and "\x00" in value:
        raise InvalidError(f"sse: the id {value[:40]!r} holds a NUL; browsers ignore such an id")


def encode_event(
    data: str | None = None,
    *,
    event: str | None = None,
    id: str | None = None,
    retry: Duration | None = None,
) -> bytes:
    """One server-sent event as UTF-8 bytes, per WHATWG HTML "Server-sent events" (the event stream format).

    - ``data``: text; every line of it (CR LF, CR and LF are all line breaks, as the spec parses them) becomes
      one ``data: <line>`` line, so any text, including lines that start with ``data:``, ``id:`` or ``:``,
      arrives as one event whose ``data`` is the text with each line break turned into LF (the format has no
      other). ``None``: no ``data`` line; browsers then dispatch nothing, but still take ``id`` as the stream's
      last event id. Lone surrogates become U+FFFD, as a browser would decode them.
    - ``event``: the event type (``addEventListener(type)`` in the browser); ``None`` or ``""``: ``message``.
    - ``id``: the id the browser sends back as ``Last-Event-ID`` when it reconnects; ``""`` resets it.
    - ``retry``: the browser's reconnection delay (a duration; written in milliseconds).

    Returns the bytes of the event, ending with a blank line. Raises ``InvalidError`` for a ``data``,
    ``event`` or ``id`` that is neither a str nor ``None`` (naming the field and the type given; for other
    values, :func:`encode_json` makes the ``data`` text), an ``event`` or ``id`` holding a line break, an
    ``id`` holding a NUL, or a bad ``retry`` (see :func:`~tinystore.durations.seconds`).
    """
    if not isinstance(data, str | None):
        raise InvalidError(
            f"sse: the data of an event must be a str or None, got {_kind(data)}; encode_json(value) makes JSON "
            "text of other values"
        )
    if not isinstance(event, str | None):
        raise InvalidError(f"sse: the event field must be a str or None, got {_kind(event)}")
    if not isinstance(id, str | None):
        raise InvalidError(f"sse: the id field must be a str or None, got {_kind(id)}")
    out: list[str] = []
    if event:
        _check_field("event", event)
        out.append(f"event: {event}\n")
    if id is not None:
        _check_field("id", id)
        out.append(f"id: {id}\n" if id else "id\n")
    if retry is not None:
        out.append(f"retry: {round(seconds(retry, 'sse retry') * 1000)}\n")
    if data is not None:
        for line in _LINE_BREAK.split(data):
            out.append(f"data: {line}\n")
    out.append("\n")
    return _utf8("".join(out))


def encode_comment(text: str = "") -> bytes:
    """A comment line (``: text``), which browsers ignore: keeps an idle connection open. Each line of ``text``
    becomes its own comment line. Returns UTF-8 bytes ending with a blank line."""
    return _utf8("".join(f": {line}\n" for line in _LINE_BREAK.split(text)) + "\n")


_json_encode = msgspec.json.Encoder().encode


def encode_json(value: Any) -> str:
    """``value`` as JSON text for a ``data`` field: dicts, lists, str, numbers, bools, None, dataclasses,
    msgspec Structs, TypedDicts, datetimes, UUIDs. JSON escapes line breaks, so the text is one ``data`` line
    and comes back exactly with ``JSON.parse`` (lone surrogates as ``\\udxxx`` escapes).

    Raises ``InvalidError`` for a value JSON cannot hold: an object of a type it does not encode, or a float
    that is NaN or infinite (JSON has no such number; the error names it and where, ``nan is not a JSON number
    (at $.readings[2])``), rather than writing it as ``null``."""
    try:
        out = _json_encode(value)
        if b"null" not in out:  # the common case: msgspec writes a NaN or an infinity as null, so there is none
            return out.decode("utf-8")
        builtins = msgspec.to_builtins(value)
    except UnicodeEncodeError:  # a lone surrogate, which UTF-8 cannot hold: JSON escapes it
        builtins = msgspec.to_builtins(value)
        out = b""
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise InvalidError(f"sse: the data does not encode as JSON: {exc}") from None
    problem = _non_finite(builtins)
    if problem is not None:
        raise InvalidError(f"sse: the data does not encode as JSON: {problem}")
    if out:
        return out.decode("utf-8")
    return json.dumps(builtins, ensure_ascii=True, separators=(",", ":"))


def _non_finite(value: Any) -> str | None:
    """Where plain data (what ``msgspec.to_builtins`` makes) holds a float that is NaN or infinite, as text
    (``inf is not a JSON number (at $.x[2])``, as :func:`~tinystore.protocol.values.json_problem` words it), or
    ``None``. Unlike that check, ints past 64 bits and keys that are not text pass: JSON for a browser holds
    them."""
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return f"{v!r} is not a JSON number{at_path(where)}"
        elif isinstance(v, dict):
            stack.extend((item, (where, k)) for k, item in v.items())
        elif isinstance(v, list | tuple):
            stack.extend((item, (where, i)) for i, item in enumerate(v))
    return None


# ---------------------------------------------------------------------------------------------- the outbox


class _Outbox:
    """Encoded events waiting for the writer, and the futures of the senders that wait for them to be written.

    One writer (the response) takes everything queued at once and hands it to the server as one chunk.
    """

    __slots__ = (
        "__weakref__",
        "behind",
        "closed",
        "ending",
        "event",
        "futures",
        "keepalive_due",
        "limit",
        "loop",
        "on_drained",
        "overflowed",
        "parts",
        "size",
        "sock",
        "transport",
        "writing",
    )

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.futures: list[asyncio.Future[None]] = []
        self.event = asyncio.Event()
        self.closed = False
        self.ending = False
        self.keepalive_due = False
        self.overflowed = False
        self.behind = False  # a shared stream dropping messages until the browser caught up
        self.on_drained: Callable[[], None] | None = None
        self.limit = limit
        self.loop = asyncio.get_running_loop()
        self.writing: asyncio.Timeout | None = None  # the deadline of the write under way
        self.transport: Any = None  # the connection's (see _watch_progress): None unknown yet, False none found
        self.sock: Any = None  # its socket, or None

    def end(self) -> None:
        """Finish the response once what is queued is written (the server is shutting down); a write that waits
        for the browser gives up :data:`END_GRACE` seconds from now at the latest."""
        self.ending = True
        self.event.set()
        _reschedule(self.writing, self.loop.time() + END_GRACE)

    def push(self, chunk: bytes) -> bool:
        """Queue ``chunk``; True when the browser is behind (over :data:`BACKLOG` bytes wait).

        An event that comes when more than ``limit`` bytes wait ends the stream: what waits is dropped, and so is
        every later chunk, and a write under way (that waits for a browser that takes nothing) is given up now, not
        at its :data:`STALL` (trial HI: a producer that did not await its sends queued 1.7 GB in 20 s)."""
        if self.closed or self.overflowed:
            return not self.closed
        waited = self.size
        self.parts.append(chunk)
        self.size += len(chunk)
        if waited > self.limit:
            # (what waited before this event is what tells a browser behind: one event, however big, goes after
            # small ones not taken yet in this loop turn: trial HK, one over the limit ended the stream of a browser
            # that read at once, and again at each reconnect; trial HM, so did one after a small one not awaited)
            self.overflowed = True
            self.parts = []
            self.size = 0
            _reschedule(self.writing, self.loop.time())
        self.event.set()
        return self.size > BACKLOG or self.overflowed

    def written(self) -> asyncio.Future[None]:
        """A future that completes once what is queued now was handed to the server (or the stream ended)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        if self.closed or (not self.parts and not self.overflowed):
            # resolved in the loop's next turn, not now: awaiting a future already done does not let the loop run,
            # and a producer that sends on after its stream ended, never looking at ``closed``, held the process
            # at 100 % CPU, its cancel at STOP_WITHIN and every other request waiting for good (trial HK)
            self.loop.call_soon(_resolve_one, fut)
        else:
            self.futures.append(fut)
        return fut

    def put(self, chunk: bytes) -> asyncio.Future[None]:
        self.push(chunk)
        return self.written()

    def settled(self) -> asyncio.Future[None]:
        """A future that completes once what is queued now was handed to the server and the connection holds
        at most half of :data:`BACKLOG` unsent (looked at every :data:`CATCH_UP_EVERY` seconds), or the stream
        ended."""
        fut: asyncio.Future[None] = self.loop.create_future()

        def check(_: object = None) -> None:
            if fut.done():
                return
            if self.closed or _unsent(self) <= BACKLOG // 2:
                fut.set_result(None)
            else:
                self.loop.call_later(CATCH_UP_EVERY, check)

        self.written().add_done_callback(check)
        return fut

    def take(self) -> tuple[bytes, list[asyncio.Future[None]]]:
        chunk = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        futures = self.futures
        self.parts = []
        self.futures = []
        self.size = 0
        return chunk, futures

    def close(self) -> None:
        """No more writes: what is queued is dropped and every sender is let go."""
        self.closed = True
        self.parts = []
        self.size = 0
        futures, self.futures = self.futures, []
        _resolve(futures)
        self.event.set()


def _sooner(when: float | None, other: float) -> float:
    return other if when is None else min(when, other)


def _reschedule(deadline: asyncio.Timeout | None, when: float, later: bool = False) -> None:
    """Move the deadline of a write under way to ``when``, if sooner (or, ``later``, to ``when`` whatever it was);
    nothing when no write is under way, or its deadline already fired (its cancel on its way: trial HM, a send then
    raised RuntimeError "Cannot change state of expiring Timeout")."""
    if deadline is None or deadline.expired():
        return
    deadline.reschedule(when if later else _sooner(deadline.when(), when))


_open: weakref.WeakSet[_Outbox] = weakref.WeakSet()


def end_streams() -> int:
    """End every event stream this process serves: each writes what it holds, then finishes its response, so
    the browsers reconnect (after their ``retry`` delay) to whichever server answers then. Returns how many
    streams were told. Safe to call from a signal handler or another thread.

    It runs by itself at SIGTERM and SIGINT: the first stream of a process served from its main thread puts it
    before the handlers the process has then (uvicorn's, in each of its worker processes), since an ASGI server
    waits for open responses to finish before it stops (uvicorn for ``timeout_graceful_shutdown``, then it
    cancels them; without it, until the browsers go away: a deploy would wait for a tab). Call it yourself
    when the server stops by other means, or when the handlers are installed after the first stream. With
    uvicorn run from your code::

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                tinystore.sse.end_streams()
                super().handle_exit(sig, frame)

    With the ``uvicorn app:app --workers N`` command, chain it before uvicorn's own handler from the app's
    lifespan (uvicorn installed its handlers by then, in each worker process)::

        @contextlib.asynccontextmanager
        async def lifespan(app):
            for sig in (signal.SIGTERM, signal.SIGINT):
                before = signal.getsignal(sig)
                def handler(signum, frame, before=before):
                    tinystore.sse.end_streams()
                    if callable(before):
                        before(signum, frame)
                signal.signal(sig, handler)
            yield
    """
    told = 0
    for outbox in list(_open):
        if not outbox.closed:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                outbox.loop.call_soon_threadsafe(outbox.end)
                told += 1
    return told


_hooked_pid = 0


def _end_streams_at_shutdown() -> None:
    """Put :func:`end_streams` before this process's SIGTERM and SIGINT handlers, once per process (a fork's
    child too). Only the main thread may set handlers: streams served elsewhere leave them as they are. What
    ran before still runs after it: a function handler is called, the default action is taken (the signal is
    raised again under it). An ignored signal, or one whose handler was set outside Python, is left alone."""
    global _hooked_pid
    pid = os.getpid()
    if _hooked_pid == pid or threading.current_thread() is not threading.main_thread():
        return
    _hooked_pid = pid
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            before = signal.getsignal(sig)
            if getattr(before, "ends_streams", False) or not (callable(before) or before == signal.SIG_DFL):
                # ignored (it stays so, also for the programs this one starts: trial AW), or set outside Python
                # (None: it could not be called after ours): left as it is
                continue

            def handler(signum: int, frame: Any, before: Any = before) -> None:
                end_streams()
                if callable(before):
                    before(signum, frame)
                elif before == signal.SIG_DFL:
                    signal.signal(signum, signal.SIG_DFL)
                    signal.raise_signal(signum)

            handler.ends_streams = True  # type: ignore[attr-defined]
            signal.signal(sig, handler)
        except (ValueError, OSError):  # pragma: no cover - not the main interpreter
            return


def _resolve_one(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class SendEvent(Protocol):
    """The ``send`` a producer gets: ``send(data, event=None, id=None)``.

    ``data`` is any JSON-encodable value (dicts, lists, str, numbers, dataclasses, msgspec Structs), written as
    one ``data:`` line of JSON; ``event`` the event type; ``id`` the event's id (no line break, no NUL). It
    queues the event at once and returns an awaitable that completes when the event was handed to the server
    (or the stream ended); awaiting it makes the producer go at the browser's pace, and not awaiting it is fine
    too. After the stream ended, ``send`` does nothing. Raises ``InvalidError`` before anything is queued: for
    ``data`` that JSON cannot hold (see :func:`encode_json`: an object it does not encode, a NaN or an
    infinity), an ``event`` or ``id`` that is not a str (naming the field and the type given), or one holding a
    line break (or, for ``id``, a NUL).
    """

    def __call__(self, data: Any, event: str | None = None, id: str | None = None) -> asyncio.Future[None]: ...


Producer = Callable[[SendEvent, asyncio.Event], Awaitable[Any] | Any]


def _sender(outbox: _Outbox) -> SendEvent:
    def send(data: Any, event: str | None = None, id: str | None = None) -> asyncio.Future[None]:
        return outbox.put(encode_event(encode_json(data), event=event, id=id))

    return send


# ---------------------------------------------------------------------------------------------- the response


class EventSourceResponse(Response):
    """An ASGI response that streams server-sent events (WHATWG HTML "Server-sent events") from a producer.

    A ``starlette.responses.Response``, so Starlette and FastAPI endpoints return it as it is (see
    :func:`sse_response` and :func:`event_stream`, which make one). ``producer(send, closed)`` runs once the
    headers are sent; the stream ends when it returns (or raises: logged), when :func:`end_streams` is called,
    when more than ``max_pending`` bytes wait for the browser, when one write waits :data:`STALL` seconds (the
    browser takes nothing), or when the browser goes away. However it ends,
    ``closed`` is set and the producer has :data:`STOP_WITHIN` seconds to return before it is cancelled; what
    was queued and not written is dropped.

    ``keepalive``: a duration (seconds, or text such as ``"15s"``) of silence before a comment line; ``retry``: the
    browser's reconnection delay, sent after the opening ``: ok`` comment, before any event; ``headers``: extra response
    headers; ``status_code``: 200; ``max_pending``: bytes (1 MiB). Raises ``InvalidError`` for a ``keepalive`` that is
    not above 0, a bad ``retry``, ``headers`` that are not a mapping of str to str, or a ``max_pending`` that is not an
    int of 1 or more. A cancel of the response (an ASGI server past its graceful shutdown) also sets ``closed`` and
    waits for the producer as above before the ``CancelledError`` goes on: no task of the stream is left.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        producer: Producer | None = None,
        *,
        keepalive: Duration = KEEPALIVE,
        retry: Duration | None = None,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.status_code = status_code
        self.background = None
        self.keepalive = seconds(keepalive, "sse keepalive")
        if self.keepalive <= 0:
            raise InvalidError("sse: keepalive must be above 0 seconds")
        self.retry = retry
        self.first_chunk = FIRST_CHUNK + (encode_event(retry=retry) if retry is not None else b"")
        if headers is not None and (
            not isinstance(headers, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise InvalidError(f"sse: headers must be a mapping of str to str, got {_kind(headers)} {headers!r:.60}")
        if type(max_pending) is not int or max_pending < 1:
            raise InvalidError(f"sse: max_pending must be an int of 1 or more (bytes), got {max_pending!r:.40}")
        self.max_pending = max_pending
        self._producer = producer
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def _open(self, outbox: _Outbox) -> Producer | None:
        """Called before the headers go out; returns the producer to run (None: none, the subclass writes
        to ``outbox`` itself). A ``TinystoreError`` raised here becomes a 503 (500 for other codes)."""
        if self._producer is None:
            raise InvalidError("sse: no producer")
        return self._producer

    def _alive(self) -> bool:
        """Checked at each keep-alive tick: False ends the stream."""
        return True

    async def _close(self) -> None:
        """Called once the stream ended, whatever ended it (bounded by :data:`STOP_WITHIN` by the caller)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"sse: an event stream answers HTTP requests, not {scope['type']}")
        outbox = _Outbox(self.max_pending)
        try:
            producer = await self._open(outbox)
        except TinystoreError as exc:
            outbox.close()
            status = 503 if isinstance(exc, LimitError) or exc.code in ("closed", "unavailable") else 500
            log.warning("sse: cannot open the stream: %s", exc)
            if status == 503 and _wants_event_stream(scope):
                # an EventSource takes any status but 200 as the end for good (WHATWG HTML, "Server-sent
                # events": "fail the connection"), Retry-After unread: a stream that ends at once, with a retry
                # delay, has it try again then (trial AV: a tab stopped updating until it was reloaded)
                await _ended_stream(send, f"event stream unavailable: {exc.message}")
                return
            await _plain(send, status, f"event stream unavailable: {exc.message}\n")
            return
        unfinished = False
        try:
            unfinished = await self._stream(producer, outbox, receive, send)
        finally:
            try:
                async with asyncio.timeout(STOP_WITHIN):
                    await self._close()
            except TimeoutError:
                log.warning("sse: the stream's subscription did not stop within %gs", STOP_WITHIN)
        if unfinished:
            _left_unfinished()

    async def _stream(self, producer: Producer | None, outbox: _Outbox, receive: Receive, send: Send) -> bool:
        """Serve the stream until it ends; True when it ends with its response unfinished (a write to a browser
        that took nothing gave up) and its connection could not be closed at once (the server logs it then)."""
        closed = asyncio.Event()
        wake = outbox.event

        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    closed.set()
                    wake.set()
                    return

        listener = asyncio.ensure_future(listen())
        _open.add(outbox)
        _end_streams_at_shutdown()
        task: asyncio.Task[None] | None = None
        ended_by_us = False
        abandoned = False  # a write to the browser gave up: the response is left unfinished
        aborted = False  # ... and its connection closed at once
        loop = outbox.loop
        keepalive = self.keepalive
        last_write = loop.time()
        timer: asyncio.TimerHandle | None = None

        recheck: asyncio.TimerHandle | None = None

        def caught_up() -> None:
            """A stream behind whose outbox drained: the browser caught up once the connection holds little unsent
            too (trial IH: a browser that read nothing was told "reload" again each time the kernel took 64 KB
            more, 44 times, each reload's data more for it to read); else looked at again later."""
            nonlocal recheck
            recheck = None
            if closed.is_set() or outbox.closed or not outbox.behind or outbox.on_drained is None:
                return
            if outbox.size > BACKLOG // 2:
                return  # (the next write looks again)
            if _unsent(outbox) > BACKLOG // 2:
                recheck = loop.call_later(CATCH_UP_EVERY, caught_up)
                return
            outbox.on_drained()

        def tick() -> None:  # one timer per stream, re-armed; never one per event
            nonlocal timer
            if not self._alive():
                outbox.end()
                return
            idle = loop.time() - last_write
            if idle >= keepalive * 0.999:
                outbox.keepalive_due = True
                wake.set()
                idle = 0.0
            timer = loop.call_later(keepalive - idle, tick)

        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.first_chunk, "more_body": True})
            _found_transport(send, outbox)  # (what it holds unsent tells a browser behind when it caught up)
            last_write = loop.time()
            timer = loop.call_later(keepalive, tick)
            if producer is not None:
                task = asyncio.ensure_future(_produce(producer, _sender(outbox), closed))
                task.add_done_callback(lambda _: wake.set())
            while not closed.is_set():
                if outbox.overflowed:
                    ended_by_us = True
                    break
                if outbox.parts:
                    chunk, futures = outbox.take()
                    wake.clear()
                    outbox.keepalive_due = False
                    if not await _write(send, chunk, outbox):
                        _resolve(futures)  # (the senders that await it go on: trial FJ, they waited to be cancelled)
                        abandoned = True
                        break
                    last_write = loop.time()
                    if futures:
                        _resolve(futures)
                    if (
                        outbox.behind
                        and outbox.size <= BACKLOG // 2
                        and outbox.on_drained is not None
                        and recheck is None  # (else a look is due already: one chain of them)
                    ):
                        caught_up()
                    continue
                if outbox.ending or (task is not None and task.done()):
                    ended_by_us = True
                    break
                if outbox.keepalive_due:
                    outbox.keepalive_due = False
                    if not await _write(send, KEEPALIVE_COMMENT, outbox):
                        abandoned = True
                        break
                    last_write = loop.time()
                    continue
                wake.clear()
                await wake.wait()
            if outbox.overflowed:
                log.warning(
                    "sse: over %d bytes of events waited for a browser that did not take them; ending the stream "
                    "(what waited is dropped; the browser reconnects)",
                    self.max_pending,
                )
            if ended_by_us and not closed.is_set() and not await _write(send, b"", outbox, more_body=False):
                abandoned = True
        except OSError:  # the server could not write: the client is gone
            pass
        finally:
            transport = _transport_of(send) if abandoned else None
            if transport is not None:
                # (before the awaits below, which let the server see the connection lost)
                aborted = _close_stuck(transport, loop, at_once=not outbox.ending)
            if timer is not None:
                timer.cancel()
            if recheck is not None:
                recheck.cancel()
            closed.set()
            outbox.close()
            listener.cancel()
            if task is not None:
                await _finish(task)
            with contextlib.suppress(BaseException):
                await listener
        return abandoned and not aborted


def _transport_of(send: Any) -> Any:
    """The transport of the connection under an ASGI server's ``send``, or ``None`` when it cannot be found:
    uvicorn's ``send`` is a method of its request's cycle, which holds the transport, and middleware wraps it in
    functions whose closures hold the ``send`` they wrap (only looked at, never called)."""
    todo = [send]
    seen: set[int] = set()
    while todo and len(seen) < 32:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        owner = getattr(f, "__self__", None)
        transport = getattr(owner, "transport", None)
        if callable(getattr(transport, "abort", None)) and callable(getattr(transport, "get_write_buffer_size", None)):
            return transport
        with contextlib.suppress(TypeError):  # (a method of a wrapper that holds the send it wraps: GZipMiddleware's)
            todo.extend(v for v in vars(owner).values() if callable(v))
        for cell in getattr(f, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # (an empty cell)
                continue
            if callable(value):
                todo.append(value)
    return None


ABORT_CHECK = 0.5
"""Seconds between the looks at a connection whose stream was given up at a stop (see :data:`STUCK_FOR`)."""
STUCK_FOR = 2.0
"""Seconds without a byte of such a connection sent (its transport's and its socket's unsent bytes no lower than
at a look before) after which it is closed at once; one whose browser takes what waits, slowly, is left to the
server's close, which writes it all first (trial FL: closed at once, a slow browser that read lost events handed
over; trial FN: at 100 KB/s, the socket's queue did not move for half a second at a time)."""
ABORT_WITHIN = 30.0
"""Seconds after a stop's give-up by which such a connection is closed, however slowly it is read."""


def _abort(transport: Any) -> None:
    """Close ``transport`` now, and its socket with a reset (``SO_LINGER`` 0): what the kernel holds for a browser
    that takes nothing goes too (trial HO: a plain close kept the connection in FIN-WAIT-1, its 2.7 MB queue and its
    window probes, for as long as the frozen tab answered them)."""
    with contextlib.suppress(Exception):
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _close_stuck(transport: Any, loop: asyncio.AbstractEventLoop, at_once: bool) -> bool:
    """Close ``transport`` (of a stream given up) at once, dropping what its buffers hold for a browser that takes
    nothing: its ``close()``, which the server calls once the application returns, waits for those buffers to
    drain, and the server for its connections to close before it stops (trial FJ: a plain ``uvicorn app:app``
    never stopped at a Ctrl-C). ``at_once``: now (the browser took nothing for :data:`STALL`); else once it sent
    nothing for :data:`STUCK_FOR` seconds (or :data:`ABORT_WITHIN` passed). True when it was closed now."""
    if at_once:
        with contextlib.suppress(Exception):
            _abort(transport)
            return True
        return False
    deadline = loop.time() + ABORT_WITHIN
    sock = transport.get_extra_info("socket")

    def waiting() -> int:
        """Bytes not yet sent: the transport's buffer, and the socket's (the kernel takes more only once a third of
        its buffer is free, so the transport's alone may not move for a second while the browser reads)."""
        size: int = transport.get_write_buffer_size()
        return size + unsent_in_socket(sock)

    def look(least: int, since: float) -> None:
        try:
            if transport.is_closing() and transport.get_write_buffer_size() == 0:
                return  # (closed, all handed to the kernel: the browser reads the rest as it may)
            size, now = waiting(), loop.time()
            if not size:
                return
            if size < least:
                least, since = size, now
            if now - since >= STUCK_FOR or now >= deadline:
                _abort(transport)
            else:
                loop.call_later(ABORT_CHECK, look, least, since)
        except Exception:  # (closed meanwhile)
            return

    with contextlib.suppress(Exception):
        loop.call_later(ABORT_CHECK, look, waiting(), loop.time())
    return False


async def _write(send: Send, body: bytes, outbox: _Outbox, more_body: bool = True) -> bool:
    """Hand ``body`` to the server as more of the response (the last of it, when not ``more_body``); False
    (logged) when that waited :data:`STALL` seconds, or :data:`END_GRACE` once the server stops: the browser takes
    nothing (the write is cancelled, and the stream is to end, unfinished)."""
    stop_watching: Callable[[], None] | None = None
    try:
        async with asyncio.timeout(STALL) as deadline:
            outbox.writing = deadline
            if outbox.ending or outbox.overflowed:
                # (the stream's end after an overflow: the browser is 1 MiB behind, and it is not waited for STALL:
                # trial HK, such a stream stayed 60 s, its producer not told)
                deadline.reschedule(_sooner(deadline.when(), outbox.loop.time() + END_GRACE))
            else:
                stop_watching = _watch_progress(send, outbox, deadline)
            await send({"type": "http.response.body", "body": body, "more_body": more_body})
    except TimeoutError:
        if outbox.overflowed:
            pass  # (said once, as the stream ends)
        elif outbox.ending:
            # (a browser that reads slowly too: trial FQ, a steady reader was said to take nothing)
            log.info(
                "sse: the server stops and the browser did not take the next event within %gs; ending the stream "
                "(what was handed over still goes out while it reads)",
                END_GRACE,
            )
        else:
            log.warning("sse: the browser took nothing for %gs; ending the stream", STALL)
        return False
    finally:
        outbox.writing = None
        if stop_watching is not None:
            stop_watching()
    return True


PROGRESS_EVERY = 5.0
"""Seconds between two looks at whether a write that waits makes progress (see :func:`_watch_progress`)."""


CATCH_UP_EVERY = 0.25
"""Seconds between two looks at whether a browser behind has read what its connection holds (see ``caught_up``)."""


def _found_transport(send: Send, outbox: _Outbox) -> Any:
    """The connection's transport (uvicorn's), found once and kept on ``outbox`` with its socket; ``False`` when
    there is none to find (another ASGI server)."""
    transport = outbox.transport
    if transport is None:
        found: Any = _transport_of(send)
        transport = outbox.transport = found if found is not None else False
        if found is not None:
            with contextlib.suppress(Exception):
                outbox.sock = found.get_extra_info("socket")
    return transport


def _unsent(outbox: _Outbox) -> int:
    """Bytes written to the browser and not taken by it yet: the transport's buffer and the socket's (0 where
    neither can be looked at: see :func:`_found_transport`)."""
    transport = outbox.transport
    buffered = getattr(transport, "get_write_buffer_size", None) if transport else None
    try:
        held = int(buffered()) if buffered is not None else 0
    except Exception:
        held = 0
    return held + unsent_in_socket(outbox.sock)


def _watch_progress(send: Send, outbox: _Outbox, deadline: asyncio.Timeout) -> Callable[[], None] | None:
    """While a write waits, look every :data:`PROGRESS_EVERY` seconds at what the connection holds unsent: when it
    went down, the browser reads, slowly, and the write's :data:`STALL` starts again (trial HM: a steady reader of
    30 KB/s was cut "took nothing for 60s" from an 8 MB event, the same at each reconnect). Without the
    connection's transport to look at (an ASGI server other than uvicorn), STALL is one write's time. Returns what
    stops the looking (once the write is over), or ``None``."""
    loop = outbox.loop
    transport = _found_transport(send, outbox)
    if transport is False:
        return None
    buffered = getattr(transport, "get_write_buffer_size", None)
    if buffered is None:
        return None
    sock = outbox.sock

    def size() -> int:
        # the transport's buffer and the socket's: the kernel takes more only once a third of its buffer is free,
        # so the transport's alone stays still for as long as a slow browser reads a megabyte (trial HO: steady
        # readers of 10 to 20 KB/s were still cut, "took nothing for 60s")
        return int(buffered()) + unsent_in_socket(sock)

    handle: asyncio.TimerHandle | None = None
    last = -1

    def look() -> None:
        nonlocal handle, last
        if outbox.writing is not deadline or deadline.expired():
            return
        with contextlib.suppress(Exception):
            now = size()
            if 0 <= now < last and not (outbox.ending or outbox.overflowed):
                _reschedule(deadline, loop.time() + STALL, later=True)
            last = now
        handle = loop.call_later(PROGRESS_EVERY, look)

    def stop() -> None:
        if handle is not None:
            handle.cancel()

    # (the first look only notes the size: most writes are over long before it, and none pays for a look)
    handle = loop.call_later(PROGRESS_EVERY, look)
    return stop


_UNFINISHED = "ASGI callable returned without completing response."
"""What uvicorn logs, at ERROR, for a response its application returned from before finishing it."""


class _UnfinishedFilter(logging.Filter):
    """Drops uvicorn's ERROR for a stream this module left unfinished on purpose (its browser took nothing: its
    own WARNING says so), one for each such stream, since an ASGI application cannot finish a response whose
    connection takes nothing, nor close that connection (trial FI: each looked like a bug of the application).
    uvicorn logs it as the application returns; one not logged then (the browser went away meanwhile) is not
    waited for past :data:`UNFINISHED_WITHIN` seconds, so that it cannot hide another route's."""

    def __init__(self) -> None:
        super().__init__()
        self.expected: collections.deque[float] = collections.deque(maxlen=64)  # until when each is expected

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.expected or record.msg != _UNFINISHED:
            return True
        now = time.monotonic()
        while self.expected and self.expected[0] < now:
            self.expected.popleft()
        if self.expected:
            self.expected.popleft()
            return False
        return True


UNFINISHED_WITHIN = 1.0
_unfinished: _UnfinishedFilter | None = None


def _left_unfinished() -> None:
    """Note that a stream returns now with its response unfinished, on purpose (uvicorn logs it right away)."""
    global _unfinished
    if _unfinished is None:
        _unfinished = _UnfinishedFilter()
        logging.getLogger("uvicorn.error").addFilter(_unfinished)
    _unfinished.expected.append(time.monotonic() + UNFINISHED_WITHIN)


async def _produce(producer: Producer, send: SendEvent, closed: asyncio.Event) -> None:
    result = producer(send, closed)
    if inspect.isawaitable(result):
        await result


async def _finish(task: asyncio.Task[None]) -> None:
    """Give the producer :data:`STOP_WITHIN` seconds to return, then cancel it; log what it raised."""
    if not task.done():
        done, _ = await asyncio.wait([task], timeout=STOP_WITHIN)
        if not done:
            log.warning("sse: the producer did not end within %gs of the browser leaving; cancelling it", STOP_WITHIN)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("sse: the producer raised %r; the stream ended", exc, exc_info=exc)


UNAVAILABLE_RETRY_MS = 5000
"""The reconnection delay a browser is given when its stream cannot open for now (the store is closed or
unreachable, or at its subscription limit)."""


def _wants_event_stream(scope: Scope) -> bool:
    """Whether the request asks for ``text/event-stream`` (an ``EventSource`` always does)."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"accept" and b"text/event-stream" in value.lower():
            return True
    return False


async def _ended_stream(send: Send, why: str) -> None:
    """A ``text/event-stream`` response that ends at once: the ``retry`` delay, and ``why`` as a comment."""
    comment = " ".join(why.split())  # (one line)
    body = f"retry: {UNAVAILABLE_RETRY_MS}\n: {comment}\n\n".encode()
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(UNAVAILABLE_RETRY_MS // 1000).encode()),
    ]
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode("utf-8")
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-cache"),
    ]
    if status == 503:
        headers.append((b"retry-after", b"5"))
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def sse_response(
    request: HTTPConnection,
    producer: Producer,
    *,
    keepalive: Duration = KEEPALIVE,
    retry: Duration | None = None,
    headers: Mapping[str, str] | None = None,
    max_pending: int = MAX_PENDING,
) -> EventSourceResponse:
    """Serve ``producer(send, closed)`` as a stream of server-sent events (WHATWG HTML "Server-sent events").

    ``send(data, event=None, id=None)``: ``data`` is anything JSON-encodable (dataclasses and msgspec Structs
    included), written as one ``data:`` line of JSON; see :class:`SendEvent`. ``closed``: an
    ``asyncio.Event`` set when the browser goes away (or the stream ends for another reason). The producer
    may be a coroutine function or return an awaitable: the stream lasts until it returns. For the seed's
    ``stream(chat_id, send, closed)``::

        return sse_response(request, lambda send, closed: stream(chat_id, send, closed))

    ``keepalive`` (a duration, 15 s): a comment line after that much silence. ``retry``: the browser's reconnection
    delay, sent after the opening ``: ok`` comment, before any event. ``headers``: extra response headers.
    ``max_pending``: bytes of events that may wait for the browser (:data:`MAX_PENDING`, 1 MiB; see
    :class:`EventSourceResponse`). After the
    browser went away the producer has :data:`STOP_WITHIN` seconds to return, then it is cancelled; an exception it
    raises is logged and ends the stream. ``request`` is the request being answered (its headers, such as
    ``Last-Event-ID``, are the producer's to read).

    Raises ``InvalidError`` for a ``request`` that is not a Starlette request or a ``producer`` that is not a
    function, a bad ``keepalive`` or ``retry``, ``headers`` that are not a mapping of str to str, and a
    ``max_pending`` that is not an int of 1 or more.
    """
    if not isinstance(request, HTTPConnection) or not callable(producer) or isinstance(producer, HTTPConnection):
        raise InvalidError(
            f"sse_response(request, producer): got {_kind(request)} and {_kind(producer)}; give the request "
            "first, then a function of (send, closed)"
        )
    # the response reads the disconnect from the ASGI receive channel it is called with
    return EventSourceResponse(producer, keepalive=keepalive, retry=retry, headers=headers, max_pending=max_pending)


def _kind(value: object) -> str:
    """What ``value`` is, for an error message: ``a Request``, ``a function``."""
    if inspect.isfunction(value) or inspect.ismethod(value):
        return "a function"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


# ---------------------------------------------------------------------------------------------- channels


EventName = str | Callable[["Message[Any]"], "str | None"] | None
T = TypeVar("T")

RING = 256
"""Messages a shared subscription keeps in this process, so that a browser reconnecting with a recent
``Last-Event-ID`` resumes from them and joins it again."""


class _Skipped:
    """In a shared subscription's ring, a message that did not decode as the channel's type: a stream that
    resumes across it gets it as missed (a ``reload`` of one), as the streams that were there did."""

    __slots__ = ("id",)

    def __init__(self, mid: str) -> None:
        self.id = mid


class _Shared:
    """One subscription to a branch, shared by every stream of this process that listens to the branch.

    Each message is encoded for each stream and queued without waiting: a stream whose browser has more than
    half its ``max_pending`` bytes waiting drops what follows and, once it caught up, gets one ``reload`` with
    the exact count (so one slow browser never holds the others back, and the store sees one subscriber).
    """

    def __init__(self, key: tuple[Any, ...], registry: dict[tuple[Any, ...], _Shared]) -> None:
        self.key = key
        self.registry = registry
        self.sub: Subscription[Any] | None = None
        self.streams: dict[_ChannelStream, None] = {}
        self.ring: collections.deque[Message[Any] | _Skipped] = collections.deque(maxlen=RING)
        self.position: str | None = None  # the id just before the next message this subscription handles
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closing = False

    async def open(self, branch: Channel[Any]) -> None:
        try:
            self.sub = await branch.subscribe(self.on_message, on_missed=self.on_missed, on_error=self.on_error)
            self.position = _position(self.sub)
        except BaseException as exc:
            if self.registry.get(self.key) is self:
                del self.registry[self.key]
            if isinstance(exc, Exception):
                self.ready.set_exception(exc)
                self.ready.exception()  # retrieved: the streams waiting for it raise it themselves
            else:
                self.ready.cancel()
            raise
        self.ready.set_result(None)

    @property
    def active(self) -> bool:
        return self.sub is not None and self.sub.active and not self.closing

    def on_message(self, m: Message[Any]) -> None:
        self.ring.append(m)
        self.position = m.id
        for stream in self.streams:
            stream.deliver(m)

    def on_error(self, exc: Exception) -> None:
        mid = _undecodable(exc, self.key[0])
        if mid is not None:
            self.ring.append(_Skipped(mid))  # (trial AV: a stream resuming from the ring went past it, uncounted)
            self.position = mid
            for stream in self.streams:
                stream.skip(mid)
        elif self.sub is not None and not self.sub.active:
            # the subscription ended with the store (gone from its path, or this client's token refused: trial
            # CX, its streams sent keep-alives for ever): each stream ends, and its browser reconnects after its
            # retry delay, to a subscription made anew (or to the error the app answers then)
            log.warning("sse: channel %s: the subscription ended: %s; ending its streams", self.key[0], exc)
            self.closing = True
            if self.registry.get(self.key) is self:
                del self.registry[self.key]
            for stream in list(self.streams):
                if stream.outbox is not None:
                    stream.outbox.end()

    def on_missed(self, missed: Missed) -> None:
        if missed.reason == "reconnect" and missed.count == 0:
            return  # the store's connection came back and nothing was lost
        self.ring.clear()
        self.position = _position(self.sub) if self.sub is not None else self.position
        for stream in self.streams:
            stream.missed_upstream(missed.reason, missed.count, self.position)

    def replay_after(self, last_id: str) -> list[Message[Any] | _Skipped] | None:
        """The messages after ``last_id``, when this process still holds them all; None when it does not."""
        if last_id == self.position:
            return []
        for i, m in enumerate(self.ring):
            if m.id == last_id:
                return list(self.ring)[i + 1 :]
        return None

    async def leave(self, stream: _ChannelStream) -> None:
        self.streams.pop(stream, None)
        if self.streams or self.closing:
            return
        self.closing = True  # streams that come now make a new one
        if self.registry.get(self.key) is self:
            del self.registry[self.key]
        if self.sub is not None:
            await self.sub.stop()


_shared: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _Shared]] = weakref.WeakKeyDictionary()


class _ChannelStream(EventSourceResponse):
    """The response of :func:`event_stream`: subscribes (or joins this process's subscription to the branch)
    before the headers go out."""

    def __init__(
        self,
        branch: Channel[Any],
        last_event_id: str | None,
        event: EventName,
        data: Callable[[Message[Any]], Any] | None,
        shared: bool,
        **kw: Any,
    ) -> None:
        super().__init__(None, **kw)
        self.branch = branch
        self.last_event_id = last_event_id
        self.event = event
        self.data = data
        self.shared = shared
        self.subscription: Subscription[Any] | None = None  # a subscription of its own (a resumed stream)
        self.hub: _Shared | None = None  # or the process's shared one
        self.outbox: _Outbox | None = None
        self.dropped = 0  # shared: messages dropped since the browser fell behind
        self.dropped_unknown = False  # shared: and some the subscription missed, how many not known
        self.last_dropped: str | None = None
        self.dropped_reason = "behind"  # what its reload will say, once it caught up

    # -- encoding, for both ways

    def encode(self, m: Message[Any]) -> bytes | None:
        """The event of ``m``; None (logged as an error saying why) when it cannot be sent: the ``event``
        function raised or returned something other than a str or None, the ``data`` function raised, or the
        value does not encode as JSON."""
        event = self.event
        try:
            name = event if event is None or isinstance(event, str) else event(m)
            if not isinstance(name, str | None):
                raise InvalidError(f"the event function returned {type(name).__name__}, not str")
            return encode_event(encode_json(m.value if self.data is None else self.data(m)), event=name, id=m.id)
        except Exception as exc:
            why = exc.message if isinstance(exc, InvalidError) else repr(exc)
            log.error("sse: channel %s: message %s cannot be sent: %s; sending reload", self.branch.name, m.id, why)
            return None

    def reload(self, reason: str, missed: int | None, position: str | None) -> asyncio.Future[None]:
        assert self.outbox is not None
        self.dropped = 0
        self.dropped_unknown = False
        self.dropped_reason = "behind"
        self.outbox.behind = False
        payload = {"kind": "reload", "reason": reason, "missed": missed}
        return self.outbox.put(encode_event(encode_json(payload), event="reload", id=position))

    # -- shared: called by the shared subscription, never waits

    def deliver(self, m: Message[Any]) -> None:
        outbox = self.outbox
        assert outbox is not None
        if outbox.behind:
            self.dropped += 1
            self.last_dropped = m.id
            return
        chunk = self.encode(m)
        if chunk is None:
            self.skip(m.id)
            return
        outbox.push(chunk)
        if outbox.size > outbox.limit // 2:  # the browser fell behind: drop what follows until it caught up
            outbox.behind = True
            outbox.on_drained = self.caught_up

    def skip(self, mid: str) -> None:
        """Message ``mid`` cannot be sent (it does not decode as the channel's type, or its ``event`` or ``data``
        function raised): it counts as missed, in a ``reload`` of its own (or in the one a stream that fell behind
        gets once it caught up), so that the counts stay exact."""
        assert self.outbox is not None
        if self.outbox.behind:
            self.dropped += 1
            self.last_dropped = mid
        else:
            self.reload("error", 1, mid)

    def missed_upstream(self, reason: str, count: int | None, position: str | None) -> None:
        """The shared subscription missed ``count`` messages (``None``: not known), up to ``position``: a
        ``reload`` now, or, for a stream behind, counted in the one it gets once it caught up (else that
        reload would forget the stream's own drops, and the browser be told of fewer than it missed)."""
        assert self.outbox is not None
        if not self.outbox.behind:
            self.reload(reason, count, position)
            return
        if count is None:
            self.dropped_unknown = True
        else:
            self.dropped += count
        self.dropped_reason = reason
        self.last_dropped = position

    def caught_up(self) -> None:
        if self.dropped or self.dropped_unknown:
            self.reload(self.dropped_reason, None if self.dropped_unknown else self.dropped, self.last_dropped)
        else:
            assert self.outbox is not None
            self.outbox.behind = False

    # -- opening and closing

    async def _open(self, outbox: _Outbox) -> Producer | None:
        self.outbox = outbox
        transport = self.branch.store.transport
        if not await transport.reached(UNREACHED_WAIT):
            # (trial IQ: a stream asked for while the store was stopped waited out the SDK's reconnect_timeout,
            # 30 s, with the browser's EventSource "connecting", before its 503)
            raise UnavailableError(
                f"the store was not reached within {UNREACHED_WAIT:g}s (stopped, restarting or unreachable); the "
                f"browser tries again in {UNAVAILABLE_RETRY_MS // 1000} s"
            )
        after, malformed = _parse_last_event_id(self.last_event_id)
        if self.shared:
            # a fresh stream makes (or joins) the shared subscription; a resumed one joins it only when this
            # process still holds what it missed, else it resumes from the store's log on its own
            hub = await self._hub() if after is None else self._existing_hub()
            replay = None if hub is None else hub.replay_after(after) if after is not None else []
            if hub is not None and replay is not None:
                # from here to the join nothing waits, so no message of the hub falls in between
                if malformed:
                    self.reload("malformed id", None, hub.position)
                for m in replay:
                    if isinstance(m, _Skipped):
                        self.skip(m.id)
                    else:
                        self.deliver(m)
                self.hub = hub
                hub.streams[self] = None
                return None
        await self._subscribe(outbox, after, malformed)
        return None

    def _existing_hub(self) -> _Shared | None:
        branch = self.branch
        hub = _shared.get(branch.store, {}).get((branch.name, branch.branch, branch.type))
        return hub if hub is not None and hub.ready.done() and hub.active else None

    async def _hub(self) -> _Shared:
        branch = self.branch
        registry = _shared.setdefault(branch.store, {})
        key = (branch.name, branch.branch, branch.type)
        while True:
            hub = registry.get(key)
            if hub is None:
                hub = registry[key] = _Shared(key, registry)
                await hub.open(branch)
                return hub
            try:
                await asyncio.shield(hub.ready)
            except asyncio.CancelledError:
                if not hub.ready.cancelled():
                    raise  # this request was cancelled
                continue  # the stream that was making it was cancelled: make another
            if hub.active:
                return hub
            if registry.get(key) is hub:
                del registry[key]

    async def _subscribe(self, outbox: _Outbox, after: str | None, malformed: bool) -> None:
        """A subscription of this stream's own, resuming after ``after``: the store's log has what it missed."""

        def on_message(m: Message[Any]) -> asyncio.Future[None] | None:
            chunk = self.encode(m)
            if chunk is None:
                return self.reload("error", 1, m.id)
            if outbox.push(chunk):
                # the browser is behind: take the next message once this one is out, and the browser has read
                # most of what its connection holds (trial IH: one that read nothing was given 64 KB more each
                # time the kernel took some, and a reload for what the log dropped meanwhile, 44 in a row)
                return outbox.settled()
            return None

        # a Last-Event-ID of an earlier run of the store: what the browser missed is not known because the store
        # restarted, and its reload says so (trial IH: "behind", which an app cannot tell from a slow tab)
        restarted = [after is not None and after.partition("-")[0] != str(self.branch.store.transport.epoch)]

        def on_missed(missed: Missed) -> asyncio.Future[None] | None:
            if missed.reason == "reconnect" and missed.count == 0:
                return None
            reason: str = missed.reason
            if restarted[0]:
                restarted[0] = False
                if missed.count is None:
                    reason = "restarted"
            return self.reload(reason, missed.count, _position(sub) if sub is not None else None)

        def on_error(exc: Exception) -> asyncio.Future[None] | None:
            mid = _undecodable(exc, self.branch.name)
            return None if mid is None else self.reload("error", 1, mid)

        sub: Subscription[Any] | None = None
        try:
            sub = await self.branch.subscribe(on_message, on_missed=on_missed, on_error=on_error, after=after)
        except InvalidError:
            if after is None:
                raise
            sub = await self.branch.subscribe(on_message, on_missed=on_missed, on_error=on_error)
            malformed = True
        self.subscription = sub
        if malformed:  # first in line: the subscription's task has not run yet
            self.reload("malformed id", None, _position(sub))

    def _alive(self) -> bool:
        # the store closed: end the stream, and the browser reconnects (to a process that has a store)
        if self.hub is not None:
            return self.hub.active
        return self.subscription is not None and self.subscription.active

    async def _close(self) -> None:
        if self.hub is not None:
            await self.hub.leave(self)
        if self.subscription is not None:
            await self.subscription.stop()


def _parse_last_event_id(value: str | None) -> tuple[str | None, bool]:
    """``(after, malformed)``: the message id to resume after, or None; malformed when an id was sent that is
    not ``"<epoch>-<seq>"``."""
    if value is None:
        return None, False
    value = value.strip()
    if not value:
        return None, False
    if _MESSAGE_ID.fullmatch(value):
        return value, False
    return None, True


def _undecodable(exc: Exception, where: object) -> str | None:
    """The id of the message ``exc`` (from a subscription's ``on_error``) says does not decode as the channel's
    type (a publisher without the type, such as ``tinystore channels publish``); ``None`` for another error."""
    mid = exc.extra.get("message_id") if isinstance(exc, TinystoreError) else None
    if not isinstance(mid, str):
        log.error("sse: channel %s: %r", where, exc)
        return None
    log.error("sse: %s; sending reload", exc)
    return mid


def _position(sub: Subscription[Any]) -> str | None:
    """The id just before the next message ``sub`` will be sent: where a browser that reloads resumes."""
    return sub.position


def event_stream(
    branch: Channel[T],
    request: HTTPConnection,
    keepalive: Duration = KEEPALIVE,
    event: str | Callable[[Message[T]], str | None] | None = None,
    *,
    data: Callable[[Message[T]], Any] | None = None,
    retry: Duration | None = None,
    headers: Mapping[str, str] | None = None,
    shared: bool = True,
) -> EventSourceResponse:
    """Serve a channel branch as server-sent events (WHATWG HTML "Server-sent events"), for ``EventSource``.

    ``branch``: a channel or one of its branches (``events.under(chat_id)``). ``request``: the request being
    answered (its ``Last-Event-ID`` header is read). ``event``: the event type of each message, a str or a
    function of the :class:`~tinystore.Message` (``lambda m: m.value.kind``); ``None``: ``message``.
    ``data``: a function of the message giving what to send (default ``m.value``), written as one ``data:``
    line of JSON. ``keepalive`` (a duration, 15 s): a comment line after that much silence. ``retry``: the
    browser's reconnection delay, sent after the opening ``: ok`` comment, before any event. ``headers``: extra
    response headers.

    Each message becomes an event whose ``id`` is the message's id (``"<epoch>-<seq>"``), in publish order.
    The streams of one branch in this process share one subscription (``shared=False``: each its own); it
    is made before the headers go out, and a store that is closed, unreachable or at its subscription limit
    gives a 503 with ``Retry-After`` (to an ``EventSource``, which ends for good at any status but 200, a stream
    that ends at once with a ``retry`` of 5 s, so it tries again then). A request with ``Last-Event-ID``
    resumes after that message (SSE-03): from this process's last :data:`RING` messages of the branch, or else
    from the branch's log in the store,
    with a subscription of its own. When it cannot be (the log dropped messages, the store restarted, the id
    is malformed), and whenever the stream misses messages later, the browser gets one event ``reload`` with
    data ``{"kind": "reload", "reason": ..., "missed": n | null}`` and, as its id, the position after which
    the stream goes on, so the next reconnect resumes there. Messages are missed when the browser falls
    behind (a shared stream with more than half of ``max_pending``, 512 KiB, waiting drops what follows, and
    its reload comes once it caught up; a stream of its own stops taking messages past 64 KiB, and the branch
    log drops them), or when the store's connection dropped and messages were lost meanwhile. ``n`` is
    exact: for every stream, the events delivered plus the counts of its reloads is the number of messages
    published after it opened. A slow browser never slows a publisher, nor the other streams. A message
    whose ``event`` or ``data`` function raises, or that does not decode as the channel's type (a publisher
    without the type), is logged and sent as a ``reload`` whose ``missed`` is 1.

    When the browser goes away, the stream leaves the shared subscription, which stops with its last stream,
    within :data:`STOP_WITHIN` seconds; nothing of it is left in the store (SSE-04). When the store closes,
    the stream ends at its next keep-alive tick and the browser reconnects. An ``event`` function that returns
    something other than a str or None for a message is logged (``the event function returned int, not str``)
    and that message is sent as such a ``reload``.

    Raises ``InvalidError`` for a ``branch`` that is not a channel or a ``request`` that is not a Starlette
    request, an ``event`` that is neither a str, a function nor None (naming ``event`` and the type given), an
    ``event`` str holding a line break, a ``data`` that is not a function (nor None), a bad ``keepalive`` or
    ``retry``, and ``headers`` that are not a mapping of str to str.
    """
    from .client.channels import Channel

    if not isinstance(branch, Channel) or not isinstance(request, HTTPConnection):
        raise InvalidError(
            f"event_stream(branch, request): got {_kind(branch)} and {_kind(request)}; give a channel's branch "
            "(events.under(chat_id)) first, then the request"
        )
    if isinstance(event, str):
        _check_field("event", event)
    elif event is not None and not callable(event):
        raise InvalidError(
            f"event_stream: event must be a str, a function of the message or None, got {_kind(event)} {event!r:.40}"
        )
    if data is not None and not callable(data):
        raise InvalidError(f"event_stream: data must be a function of the message or None, got {_kind(data)}")
    return _ChannelStream(
        branch,
        request.headers.get("last-event-id"),
        event,
        data,
        shared,
        keepalive=keepalive,
        retry=retry,
        headers=headers,
    )
