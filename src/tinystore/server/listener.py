"""Listeners: Unix and TCP/TLS sockets whose connections become sessions of a :class:`Core`.

Each connection runs the sans-I/O :class:`~tinystore.protocol.frames.Connection`. Flow control: a client
has at most ``max_inflight`` requests in flight (its request credit), and when the bytes waiting to be
written to a client pass the high-water mark the server stops reading from it until they drain, so a client
that stops reading cannot make the server buffer without bound. Pushes (channel deliveries) go to the
transport as soon as a megabyte of them waits, so the high-water mark sees them in the same loop turn, and
while it is passed the session is told it is full (:meth:`Session.full`): the channels engine then sends that
client nothing until the buffer drained (CHAN-08). A broken frame closes that one connection
with a reason (``GOAWAY``); other connections never notice (STORE-04).

A connection that has not finished its handshake (``HELLO``, and before it TLS's) within ``handshake_timeout``
(:data:`HANDSHAKE_TIMEOUT`) is closed with a reason and a log line, so peers that connect and say nothing cannot
hold the server's descriptors for ever; nothing of the store is reachable before the handshake (STORE-03).
The listeners accept connections themselves: when ``accept`` fails for want of descriptors they log it (once
a minute at most) and try again a moment later, leaving waiting clients in the backlog.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import hmac
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import CoroutineType
from typing import Any

import msgspec

from .. import __version__
from ..durations import format_seconds
from ..engines.descriptors import open_files_limit, room_to_accept
from ..engines.sql import Later, SqlTx
from ..engines.sql_text import may_return_rows
from ..errors import (
    ClosedError,
    InvalidError,
    ProtocolError,
    TinystoreError,
    UnauthenticatedError,
    UnavailableError,
)
from ..protocol import frames
from ..protocol.frames import TOKEN_MAX, Kind
from ..protocol.messages import (
    COMMAND_LINE,
    ErrorBody,
    GoAway,
    Hello,
    Welcome,
    decode,
    decoder_for,
    encode,
    encode_answer,
    encode_escaping,
    escaped,
)
from ..protocol.sql import too_many_params
from ..protocol.store import Empty
from ..socket_queue import unsent_in_socket
from .core import Core, Method, Session, error_of
from .dirlock import close_in_child, keep_in_child

log = logging.getLogger("tinystore.server")

HIGH_WATER = 8 * 1024 * 1024
LOW_WATER = 1024 * 1024
TLS_PIECE = 64 * 1024
"""The most a TLS connection's write hands its transport at once (see ``ServerConnection.write_tls``)."""
TLS_HIGH_WATER = 256 * 1024
"""A TLS connection's high-water mark (HIGH_WATER's, for TLS): past it, what it is sent waits in ``out`` (see
``ServerConnection.write_tls``)."""
# a connection's cancelled writes that still run (a write cannot be taken back, and its request credit is back at
# the cancel): at this many bytes of their requests, the connection's next requests are not read until they are
# down to ORPHANS_LOW (each counts its body and ORPHAN_COST more)
ORPHANS_HIGH = 32 * 1024 * 1024
ORPHANS_LOW = 8 * 1024 * 1024
ORPHAN_COST = 512
# a connection's requests of at least BIG_BODY bytes that are read and not yet answered: at INFLIGHT_HIGH bytes of
# them its next requests wait unread until they are down to INFLIGHT_LOW (its request credit alone would let it
# have 1,024 requests of the frame limit, 16 GiB, in the server's memory)
BIG_BODY = 64 * 1024
# Calls whose answers may be large: a connection has at most a line's ``most`` of them under way (on a reader
# thread, the writer, a task), and none starts while its answers wait unwritten (``paused``): the rest wait in
# their line, in order, as requests, so a client that sends many big calls and stops reading cannot make the
# server hold all their answers (trial AO: 1,024 answers of 8 MB, past 4 GB). Three lines, so that no call waits
# behind one that waits for it:
# - reads outside a transaction (BOUNDED_READS), READS_MAX of them: they wait for nothing else;
# - ``sql.exec`` outside a transaction whose statement may answer with rows (``may_return_rows``: a RETURNING, a
#   SELECT), EXECS_MAX: they wait for the writer, which a transaction of the same connection may hold while its
#   own next call is a read (sharing the reads' line, that read waited behind them until the transaction timed
#   out: trial AP); a plain INSERT, UPDATE or DELETE is in no line (two numbers for an answer, and a
#   connection's writes must reach the writer together to share a commit: EXECS_MAX of these share one too);
# - the calls of transactions (``tx``) that may answer with rows, READS_MAX: they run one after another on their
#   transaction; while some wait, every call of a transaction waits behind them, so that a transaction's calls
#   run in the order they came (its commit after its reads). A transaction whose call waits here is not idle
#   (``SqlTx.held``): its tx_idle does not run out while its client's other calls are slow (trial AR).
# An exec of the execs' line on a database whose writer a transaction of the same connection holds cannot run
# before that transaction ends: it is kept aside (``parked``), taking no place in the line, until it ends, so that
# the transaction's own next calls (on another database) do not wait behind it (trial AR). And when execs under
# way in the line wait for a writer a transaction of the same connection holds (sent before it began), a call
# that finds the line full is let past it (``bypass``, READS_MAX at most), so that the transaction's own call
# is not held until tx_idle (trial AW; keeping execs aside while a transaction began starved them: trial AY); execs
# that would wait there for another connection's transaction take at most half of it (trial BA: they took it all).
BOUNDED_READS = frozenset({"sql.query", "jobs.list", "jobs.get", "jobs.find"})
_WITH_PARAMS = frozenset({"sql.exec", "sql.query"})
"""The methods whose body holds a statement's parameters (see ``protocol.sql.too_many_params``)."""
READS_MAX = 8
BYPASS_HELD_MAX = READS_MAX // 2
EXECS_MAX = 32
INFLIGHT_HIGH = 64 * 1024 * 1024
INFLIGHT_LOW = 16 * 1024 * 1024
_join = b"".join
OUT_OF_MEMORY = (
    "the answer could not be made: the server is out of memory (try again later, or read fewer rows or bytes at once)"
)
CHUNK = 1 << 20  # a response body past this many bytes goes out in several frames (flag MORE)
# While a burst of requests read at once is being answered, the answers made so far go out every this many:
# the client works on them while the server computes the rest (the two processes overlap instead of taking
# turns; twice the point reads a second with 32 callers when a second core is free). Answers that come later
# (writes, from the writer's batch) go out together, so that the next group commit is as large.
BURST = 8

#: seconds a new connection has to finish its handshake (TLS's, then HELLO) before it is closed
HANDSHAKE_TIMEOUT = 10.0
#: seconds a connection may send nothing (while the server reads it) before it is taken for a peer the network cut
#: off without a close, and dropped with what it held: its subscriptions, its place in a lock's line, its
#: transactions (trial BN: such a waiter was given the key for its whole ttl). The SDK sends a ping after 15 s
#: of silence either way (``RemoteTransport.keepalive_idle``).
PEER_SILENCE = 60.0
#: at a stop, a connection told GOAWAY is half-closed and still read (what comes is dropped) for at most this many
#: seconds, until its client closes it (RFC 9112's "tear-down": the lingering close): closed at once, a request the
#: client wrote meanwhile failed (EPIPE over a Unix socket; over TCP the unread bytes turn the close into a reset)
#: before its SDK read the GOAWAY, which took every pending write for one that may have committed (trial BS)
LINGER = 2.0
#: seconds a stop waits, past its grace, for the calls whose statements it interrupted (``SqlEngine.cut_calls``) to be
#: answered before it closes their connections: an interrupt ends a statement within some 10,000 SQLite instructions
CUT_ANSWER = 1.0
#: while the server holds a connection's requests back unread (too many bytes of its big requests, or of its
#: cancelled writes, still under way), it pushes ``store.alive`` to it every this many seconds: the SDK's
#: keep-alive ping waits unread too, and unanswered it took the server for frozen and dropped the connection,
#: every write pending with it (trial BS). A third of the SDK's 15 s of silence before its ping
ALIVE_EVERY = 5.0
ALIVE = "store.alive"
#: connections of one listener that may wait for their handshake at once: past it, the one that has waited
#: longest is closed (a client with a token finishes in milliseconds; peers that send nothing cannot crowd it out)
MAX_HANDSHAKING = 256
BACKLOG = 1024
#: when ``accept`` fails for want of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM), accept again after this long
ACCEPT_PAUSE = 0.5
#: a message that could repeat many times a second (a failing accept, silent peers) is logged once a minute at most
LOG_EVERY = 60.0
_NO_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_REQUEST = Kind.REQUEST
_UNREAD = frames.UNREAD
_Future = asyncio.Future


class RateLimitedLog:
    """A warning logged at most once every ``every`` seconds, saying how often it happened in between (one of
    these per kind of event: the count it adds is of that event only)."""

    def __init__(self, every: float = LOG_EVERY) -> None:
        self.every = every
        self.last = -float("inf")
        self.skipped = 0
        self.latest: tuple[str, tuple[Any, ...]] | None = None  # the last one not logged
        self.timer: asyncio.TimerHandle | None = None

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            self.skipped += 1
            self.latest = (message, args)
            if self.timer is None:
                # a burst, then quiet: its count is told at the end of the minute all the same (trial FK: it was
                # told only if one more came after the minute)
                with contextlib.suppress(RuntimeError):  # (no running loop: told with the next one)
                    self.timer = asyncio.get_running_loop().call_later(self.last + self.every - now, self.flush)
            return
        self.log(message, args, now)

    def log(self, message: str, args: tuple[Any, ...], now: float) -> None:
        if self.skipped:
            message += f" (and {self.skipped} more times in the last {now - self.last:.0f}s)"
        self.last, self.skipped, self.latest = now, 0, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        log.warning(message, *args)

    def flush(self) -> None:
        """At the end of a minute with events not logged: the last of them, with their count."""
        self.timer = None
        if self.latest is not None and self.skipped:
            message, args = self.latest
            self.skipped -= 1  # (the one logged now is not one "more")
            self.log(message, args, time.monotonic())


#: the shortest token a tokens file may hold
MIN_TOKEN = 16


def load_tokens(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a tokens file: one ``<capability> <token>`` a line (``admin`` or ``data``); a word that starts with
    ``#`` starts a comment, to the end of its line.

    Returns token → capability. Raises ``InvalidError`` when the file cannot be read (missing, unreadable, not
    UTF-8), holds no token (a TCP listener would refuse every client), or has a wrong line: not two words, an
    unknown capability, a token shorter than :data:`MIN_TOKEN` characters or longer than
    :data:`~tinystore.protocol.frames.TOKEN_MAX` bytes, a token already on another line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidError(f"tokens file {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InvalidError(f"tokens file {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InvalidError(f"tokens file {path}: cannot be read: {exc.strerror or exc}") from None
    text = text.removeprefix("\ufeff")  # (a byte order mark, as some editors write: trial AX)
    tokens: dict[str, str] = {}
    lines: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        for i, word in enumerate(parts):
            if word.startswith("#"):  # a comment runs to the end of the line
                del parts[i:]
                break
        if not parts:
            continue
        if parts[0] not in ("admin", "data"):
            raise InvalidError(
                f"tokens file {path}: line {n}: expected '<admin|data> <token>'; its first word is neither admin "
                "nor data"
            )
        if len(parts) != 2:
            raise InvalidError(
                f"tokens file {path}: line {n}: expected '<admin|data> <token>', found {len(parts)} "
                f"word{'s' if len(parts) > 1 else ''} (a word that starts with '#' starts a comment)"
            )
        if len(parts[1]) < MIN_TOKEN:
            raise InvalidError(f"tokens file {path}: line {n}: a token needs at least {MIN_TOKEN} characters")
        if len(parts[1].encode()) > TOKEN_MAX:
            raise InvalidError(
                f"tokens file {path}: line {n}: a token of {len(parts[1].encode())} bytes; a token holds at most "
                f"{TOKEN_MAX} bytes (UTF-8)"
            )
        if parts[1] in lines:
            raise InvalidError(
                f"tokens file {path}: line {n}: the token of line {lines[parts[1]]} again; give each client its "
                "own token, on one line"
            )
        tokens[parts[1]] = parts[0]
        lines[parts[1]] = n
    if not tokens:
        raise InvalidError(
            f"tokens file {path}: no token in it (one '<admin|data> <token>' a line): the listener would refuse "
            "every client"
        )
    return tokens


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


class _Line:
    """A line of calls whose answers may be large (see :data:`BOUNDED_READS`): at most ``most`` ``running``, the
    rest ``waiting`` as ``(stream, name, request, size, rows)``."""

    __slots__ = ("most", "running", "waiting")

    def __init__(self, most: int) -> None:
        self.most = most
        self.running: set[int] = set()
        self.waiting: collections.deque[tuple[int, str, Any, int, bool]] = collections.deque()


class ServerConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(
        self, listener: Listener, accepted: float = 0.0, task: asyncio.Task[Any] | None = None, kept: bool = False
    ) -> None:
        self.listener = listener
        # accepted on a descriptor kept for the command line (see Listener._accept): let in only if it is one
        self.kept = kept
        self.accepted = accepted  # when the socket was accepted (loop time): the oldest is crowded out first
        self.task = task  # what made the connection (its TLS handshake): done with once the connection is made
        self.heard = False  # whether any byte came yet
        self.core = listener.core
        self.conn = frames.Connection("server", max_body=self.core.limits.frame_body_bytes)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.undos: dict[int, Callable[[Any, Any], None]] = {}  # stream → its method's undo (Method.undo)
        self.laters: dict[int, tuple[Later, int]] = {}  # stream → the write, its request's size
        self.orphans: dict[Later, int] = {}  # cancelled writes still to run → their request's size
        self.orphan_bytes = 0
        self.closing = False
        self.last_stream = 0  # the highest stream of a request read (told in the GOAWAY)
        self.last_rx = self.loop.time()  # when bytes last came from the client (see PEER_SILENCE)
        self.instance = ""  # the SDK transport whose connection this is (see supersede)
        self.number = 0  # which connection of that transport (Hello.connection)
        self.linger: asyncio.TimerHandle | None = None  # the end of its lingering close (see LINGER)
        self.alive: asyncio.TimerHandle | None = None  # the next store.alive while it is not read (ALIVE_EVERY)
        self.paused = False  # the client does not read what we write
        self.budget = self.core.output_budget  # what all connections hold unsent (see output_budget)
        self.unsent = 0  # what was last noted there for this connection (0: nothing)
        self.written = 0  # bytes handed to the transport in all (see taken)
        self.sock: socket.socket | None = None  # (see taken)
        self.tls = False  # (see write_tls)
        self.held = False  # too many cancelled writes of this connection still run
        self.big: dict[int, int] = {}  # stream → size, of the big requests read and not yet answered
        self.big_bytes = 0
        self.loaded = False  # too many bytes of big requests under way
        self.not_reading = False  # whether the transport's reading is paused (see steer_reading)
        self.reads = _Line(READS_MAX)  # the lines of calls whose answers may be large (see BOUNDED_READS)
        self.execs = _Line(EXECS_MAX)
        self.txs = _Line(READS_MAX)
        self.lines = (self.reads, self.execs, self.txs)
        self.line_of: dict[int, _Line] = {}  # stream → the line it is under way in
        # execs kept out of their line while a transaction of this connection holds their database's writer
        self.parked: list[tuple[int, str, Any, int, bool]] = []
        self.tx_held: dict[int, int] = {}  # transaction id → its calls waiting in the transactions' line
        self.bypass_db: dict[int, str] = {}  # stream → the database of an exec under way past the execs' line
        # execs let past a full execs' line because what fills it waits for a transaction of this connection
        self.bypass = _Line(READS_MAX)
        self.bypass_held: set[int] = set()  # execs past the line that wait for a transaction (see may_bypass)
        self.bypass_to: SqlTx | None = None  # the transaction the exec let past now waits for, if any
        self.out: list[bytes | memoryview] = []  # (memoryview: the rest of an answer a TLS pause cut, see write_tls)
        self.pushed = 0  # bytes of pushes in out
        self.flush_scheduled = False
        self.receiving = False  # inside data_received: what is written goes out once it returns
        self.decoders = listener.decoders
        self.deadline: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.tls = self.listener.ssl_context is not None
        if self.tls:
            transport.set_write_buffer_limits(TLS_HIGH_WATER, TLS_HIGH_WATER // 4)  # type: ignore[attr-defined]
        else:
            transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]
        self.sock = transport.get_extra_info("socket")
        self.listener.connections.add(self)
        self.listener.touch()
        if self.task is not None:
            self.listener.starting.pop(self.task, None)  # its TLS handshake is done: it waits for the HELLO now
        if self.session is None:
            self.deadline = self.loop.call_later(self.listener.handshake_timeout, self.handshake_expired)
            self.listener.handshaking[self] = None
            self.listener.crowd()

    def crowded_out(self) -> None:
        """More connections wait for their handshake than the listener allows: this one waited longest."""
        self.listener.handshaking.pop(self, None)
        self.listener.silent_log("crowded").warning(
            "%s: closed a connection%s that had not finished its handshake: over %d connections were waiting for "
            "theirs",
            self.listener.description,
            self.peer_text(),  # (trial FQ: the other lines about a peer name it)
            self.listener.max_handshaking,
        )
        # (crowded: the SDK tries again, with backoff, within its reconnect_timeout)
        self.refuse(UnavailableError.code, "too many connections are waiting for their handshake", crowded=True)

    def supersede(self, instance: str) -> None:
        """This connection is the SDK transport ``instance``'s new one: its connection before, if the server still
        has it, was cut off by the network without a close (the SDK has one at a time), and ends now with what it
        held, before the client's first calls on this one (trial BR: its place in a lock's line got the key, for
        the lease's whole ttl, while the client asked again here)."""
        instances = self.core.instances
        old = instances.get(instance)
        instances[instance] = self
        self.instance = instance
        if old is not None and old is not self and not old.closing and old.transport is not None:
            log.info(
                "%s: a client's new connection ends its one before, which the network cut off",
                self.listener.description,
            )
            old.closing = True
            old.transport.abort()
            if old.number:  # (nothing more of it is read: its requests after the last one read never run)
                self.core.read_fact(instance, old.number, old.last_stream)

    def check_silence(self) -> None:
        """Drop the connection when the client sent nothing for :data:`PEER_SILENCE` seconds while it was read:
        a live client sends a ping sooner. Closed by an abort: a peer that is gone takes no unsent bytes, and a
        close would wait for them. The time this check came late by is not the client's silence: this server did
        not run then (stopped with SIGSTOP, its loop blocked), and what the client sent meanwhile may wait unread
        (trial GO: a server frozen 75 s dropped its clients as it woke, blaming them)."""
        deadline, self.deadline = self.deadline, None
        if self.closing or self.transport is None:
            return
        now = self.loop.time()
        if deadline is not None and now > deadline.when():
            self.last_rx = min(now, self.last_rx + (now - deadline.when()))
        if self.not_reading:
            self.last_rx = now  # (not read: its silence is not its own)
        silent = now - self.last_rx
        if silent < PEER_SILENCE:
            wait = min(PEER_SILENCE - silent, PEER_SILENCE / 4) + 0.01
            self.deadline = self.loop.call_later(wait, self.check_silence)
            return
        self.listener.silent_log("silent").warning(
            "%s: dropped a connection that sent nothing for %.0fs (taken for a peer the network cut off)",
            self.listener.description,
            silent,
        )
        self.closing = True
        self.transport.abort()

    def handshake_expired(self) -> None:
        """No handshake within the listener's ``handshake_timeout``: close the connection, saying why."""
        deadline, self.deadline = self.deadline, None
        if self.session is not None or self.closing:
            return
        if deadline is not None and self.loop.time() - deadline.when() > 0.5:
            # the loop was busy past the deadline (libuv runs timers before reading sockets): a HELLO may be
            # waiting unread; read it first, and close only if none came
            self.deadline = self.loop.call_later(0.5, self.handshake_expired)
            return
        timeout = self.listener.handshake_timeout
        self.listener.silent_log("expired").warning(
            "%s: closed a connection%s that did not finish its handshake within %gs",
            self.listener.description,
            self.peer_text(),
            timeout,
        )
        self.refuse(UnavailableError.code, f"no handshake within {timeout:g}s: the connection is closed")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_rx = self.loop.time()
        if not self.heard:
            self.heard = True
            if data[:2] == b"\x16\x03" and self.listener.ssl_context is None:
                # the first bytes of a TLS ClientHello (a record of type handshake, version 3.x): no frame starts
                # so (its length would be hundreds of MB)
                self.listener.silent_log("tls-at-plain").warning(
                    "%s: closed a connection of a TLS client at a plain listener (the client should connect with "
                    "tcp://, or the server listen with tls://)",
                    self.listener.description,
                )
                self.close("TLS spoken to a plain listener: use tcp://, or serve tls://", "invalid")
                return
        conn = self.conn
        self.receiving = True
        try:
            conn.receive_data(data)
            while not self.closing:
                batch = conn.next_frames()
                if not batch:
                    break
                for kind, flags, stream, method, body in batch:
                    if flags & _UNREAD:
                        self.unread(kind, stream, method)
                    elif kind is _REQUEST:
                        if stream > self.last_stream:
                            self.last_stream = stream
                        self.on_request(stream, method, body)
                    else:
                        self.on_frame(kind, stream, body)
                    if self.closing:
                        break
        except ProtocolError as exc:
            self.close(exc.message, "protocol")
        except MemoryError:
            # no memory to take in what came (the bytes of a big request, before its frame was whole): the
            # connection is closed, saying which requests were read; the SDK sends the others again, once (trial EH,
            # EJ: a traceback each time, and sent again for ever)
            self.listener.silent_log("memory").warning(
                "%s: out of memory reading what a client sent: its connection is closed", self.listener.description
            )
            self.close(
                "the server is out of memory: what this client sent could not be read", "out_of_memory", said_read=True
            )
        except Exception as exc:
            log.exception("connection error")
            self.close(f"internal error: {exc}", "internal")
        finally:
            self.receiving = False
            # the answers of this read go out in one write, now (not a loop turn later)
            if self.out:
                self.flush()

    def unread(self, kind: Kind, stream: int, method: str) -> None:
        """A frame whose body this process had no memory to hold (``frames.UNREAD``): a request is answered with an
        error (it was not run; trial EH: the connection was dropped, and its client sent it again, for ever), and
        the connection goes on; any other frame closes it."""
        self.listener.silent_log("memory").warning(
            "%s: out of memory reading a request (%s): it was refused", self.listener.description, method or kind.name
        )
        if kind is not _REQUEST:
            self.close("the server is out of memory: what this client sent could not be read", "unavailable")
            return
        if stream > self.last_stream:
            self.last_stream = stream
        self.send_error(
            stream,
            UnavailableError(
                f"{method}: the server is out of memory: the request could not be read, and was not run (try again "
                "later, or send less at once)"
            ),
        )

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        ended_by_peer = not self.closing  # (not closed by this server: a refusal, a stop, a newer connection)
        self.closing = True
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        if self.alive is not None:
            self.alive.cancel()
            self.alive = None
        if self.instance and self.core.instances.get(self.instance) is self:
            del self.core.instances[self.instance]
            if ended_by_peer and self.number and self.session is not None:
                # nothing more of it is read: its client's next connection learns which of its requests were
                # never read, sent again then (trial DZ: a network cut the server saw first noted nothing, and an
                # unread write was OutcomeUnknownError)
                self.core.read_fact(self.instance, self.number, self.last_stream)
        self.conn.discard()  # a part of a frame (up to 16 MiB) goes now, not at the next full collection
        for tx_id in self.tx_held:
            self.sync_held(tx_id)  # (closing: none held any more)
        self.tx_held.clear()
        for line in self.lines:
            line.waiting.clear()  # (requests not begun, and their bodies)
        self.parked.clear()
        self.bypass_db.clear()
        self.bypass_held.clear()
        self.out.clear()
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.listener.handshaking.pop(self, None)
        self.listener.connections.discard(self)
        if self.kept:
            self.kept = False
            self.listener.kept_freed()
        self.budget.forget(self)
        self.listener.touch()
        tasks, self.tasks = self.tasks, {}
        futures, self.futures = self.futures, {}
        for task in tasks.values():
            task.cancel()
        for fut in futures.values():
            fut.cancel()  # nobody is left to answer: what waits for a result stops waiting
        if self.session is not None:
            self.session.close()

    def steer_reading(self) -> None:
        """Read the client's requests unless its answers wait unwritten (``paused``), too many of its cancelled
        writes still run (``held``) or too many bytes of its big requests are under way (``loaded``)."""
        transport = self.transport
        if transport is None or self.closing:
            return
        stop = self.paused or self.held or self.loaded
        if stop != self.not_reading:
            self.not_reading = stop
            if stop:
                transport.pause_reading()
            else:
                transport.resume_reading()
        if stop and not self.paused:
            if self.alive is None:
                self.alive = self.loop.call_later(ALIVE_EVERY, self.say_alive)
        elif self.alive is not None:
            self.alive.cancel()
            self.alive = None

    def say_alive(self) -> None:
        """Its requests are held back unread: tell the client the server is alive (see ALIVE_EVERY)."""
        self.alive = None
        if self.closing or self.paused or not self.not_reading:
            return
        self.push(ALIVE, Empty())
        self.flush()
        self.alive = self.loop.call_later(ALIVE_EVERY, self.say_alive)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.unsent = self.transport.get_write_buffer_size()
            self.budget.note(self, self.unsent, shed=False)  # (see note)
        if self.transport is not None and not self.paused:
            self.paused = True
            self.steer_reading()
            if self.session is not None:
                self.session.full(True)
            for tx_id in self.tx_held:
                self.sync_held(tx_id)

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.unsent = self.transport.get_write_buffer_size()
            self.budget.note(self, self.unsent, shed=False)  # (see note)
        if self.transport is not None and self.paused:
            self.paused = False
            if self.tls and self.out:
                self.flush()
            self.steer_reading()
            if self.session is not None and not self.closing:
                self.session.full(False)
            for tx_id in self.tx_held:
                self.sync_held(tx_id)
            self.pump_lines()

    # -- frames ------------------------------------------------------------------------------------

    def on_frame(self, kind: Kind, stream: int, body: bytes) -> None:
        if kind is Kind.HELLO:
            self.on_hello(body)
        elif kind is Kind.CANCEL:
            self.cancel(stream)
        elif kind is Kind.GOAWAY:
            self.close("the client said goodbye", "closed", notify=False)

    def on_hello(self, raw: bytes) -> None:
        try:
            hello = decode(raw, Hello)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"bad HELLO: {exc}") from None
        if hello.version != frames.PROTOCOL_VERSION:
            self.refuse(
                "unavailable",
                f"protocol version {hello.version} is not served here (this server speaks "
                f"{frames.PROTOCOL_VERSION}, tinystore {__version__})",
            )
            return
        if self.kept and not hello.client.startswith(COMMAND_LINE):
            # (a client past the descriptors a server gives connections, on one it keeps for the command line: it
            # tries again with backoff, as a client crowded out does, and `tinystore status` and `stop` get in past
            # the clients that wait: trial IK, unix clients took those kept beside a TCP listener)
            self.refuse(
                UnavailableError.code,
                "the server's descriptors are all in use (its last few are kept for the command line)",
                crowded=True,
                descriptors=True,
            )
            return
        capability = "admin"
        if self.listener.tokens is not None:
            capability = ""
            for token, cap in self.listener.tokens.items():
                if hmac.compare_digest(token.encode(), hello.token.encode()):
                    capability = cap
            if not capability:
                # logged (trial FK: an operator saw nothing of a client left with a revoked token, nor of guesses),
                # once a minute at most, with how often in between; never the token itself
                self.listener.silent_log("token").warning(
                    "%s: refused a client%s: %s",
                    self.listener.description,
                    self.peer_text(),
                    "its token is none of the --tokens file's" if hello.token else "it gave no token",
                )
                # (trial DH: "missing or wrong" left a client that gave none to guess which)
                self.refuse(
                    UnauthenticatedError.code,
                    "the token is wrong: it is none of the server's (its --tokens file)"
                    if hello.token
                    else "no token was given, and this server asks for one (pass token=, one of the "
                    "tokens in its --tokens file)",
                )
                return
        try:
            self.session = self.core.new_session(self.push, local=False, capability=capability, name=hello.client)
        except ClosedError as exc:
            self.refuse("unavailable", exc.message)
            return
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(PEER_SILENCE / 4, self.check_silence)
        reads: list[tuple[int, int, int]] = []
        if hello.instance:
            self.number = hello.connection
            self.supersede(hello.instance)
            reads = self.core.read_facts.get(hello.instance, [])
        self.listener.handshaking.pop(self, None)
        body = encode(
            Welcome(
                version=frames.PROTOCOL_VERSION,
                server_version=__version__,
                epoch=self.core.epoch,
                capability=capability,
                max_inflight=self.conn.max_inflight,
                max_body=self.conn.max_body,
                pid=os.getpid(),
                test_clock=self.core.clock.is_test,
                limits=self.core.limits_json,
                durability=self.core.durability,
                last_reads=reads,
                store=self.core.store_id,
            )
        )
        self.write(self.conn.send_welcome(body))

    def peer_text(self) -> str:
        """`` from HOST:PORT`` of the peer (``[::1]:PORT`` for IPv6; TCP, TLS), or ``""`` (a Unix socket's peer has
        no address)."""
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            return f" from [{host}]:{peer[1]}" if ":" in host else f" from {host}:{peer[1]}"
        return f" from {peer}" if peer else ""

    def refuse(self, code: str, message: str, **extra: Any) -> None:
        """Refuse the handshake: an ``ERROR`` of ``code`` (with ``message`` and ``extra``), then close."""
        self.write(self.conn.send_error(0, encode_escaping(ErrorBody(code=code, message=message, extra=extra))))
        self.closing = True
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def on_request(self, stream: int, name: str, body: bytes) -> None:
        session = self.session
        assert session is not None
        core = self.core
        if core.stopping.is_set() and name != "store.stop":
            # no new calls once stopping (STORE-05); ``refused`` tells the SDK it was not run, so it may
            # send it again to the next server
            self.send_error(
                stream,
                UnavailableError(f"store {core.directory} is stopping: {name} was not run", refused=True),
            )
            return
        try:
            entry = self.decoders.get(name)
            if entry is None:
                entry = self.listener.decoder(name)
            try:
                req = entry[1](body)
            except msgspec.ValidationError as exc:
                told = too_many_params(body) if name in _WITH_PARAMS else None
                raise InvalidError(told or f"{name}: {exc}") from None
            except msgspec.DecodeError as exc:
                raise InvalidError(f"{name}: the body is not valid MessagePack: {exc}") from None
            except RecursionError:
                raise InvalidError(f"{name}: the body nests too deeply to be read") from None
        except BaseException as exc:
            self.send_error(stream, exc)
            return
        rows = name in BOUNDED_READS or (name == "sql.exec" and may_return_rows(req.sql))
        if getattr(req, "tx", 0):
            # a transaction's call: one that may answer with rows waits in the transactions' line while the
            # client does not read; any call waits behind those waiting there (see BOUNDED_READS)
            line = self.txs
            if line.waiting or (rows and (self.paused or len(line.running) >= line.most)):
                item = (stream, name, req, len(body), rows)
                line.waiting.append(item)
                self.hold(item)
            else:
                self.start(line if rows else None, stream, name, req, len(body))
            return
        if rows:
            item = (stream, name, req, len(body), True)
            if name == "sql.exec":
                line = self.execs
                # (behind an exec of its database still waiting in the line, it waits there too: a connection's
                # execs on one database run in the order sent, trial BH)
                before = self.waits_in_line(req.db)
                if not before and self.park(item):
                    return
            else:
                line = self.reads
                before = False
            if line.waiting or self.paused or len(line.running) >= line.most:
                if line is self.execs and not before and not self.paused and self.may_bypass(req.db):
                    self.start(self.bypass, stream, name, req, len(body))
                    return
                line.waiting.append(item)
                if before and line is self.execs and not self.paused and self.stuck_behind_own():
                    # the exec of its database ahead of it came before the line was stuck: they go past it now, in
                    # order (trial BI: nothing looked at the line again, and this one waited until tx_idle)
                    self.bypass_behind_head()
                return
            self.start(line, stream, name, req, len(body))
        elif name == "sql.exec" and (self.waits_in_line(req.db) or any(p[2].db == req.db for p in self.parked)):
            # an exec without rows behind one of its database that waits (in the line, or kept aside): it waits
            # behind it, in no line's count (trial BR: run at once, it committed before the one sent first)
            item = (stream, name, req, len(body), False)
            if not self.park(item):
                self.execs.waiting.append(item)
        else:
            self.run(stream, name, req, len(body))

    def start(self, line: _Line | None, stream: int, name: str, req: Any, size: int) -> None:
        """:meth:`run`, counted in ``line`` while under way."""
        self.run(stream, name, req, size)
        if line is not None and (stream in self.tasks or stream in self.futures or stream in self.laters):
            line.running.add(stream)
            self.line_of[stream] = line
            if line is self.bypass:
                self.bypass_db[stream] = req.db
                if self.bypass_to is not None:
                    self.bypass_held.add(stream)  # (it waits for a transaction: see may_bypass)
        self.bypass_to = None

    def run(self, stream: int, name: str, req: Any, size: int) -> None:
        """Call method ``name`` for ``stream`` and see to its answer."""
        session = self.session
        assert session is not None
        try:
            result = self.core.invoke(session, name, req)
        except BaseException as exc:
            self.send_error(stream, exc)
            return
        if type(result) is Later:
            self.laters[stream] = (result, size)
            if size >= BIG_BODY and not result.done():
                self.big_started(stream, size)
            result.then(partial(self.answer, stream, result))
        elif isinstance(result, _Future):
            if result.done():
                self.settle(stream, result)
            else:
                self.futures[stream] = result
                if size >= BIG_BODY:
                    self.big_started(stream, size)
                result.add_done_callback(partial(self.finish, stream))
        elif type(result) is CoroutineType:
            task = asyncio.ensure_future(result)
            self.tasks[stream] = task
            undo = self.core.methods[name].undo
            if undo is not None:
                self.undos[stream] = undo
            if size >= BIG_BODY:
                self.big_started(stream, size)
            task.add_done_callback(partial(self.finish, stream))
        else:
            self.send_result(stream, result)

    def pump_lines(self) -> None:
        """Begin the calls that wait in each line, in order, while the client reads its answers and few enough
        are under way (a call that answers with no rows, in the transactions' line, is not counted)."""
        for line in self.lines:
            waiting = line.waiting
            while waiting and not self.paused and not self.closing:
                rows = waiting[0][4]
                bypass = None
                if line is self.execs and self.park(waiting[0]):
                    waiting.popleft()  # (kept aside: it waits for this connection's transaction, not in the line)
                    continue
                if rows and len(line.running) >= line.most:
                    if line is not self.execs:
                        break
                    if not self.may_bypass(waiting[0][2].db):
                        self.bypass_behind_head()
                        break
                    bypass = self.bypass
                item = waiting.popleft()
                stream, name, req, size, _ = item
                if line is self.txs:
                    self.let_go(item)
                self.start(bypass or (line if rows else None), stream, name, req, size)

    def hold(self, item: tuple[int, str, Any, int, bool]) -> None:
        """A transaction's call waits in the line: its transaction is not idle meanwhile (``SqlTx.held``), unless
        it waits because the client does not read (that is the client's idleness)."""
        tx_id = item[2].tx
        if self.session is None or tx_id not in self.session.transactions:
            return  # (another connection's, or none: its call is refused when it runs)
        self.tx_held[tx_id] = self.tx_held.get(tx_id, 0) + 1
        self.sync_held(tx_id)

    def let_go(self, item: tuple[int, str, Any, int, bool]) -> None:
        """A transaction's call leaves the line (begun, cancelled, or its connection gone): :meth:`hold` undone."""
        tx_id = getattr(item[2], "tx", 0)
        n = self.tx_held.get(tx_id, 0)
        if n:
            if n == 1:
                del self.tx_held[tx_id]
            else:
                self.tx_held[tx_id] = n - 1
            self.sync_held(tx_id)

    def sync_held(self, tx_id: int) -> None:
        tx = self.core.sql.transactions.get(tx_id)
        if tx is not None:
            tx.held = 0 if self.paused or self.closing else self.tx_held.get(tx_id, 0)

    def park(self, item: tuple[int, str, Any, int, bool]) -> bool:
        """Keep an exec aside when a transaction of this connection holds its database's writer: it could not run
        before that transaction ends, and in the line it would hold a place the transaction's own next calls may
        need (it ended at tx_idle). It goes back to the head of the line once the transaction ended."""
        session = self.session
        if session is None:
            return False
        db = item[2].db
        if not session.transactions:
            return False
        txs = self.core.sql.transactions
        for tx_id in session.transactions:
            tx = txs.get(tx_id)
            if tx is not None and not tx.read_only and not tx.done and tx.db.name == db:
                self.parked.append(item)
                if self.unpark not in tx.on_end:
                    tx.on_end.append(self.unpark)
                return True
        return False

    def stuck_behind_own(self) -> bool:
        """Whether a call waiting in the full execs' line may be one of a transaction of this connection (its fn's
        exec on another database), which would then wait behind the execs under way until its transaction's
        tx_idle: while the connection has a transaction open, such calls are let past, a few at most. The execs
        under way may wait for the writer that transaction holds (trial AW: execs set aside during one transaction
        went back to the line as it ended, and the next transaction of the connection, begun meanwhile, held the
        writer they waited for), or for another connection's transaction (trial BK: the fn's exec on a free
        database waited until tx_idle behind 32 execs waiting for another client's long transaction)."""
        session = self.session
        if session is None or not session.transactions or len(self.bypass.running) >= self.bypass.most:
            return False
        txs = self.core.sql.transactions
        return any((tx := txs.get(t)) is not None and not tx.done for t in session.transactions)

    def may_bypass(self, db: str) -> bool:
        """Whether an exec on ``db`` that finds the execs' line full is let past it: while this connection has a
        transaction open (:meth:`stuck_behind_own`). When a transaction of another connection holds
        ``db``'s writer, or waits for it (the exec would wait for it), such execs take at most half of the way past,
        so that the transaction's own calls elsewhere always find room (trial BA: they took all of it; trial BF:
        counted only for a transaction that held the writer already, those behind one waiting were not); one
        refused goes when one of them ends (trial BE: a writer busy with one transaction after another only makes
        it wait its turn). One exec of a database at a time goes past the line: execs that wait for a writer busy
        with a long statement leave the rest of the way to the other databases' (trial BP: 8 of them took it all,
        and the transaction's own exec on a free database waited until tx_idle)."""
        if not self.stuck_behind_own() or db in self.bypass_db.values():
            return False
        for tx in self.core.sql.transactions.values():
            if tx.db.name == db and not tx.read_only and not tx.done:
                if len(self.bypass_held) < BYPASS_HELD_MAX:
                    self.bypass_to = tx
                    return True
                return False  # (one of the execs counted ends: the lines are looked at again, see line_done)
        self.bypass_to = None
        return True

    def waits_in_line(self, db: str) -> bool:
        """Whether an exec on ``db`` waits in the execs' line (a later one on ``db`` goes behind it)."""
        waiting = self.execs.waiting
        return bool(waiting) and any(item[2].db == db for item in waiting)

    def bypass_behind_head(self) -> None:
        """The exec at the head of the full execs' line may not go past it (it would wait for a transaction, and
        half the way past already does): the execs behind it that may go, go (trial BF: a transaction's own exec
        on a free database waited behind it until tx_idle). Each database's execs keep their order: one refused
        leaves the later ones of its database refused too."""
        waiting = self.execs.waiting
        kept: collections.deque[tuple[int, str, Any, int, bool]] = collections.deque()
        refused: set[str] = set()
        while waiting and not self.paused and not self.closing and self.stuck_behind_own():
            item = waiting.popleft()
            db = item[2].db
            if db in refused:
                kept.append(item)
                continue
            if self.park(item):
                continue
            if not self.may_bypass(db):
                refused.add(db)
                kept.append(item)
                continue
            stream, name, req, size, _ = item
            self.start(self.bypass, stream, name, req, size)
        kept.extend(waiting)
        waiting.clear()
        waiting.extend(kept)

    def unpark(self) -> None:
        """A transaction of this connection ended: the execs kept aside go back to the head of their line, each
        database's execs in the order sent (trial BS: one kept aside went ahead of an earlier one of its database
        that waited in the line, and committed first)."""
        if not self.parked or self.closing:
            return
        parked, self.parked = self.parked, []
        waiting = self.execs.waiting
        merged = [*parked, *waiting]
        places: dict[str, list[int]] = {}
        for i, item in enumerate(merged):
            places.setdefault(item[2].db, []).append(i)
        ordered = list(merged)
        for at in places.values():
            if len(at) > 1:
                for i, item in zip(at, sorted((merged[i] for i in at), key=lambda item: item[0]), strict=True):
                    ordered[i] = item
        waiting.clear()
        waiting.extend(ordered)
        self.pump_lines()  # (what is still held up by another transaction is kept aside again)

    def line_done(self, stream: int) -> None:
        line = self.line_of.pop(stream, None)
        if line is not None:
            line.running.discard(stream)
            if line is self.bypass:
                self.bypass_db.pop(stream, None)
                self.bypass_held.discard(stream)
            if line.waiting or (line is self.bypass and self.execs.waiting):
                self.pump_lines()

    def big_started(self, stream: int, size: int) -> None:
        """A big request is under way: past ``INFLIGHT_HIGH`` bytes of them, read no more from the client."""
        self.big[stream] = size
        self.big_bytes += size
        if self.big_bytes >= INFLIGHT_HIGH and not self.loaded:
            self.loaded = True
            self.steer_reading()

    def cancel(self, stream: int) -> None:
        """A ``CANCEL`` from the client: it gave up on ``stream`` and forgot it. What runs the call is cancelled
        — a task (a coroutine's) or a future (a read on a reader thread, a statement of a transaction) — and
        nothing is answered. A write answered through a ``Later`` cannot be taken back (a cancel after
        sending leaves the write to happen): its answer is dropped when it comes, and until then it counts
        against the connection: past ``ORPHANS_HIGH`` bytes of such writes, the connection's next requests wait
        unread (so a client that sends and cancels writes faster than they run cannot grow the server's
        queue without bound)."""
        running: asyncio.Future[Any] | None = self.tasks.pop(stream, None) or self.futures.pop(stream, None)
        undo = self.undos.pop(stream, None) if self.undos else None
        if running is not None:
            if not running.done():
                running.cancel()
            elif undo is not None and not running.cancelled() and running.exception() is None:
                # it returned, its answer not yet written: dropped now, so what the result hands over is given back
                try:
                    undo(self.session, running.result())
                except Exception:
                    log.exception("giving back what a cancelled %s call was handed", stream)
        for line in self.lines:
            for item in line.waiting:
                if item[0] == stream:  # a call that had not begun: forgotten
                    line.waiting.remove(item)
                    if line is self.txs:
                        self.let_go(item)
                    break
        if self.parked:
            self.parked = [item for item in self.parked if item[0] != stream]
        if self.line_of:
            self.line_done(stream)
        held = self.laters.pop(stream, None)
        if held is not None and not held[0].done():
            later, size = held
            cost = size + ORPHAN_COST
            self.orphans[later] = cost
            self.orphan_bytes += cost
            if self.orphan_bytes >= ORPHANS_HIGH and not self.held:
                self.held = True
                self.steer_reading()
        if self.big:
            self.big_done(stream)  # (a cancelled write counts among the orphans now)
        # (the frame parser gave the stream's credit back when it read the CANCEL: a request after it in the
        # same read may already use the stream id again)

    def orphan_done(self, later: Later) -> None:
        """A cancelled write has run: the connection may be read again once few enough still run."""
        self.orphan_bytes -= self.orphans.pop(later, 0)
        if self.held and self.orphan_bytes <= ORPHANS_LOW:
            self.held = False
            self.steer_reading()

    def big_done(self, stream: int) -> None:
        """A big request is answered, or dropped: the connection may be read again once few enough are left."""
        size = self.big.pop(stream, 0)
        if size:
            self.big_bytes -= size
            if self.loaded and self.big_bytes <= INFLIGHT_LOW:
                self.loaded = False
                self.steer_reading()

    def finish(self, stream: int, fut: asyncio.Future[Any]) -> None:
        """Answer ``stream`` with the outcome of ``fut``, the task or future that ran its call (its done
        callback); nothing when the call is no longer ours to answer (a ``CANCEL``, the connection's end)."""
        tasks = self.tasks
        if tasks and tasks.get(stream) is fut:
            del tasks[stream]
            if self.undos:
                self.undos.pop(stream, None)
        elif self.futures.get(stream) is fut:
            del self.futures[stream]
        else:
            # cancelled by the client (or the connection is gone); the stream may be in use again. Its error is
            # taken all the same: asyncio would log it as never retrieved (trial EC: a stop's interrupted write)
            if not fut.cancelled():
                fut.exception()
            return
        if self.big:
            self.big_done(stream)
        self.settle(stream, fut)
        if self.line_of:
            self.line_done(stream)

    def settle(self, stream: int, fut: asyncio.Future[Any]) -> None:
        """Answer ``stream`` with the outcome of ``fut`` (done)."""
        if fut.cancelled():
            if not self.closing:
                self.send_error(stream, ClosedError("the call was cancelled"))
            return
        exc = fut.exception()  # (taken, the connection closing too: else asyncio logs it as never retrieved)
        if self.closing:
            return
        if exc is not None:
            self.send_error(stream, exc)
        else:
            self.send_result(stream, fut.result())

    def answer(self, stream: int, later: Later, value: Any, exc: BaseException | None) -> None:
        """The result of a call answered through a :class:`Later` (nothing when the client cancelled it)."""
        laters = self.laters
        held = laters.get(stream)
        if held is None or held[0] is not later:
            if self.orphans:
                self.orphan_done(later)
            return
        del laters[stream]
        if self.big:
            self.big_done(stream)
        if exc is not None:
            self.send_error(stream, exc)
        else:
            self.send_result(stream, value)
        if self.line_of:
            self.line_done(stream)

    def send_result(self, stream: int, value: Any) -> None:
        if self.closing:
            return
        try:
            try:
                body = encode_answer(value)  # (not encode: see encode_answer)
            except UnicodeEncodeError:
                body = encode_answer(escaped(value))  # (a path of the answer not UTF-8: trial CR, it went unanswered)
            if len(body) > CHUNK:
                parts = self.conn.send_response(stream, body, CHUNK)
            else:
                frame = self.conn.send_response_frame(stream, body)
        except (TypeError, OverflowError, ValueError) as exc:
            self.send_error(stream, TinystoreError(f"the answer could not be encoded: {exc}"))
            return
        except MemoryError:
            # (its encoding or its frames: unanswered, the call waited for ever, as the connection answers pings;
            # trial CN, CO)
            self.listener.silent_log("memory").warning(
                "%s: out of memory making an answer: it was answered with an error", self.listener.description
            )
            self.send_error(stream, UnavailableError(OUT_OF_MEMORY))
            return
        if len(body) > CHUNK:
            self.write_many(parts)
            # to the transport now: past its high-water mark it pauses us (pause_writing) before the next
            # request of this read begins (see BOUNDED_READS)
            self.flush()
            return
        # self.write(...), inline: the hot path of every answer
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self.out
        out.append(frame)
        if self.receiving:
            if len(out) >= BURST:
                self.flush()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def send_error(self, stream: int, exc: BaseException) -> None:
        if self.closing:
            return
        err = error_of(exc)
        extra = {k: v for k, v in err.extra.items() if isinstance(v, str | int | float | bool | None)}
        body = encode_escaping(ErrorBody(code=err.code, message=err.message, extra=extra))
        self.write(self.conn.send_error(stream, body))

    def push(self, method: str, body: Any) -> None:
        if not self.closing:
            frame = self.conn.send_push(method, encode(body))
            self.write(frame)
            self.pushed += len(frame)
            if self.pushed > LOW_WATER:
                # to the transport now, not at the end of the turn: past its high-water mark it pauses us
                # (pause_writing) before the next push, and the engines hold the rest back
                self.flush()

    def write(self, data: bytes) -> None:
        """Queue ``data``; what one loop turn queues goes out in one write (fewer system calls under load);
        inside :meth:`data_received`, when it returns (answers go out every ``BURST``, see send_result)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.out.append(data)
        if not self.flush_scheduled and not self.receiving:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_many(self, parts: list[bytes]) -> None:
        for part in parts:
            self.write(part)

    def flush(self) -> None:
        """Write what is queued, in one system call."""
        self.flush_scheduled = False
        self.pushed = 0
        if self.paused and self.tls and not self.closing:
            # TLS, paused: what is queued waits here, counted, until resume_writing (see write_tls)
            if self.transport is not None and self.out:
                self.unsent = self.unsent_now()
                self.budget.note(self, self.unsent)
            return
        out, self.out = self.out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            data = out[0] if len(out) == 1 else None
            try:
                if data is None:
                    data = _join(out)
                if self.tls and len(data) > TLS_PIECE:
                    self.written += self.write_tls(transport, data)
                else:
                    transport.write(data)
                    self.written += len(data)
            except MemoryError:
                self.write_apart(transport, out)
                self.written += sum(len(part) for part in out)
            # what the client has not taken yet counts against the server's budget (see output_budget); almost
            # always nothing, the socket took it all: then nothing more is done
            size = transport.get_write_buffer_size()
            if self.tls and self.out:  # (the rest of an answer a pause cut: see write_tls)
                size = self.unsent_now()
            if size or self.unsent:
                self.unsent = size
                self.budget.note(self, size)

    def unsent_now(self) -> int:
        """Bytes the transport holds unsent, and over TLS, what waits for it in ``out`` (see output_budget)."""
        transport = self.transport
        if transport is None:
            return 0
        size = transport.get_write_buffer_size()
        if self.tls and self.out:
            size += sum(len(part) for part in self.out)
        return size

    def taken(self) -> int:
        """Bytes the client has taken in all, near enough: all it was written, less what the transport and the
        socket's kernel buffer still hold (see output_budget)."""
        transport = self.transport
        if transport is None:
            return self.written
        return self.written - transport.get_write_buffer_size() - unsent_in_socket(self.sock)

    def evict(self, held: int, total: int, limit: int, idle: float) -> None:
        """The server holds more unsent bytes than ``Limits.client_output_bytes`` for its clients, and this
        connection the most of those whose client took nothing for ``Limits.client_output_stall`` (past twice the
        limit, for a second; ``idle``: seconds it took nothing): it is closed at once, what it holds dropped (its
        client's reads are sent again on its next connection; its writes under way are ``OutcomeUnknownError``, as
        at any drop)."""
        self.listener.silent_log("evicted").warning(
            "%s: closed a connection%s holding %s its client had not read (it took nothing for %s; "
            "Limits.client_output_stall %s, a second past twice the bound): the server held %s unread for all its "
            "clients, past Limits.client_output_bytes (%s)",
            self.listener.description,
            self.peer_text(),
            _mib(held),
            format_seconds(round(idle, 1)),
            format_seconds(self.budget.stall),
            _mib(total),
            _mib(limit),
        )
        transport = self.transport
        self.out = []  # dropped, not handed to the transport first (over TLS, OpenSSL's memory: see write_tls)
        self.close("it held more answers unread than the server may hold for it", "evicted", notify=False)
        if transport is not None:
            transport.abort()
        self.budget.forget(self)

    def write_tls(self, transport: asyncio.Transport, data: bytes | memoryview) -> int:
        """``data`` handed to a TLS transport in pieces of :data:`TLS_PIECE`: what the transport encrypts while the
        socket's transport under it takes more goes there whole, where neither its size nor the budget sees it
        (trial GC: an answer of 8 MiB went under, and three connections that read nothing held 160 MiB, their
        unsent bytes told as 0); given in pieces, the first fills that transport, which pauses the TLS one, and the
        rest waits in the TLS transport, counted. Once the TLS transport pauses us (past :data:`TLS_HIGH_WATER`), the
        rest waits in ``out`` instead, where Python frees it (trial GG: what waits in the TLS transport is OpenSSL's,
        encrypted, and the memory of a connection closed with much of it there was not all given back). Returns the
        bytes handed to the transport."""
        view = memoryview(data)
        for start in range(0, len(data), TLS_PIECE):
            if start and self.paused and not self.closing:
                self.out.insert(0, view[start:])
                return start
            transport.write(view[start : start + TLS_PIECE])
        return len(data)

    def write_apart(self, transport: asyncio.Transport, out: list[bytes | memoryview]) -> None:
        """Out of memory joining ``out`` (a few answers of tens of MB): each frame written alone. Should one fail
        too, what of it went out is not known: the connection is dropped (the SDK sends its reads again, and says
        of its writes that they may have taken effect), rather than leave its calls waiting for ever (trial CN:
        the frames joined were lost, and their calls never answered)."""
        for part in out:
            try:
                transport.write(part)
            except MemoryError:
                self.listener.silent_log("memory").warning(
                    "%s: out of memory writing answers: a connection was dropped", self.listener.description
                )
                self.closing = True
                transport.abort()
                return

    def close(
        self, reason: str, code: str = "closed", notify: bool = True, said_read: bool = False, stopping: bool = False
    ) -> None:
        """Close this connection, telling the client why (GOAWAY) unless ``notify`` is false; ``said_read``: and
        the last request read (every later one was not run: the SDK sends it again elsewhere); ``stopping``: and
        that the store is stopping (its SDK ends the leases held through the connection at once: LOCK-07)."""
        if self.closing:
            return
        if notify:
            # at a stop, with the last request read: the client may send the later ones again elsewhere, never run
            # here (trial BK: unread at a stop, each was a write that may have committed, for its client). Not
            # after a refused frame: sent again, it would be refused again, for ever
            goaway = GoAway(
                reason=reason, code=code, last_stream=self.last_stream if said_read else None, stopping=stopping
            )
            self.write(self.conn.send_goaway(encode_escaping(goaway)))
        self.closing = True
        if code == "protocol":
            if self.session is None:
                # before its handshake: anyone may send garbage, as often as they like: once a minute, counted
                # (trial FL: a hundred connections, a hundred lines)
                self.listener.silent_log("unhandshaken").warning(
                    "%s: closing a connection%s: %s", self.listener.description, self.peer_text(), reason
                )
            else:
                log.warning("closing a connection%s: %s", self.peer_text(), reason)  # (whose: trial FK)
        transport = self.transport
        if transport is not None:
            self.flush()
            if said_read:
                # a lingering close (see LINGER): the client reads the GOAWAY (then the end of what we send, where
                # the transport can say it: TLS cannot, but the SDK ends the connection at a GOAWAY) and closes
                if transport.can_write_eof():
                    try:
                        transport.write_eof()
                    except OSError:
                        transport.abort()
                        return
                if self.not_reading:
                    transport.resume_reading()
                self.linger = self.loop.call_later(LINGER, transport.abort)
                return
            transport.close()

    def refuse_unbegun(self) -> None:
        """The store is stopping: the calls that have not begun (waiting in the reads' or the execs' line, or kept
        aside for a transaction, which the stop rolls back) are refused as not run, like a call that comes now
        (STORE-05): the SDK may send each again to the next server. Dropped at the close instead, a write among
        them was one that may have committed, for its client (trial BA). A transaction's calls that wait (behind its
        slow reads) are answered with why it ended: the stop rolled it back (a commit dropped at the close was one
        that may have taken effect: trial BD)."""
        unbegun = [*self.reads.waiting, *self.execs.waiting, *self.parked]
        self.reads.waiting.clear()
        self.execs.waiting.clear()
        self.parked.clear()
        for stream, name, _, _, _ in unbegun:
            self.send_error(
                stream, UnavailableError(f"store {self.core.directory} is stopping: {name} was not run", refused=True)
            )
        txs = self.core.sql.transactions
        waiting = list(self.txs.waiting)
        self.txs.waiting.clear()
        for item in waiting:
            self.let_go(item)
            stream, name, req, _, _ = item
            tx = txs.get(req.tx)
            why = tx.error if tx is not None else None
            self.send_error(
                stream,
                why
                or UnavailableError(
                    f"store {self.core.directory} is stopping: transaction {req.tx} was rolled back (nothing of it "
                    f"was committed); {name} was not run"
                ),
            )

    def _pending(self) -> list[asyncio.Future[Any]]:
        return [
            f
            for f in (*self.tasks.values(), *self.futures.values(), *(x.future() for x, _ in self.laters.values()))
            if not f.done()
        ]

    def calls_pending(self) -> bool:
        """Whether calls under way on this connection have not been answered yet."""
        return bool(self._pending())

    async def drain_calls(self, timeout: float, *, grace: bool = True) -> None:
        """Wait, ``timeout`` seconds at most, for the calls under way to be answered (the ones that begin meanwhile,
        a transaction's calls that waited in its line, too); the calls that have not begun are refused first. With
        ``grace``, the wait also ends when the stop's grace was ended (``Core.end_grace``)."""
        self.refuse_unbegun()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pending = self._pending()
            left = deadline - loop.time()
            if not pending or left <= 0 or (grace and self.core.grace_over.is_set()):
                return
            if grace:
                await self.core.within_grace(pending, left)
            else:
                await asyncio.wait(pending, timeout=left)


async def bind_tcp(host: str, port: int) -> list[socket.socket]:
    """Sockets bound (not yet listening) to every address ``host`` names, on one port (``0``: one the system
    picks). Raises ``OSError`` (``socket.gaierror`` when ``host`` does not resolve, ``EADDRINUSE``, ``EACCES``)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    bound = port
    try:
        for family, type_, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], bound, *addr[2:]))
            bound = int(sock.getsockname()[1])
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _given_up(conn: socket.socket, protocols: list[ServerConnection]) -> None:
    """End the accepted socket ``conn`` whose connection was given up in its making (crowded out, or its TLS
    handshake failed). Once the loop made its protocol (``protocols``), a transport owns the socket and closes it
    (asyncio closed that transport as it gave up; one whose connection was made is aborted here, and ends as any
    connection ends): closed here as well, its descriptor's number went to the next connection accepted while that
    transport still held it ("File descriptor N is used by transport", a burst of TLS clients past the cap)."""
    if not protocols:
        conn.close()  # (no transport took it)
    elif protocols[0].transport is not None:
        protocols[0].transport.abort()


def tcp_address(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 host in brackets (as an address takes it back: ``tcp://[::1]:7700``)."""
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


class Listener:
    """A socket server feeding a core. ``tokens``: token → capability, or ``None`` (Unix: trusted).

    ``handshake_timeout``: seconds a connection has to finish its handshake before it is closed."""

    def __init__(
        self, core: Core, tokens: dict[str, str] | None = None, *, handshake_timeout: float = HANDSHAKE_TIMEOUT
    ) -> None:
        self.core = core
        self.tokens = tokens
        self.handshake_timeout = handshake_timeout
        self.sockets: list[socket.socket] = []
        self.ssl_context: ssl.SSLContext | None = None
        self.connections: set[ServerConnection] = set()
        # plain connections accepted whose protocol is not made yet (a loop turn or two): counted as connections
        # by the descriptors' rule (see room_to_accept), or a burst of 64 passed it in one batch (trial IE)
        self.accepting = 0
        self.kept_accepting = 0  # of those, accepted on the descriptors kept for the command line (see _accept)
        self.handshaking: dict[ServerConnection, None] = {}  # waiting for their handshake, oldest first
        self.max_handshaking = MAX_HANDSHAKING
        # connections in their TLS handshake → when accepted (loop time), oldest first; they count against
        # max_handshaking with those waiting for their HELLO
        self.starting: dict[asyncio.Task[Any], float] = {}
        self.dropped: set[asyncio.Task[Any]] = set()  # crowded out in their TLS handshake, being cancelled
        # method name → (method, body decoder), filled as methods are first called
        self.decoders: dict[str, tuple[Method, Any]] = {}
        self.last_activity = time.monotonic()
        self.description = ""
        self.unix_path: Path | None = None
        self.unix_file: tuple[int, int] | None = None
        self.closed = False
        self._resume: asyncio.TimerHandle | None = None
        self.accept_log = RateLimitedLog()
        self.silent_logs: dict[str, RateLimitedLog] = {}

    def silent_log(self, kind: str) -> RateLimitedLog:
        """The rate-limited log of one kind of event about peers (``crowded``, ``expired``, ``tls``, ...)."""
        got = self.silent_logs.get(kind)
        if got is None:
            got = self.silent_logs[kind] = RateLimitedLog()
        return got

    def crowd(self) -> None:
        """While more connections wait for their handshake (TLS's, then HELLO) than ``max_handshaking``, close
        the one that has waited longest."""
        starting, waiting = self.starting, self.handshaking
        while len(starting) + len(waiting) > self.max_handshaking:
            task = next(iter(starting), None)
            conn = next(iter(waiting), None)
            if task is not None and (conn is None or starting[task] <= conn.accepted):
                del starting[task]
                self.dropped.add(task)
                task.cancel()  # _connect logs it and closes the socket
            elif conn is not None:
                conn.crowded_out()

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def decoder(self, name: str) -> tuple[Method, Any]:
        """The method ``name`` and the ``decode`` of its request body; ``InvalidError`` when unknown."""
        method = self.core.methods.get(name)
        if method is None:
            raise InvalidError(f"unknown method {name!r}")
        entry = (method, decoder_for(method.request).decode)
        if len(self.decoders) < 4096:
            self.decoders[name] = entry
        return entry

    async def start_unix(self, path: Path) -> None:
        if path.exists() or path.is_symlink():
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except BaseException:
            sock.close()
            raise
        self.unix_path = path
        st = os.stat(path)
        self.unix_file = (st.st_dev, st.st_ino)  # which file is ours: the path may hold another's later
        self.description = f"unix:{path}"
        self._listen([sock])

    async def start_tcp(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on every address ``host`` names (one port for all of them); returns the port.

        Raises ``OSError`` (``socket.gaierror`` when ``host`` does not resolve, ``EADDRINUSE``, ``EACCES``)."""
        return self.listen_tcp(host, await bind_tcp(host, port), ssl_context)

    def listen_tcp(self, host: str, socks: list[socket.socket], ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on ``socks`` (bound by :func:`bind_tcp` to ``host``'s addresses); returns their port."""
        bound = int(socks[0].getsockname()[1])
        self.ssl_context = ssl_context
        self.description = tcp_address("tls" if ssl_context else "tcp", host, bound)
        self._listen(socks)
        return bound

    def _listen(self, socks: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in socks:
            sock.listen(BACKLOG)
            sock.setblocking(False)
            self.sockets.append(sock)
            close_in_child(sock.fileno())  # a forked child that outlives this server must not keep it
            loop.add_reader(sock.fileno(), self._accept, sock)
        self.core.listeners.append(self)

    def _accept(self, sock: socket.socket) -> None:
        """The listening socket is readable: accept what waits (a bounded batch, so others get their turn), while
        descriptors are left for the databases' files (see ``kept_for_files``)."""
        for _ in range(64):
            kept_local = self.core.kept_local()
            local = self.description.startswith("unix:")
            full = room_to_accept(
                self.core.socket_connections(),
                len(self.core.sql.databases) if self.core.running else 0,
                self.core.limits.readers,
                # (a TCP or TLS listener leaves a few for the directory's own socket, the command line's)
                0 if local else kept_local,
            )
            kept = False
            if full is not None and local and self.kept_accepting + self.kept_connections() < kept_local:
                # the directory's socket: past the room for connections, a few more come in while a descriptor is
                # left at all (accept says when none is), each let in only if it is the command line (its HELLO
                # says: see ServerConnection.on_hello), so that `status` and `stop` get in past clients that wait
                # (trials IG, II, IK)
                full, kept = None, True
            if full is not None:
                used, for_files, soft = full
                self._pause(
                    f"{used} of the {soft} files this process may open are open, and {for_files} are kept for the "
                    "databases' files"
                )
                return
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _NO_RESOURCES:
                    self._pause(str(exc.strerror or exc))
                    return
                log.exception("%s: accept failed", self.description)
                return
            try:
                conn.setblocking(False)
                if conn.family != socket.AF_UNIX:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                conn.close()
                continue
            task = asyncio.ensure_future(self._connect(conn, addr, kept))
            if kept:
                self.kept_accepting += 1
                task.add_done_callback(self._kept_accepted)
            if self.ssl_context is None:
                self.accepting += 1
                task.add_done_callback(self._accepted)
            else:
                # (a plain connection is made in a loop turn or two, and counts from then on: counted while it was
                # made, it was closed as one "in its TLS handshake", told nothing, before any HELLO could be read)
                self.starting[task] = asyncio.get_running_loop().time()
                task.add_done_callback(self._started)
                self.crowd()

    def _accepted(self, task: asyncio.Task[Any]) -> None:
        self.accepting -= 1

    def _kept_accepted(self, task: asyncio.Task[Any]) -> None:
        self.kept_accepting -= 1
        self.kept_freed()  # (its connection may have ended already: a client's refused at its HELLO)

    def kept_freed(self) -> None:
        """A connection let in on a descriptor kept for the command line ended: accept again at once, when paused
        (one kept descriptor is taken and given back within a handshake; the pause's half second between them left
        the command line behind a queue of clients tried again: trial IK)."""
        if self._resume is not None and not self.closed:
            self._resume.cancel()
            self._unpause()

    def kept_connections(self) -> int:
        """The connections let in on the descriptors kept for the command line, and not ended yet."""
        return sum(1 for c in self.connections if c.kept)

    def _started(self, task: asyncio.Task[Any]) -> None:
        self.starting.pop(task, None)
        self.dropped.discard(task)

    async def _connect(self, conn: socket.socket, addr: Any = None, kept: bool = False) -> None:
        loop = asyncio.get_running_loop()
        accepted = loop.time()

        protocols: list[ServerConnection] = []

        def made() -> ServerConnection:
            protocols.append(ServerConnection(self, accepted, asyncio.current_task(), kept))
            return protocols[0]

        try:
            if self.ssl_context is None:
                await loop.connect_accepted_socket(made, conn)
            else:
                await loop.connect_accepted_socket(
                    made, conn, ssl=self.ssl_context, ssl_handshake_timeout=self.handshake_timeout
                )
        except asyncio.CancelledError:
            _given_up(conn, protocols)
            if asyncio.current_task() not in self.dropped:
                raise  # the listener closes
            # crowded out (see crowd): more connections wait for their handshake than the listener allows
            self.silent_log("crowded-tls").warning(
                "%s: closed a connection%s in its TLS handshake: over %d connections were waiting for their handshake",
                self.description,
                _from(addr),
                self.max_handshaking,
            )
        except (OSError, ssl.SSLError, TimeoutError, ValueError) as exc:
            # a TLS handshake that failed or took too long, a peer already gone: only that connection ends
            if self.ssl_context is not None:
                detail = str(exc) or type(exc).__name__
                if isinstance(exc, TimeoutError) or "longer than" in detail:
                    kind, why = "tls-timeout", f"its TLS handshake took over {self.handshake_timeout:g}s"
                else:
                    kind, why = "tls-failed", f"its TLS handshake failed: {detail}"
                # (the peer named: trial HV, an operator could not tell which client was misconfigured)
                self.silent_log(kind).warning("%s: closed a connection%s: %s", self.description, _from(addr), why)
            _given_up(conn, protocols)

    def _pause(self, why: str) -> None:
        """``accept`` failed for want of descriptors or memory (``why``), or would leave too few for the databases'
        files: say so (once a minute at most), stop accepting for :data:`ACCEPT_PAUSE` (the clients wait in the
        backlog), then try again."""
        self.accept_log.warning(
            "%s: cannot accept connections: %s (%d connections open or being made; this process may open %d files, "
            "and the databases' files count too: raise `ulimit -n`, a server takes the hard limit when it starts); "
            "new clients wait until some close",
            self.description,
            why,
            self.core.socket_connections(),
            open_files_limit(),
        )
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            loop.remove_reader(sock.fileno())
        if self._resume is None:
            self._resume = loop.call_later(ACCEPT_PAUSE, self._unpause)

    def _unpause(self) -> None:
        self._resume = None
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    def _stop_accepting(self) -> None:
        self.closed = True
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            if sock.fileno() >= 0:
                loop.remove_reader(sock.fileno())
                keep_in_child(sock.fileno())
            sock.close()
        self.sockets = []
        for task in self.starting:
            task.cancel()

    async def close(self, grace: float) -> None:
        """Stop accepting; let calls under way finish (at most ``grace`` seconds); close every connection."""
        self._stop_accepting()
        conns = list(self.connections)
        await asyncio.gather(*(c.drain_calls(grace) for c in conns), return_exceptions=True)
        if self.core.running and any(c.calls_pending() for c in conns):
            # the grace ended with calls under way: the statements they run are interrupted (rolled back) now,
            # before their connections close, so that their clients are told so (ClosedError), not left to guess
            # (OutcomeUnknownError); the engines' own statements go on
            pending = sum(1 for c in conns if c.calls_pending())
            # (trial IA: an operator saw only "stopping" and "stopped", never that a write had been cut short)
            log.warning(
                "%s: the stop's grace (%gs) ended with calls of %d connection%s still under way: their statements are "
                "interrupted and rolled back, and they are answered ClosedError",
                self.description,
                grace,
                pending,
                "" if pending == 1 else "s",
            )
            self.core.sql.cut_calls()
            await asyncio.gather(*(c.drain_calls(CUT_ANSWER, grace=False) for c in conns), return_exceptions=True)
        for c in conns:
            if c.instance and c.number and c.session is not None:
                self.core.read_fact(c.instance, c.number, c.last_stream)  # (see Core.read_facts)
            # (before the directory is let go: the lingering close below waits for the clients to read this, so that
            # their leases end before a next server can give a key to another: LOCK-07)
            c.close("the store is stopping", "unavailable", said_read=True, stopping=True)
        # the lingering ones (see LINGER): until their clients closed them, LINGER at most
        loop = asyncio.get_running_loop()
        until = loop.time() + LINGER + 0.1
        while any(c.linger is not None for c in conns) and loop.time() < until:
            await asyncio.sleep(0.01)
        if self.unix_path is not None:
            # only our own socket file: a server whose directory was removed and made again stops while a new
            # one serves on the same path, and must not take that one's socket away
            try:
                st = os.stat(self.unix_path)
                if (st.st_dev, st.st_ino) == self.unix_file:
                    self.unix_path.unlink()
            except OSError:
                pass
        if self in self.core.listeners:
            self.core.listeners.remove(self)


def _from(addr: Any) -> str:
    """`` from HOST:PORT`` for a TCP peer's address as ``accept`` gives it; ``""`` for none (a Unix socket's)."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = f"[{addr[0]}]" if ":" in str(addr[0]) else addr[0]
        return f" from {host}:{addr[1]}"
    return ""
