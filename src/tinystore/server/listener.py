"""Listeners: Unix and TCP/TLS sockets whose connections become sessions of a :class:`Core`.

Each connection runs the sans-I/O :class:`~tinystore.protocol.frames.Connection`. Flow control: a client
has at most ``max_inflight`` requests in flight (its request credit), and when the bytes waiting to be
written to a client pass the high-water mark the server stops reading from it until they drain, so a client
that stops reading cannot make the server buffer without bound. A broken frame closes that one connection
with a reason (``GOAWAY``); other connections never notice (STORE-04).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import ssl
import time
from functools import partial
from pathlib import Path
from types import CoroutineType
from typing import Any

import msgspec

from .. import __version__
from ..engines.sql import Later
from ..errors import (
    ClosedError,
    InvalidError,
    ProtocolError,
    TinystoreError,
    UnauthenticatedError,
    UnavailableError,
)
from ..protocol import frames
from ..protocol.frames import Kind
from ..protocol.messages import ErrorBody, GoAway, Hello, Welcome, decode, decoder_for, encode
from .core import Core, Method, Session, error_of

log = logging.getLogger("tinystore.server")

HIGH_WATER = 8 * 1024 * 1024
LOW_WATER = 1024 * 1024
CHUNK = 1 << 20  # a response body past this many bytes goes out in several frames (flag MORE)
# While a burst of requests read at once is being answered, the answers made so far go out every this many:
# the client works on them while the server computes the rest (the two processes overlap instead of taking
# turns; twice the point reads a second with 32 callers when a second core is free). Answers that come later
# (writes, from the writer's batch) go out together, so that the next group commit is as large.
BURST = 8

_REQUEST = Kind.REQUEST
_Future = asyncio.Future


def load_tokens(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a tokens file: one ``<capability> <token>`` a line (``admin`` or ``data``); ``#`` comments.

    Returns token → capability. Raises ``InvalidError`` naming the line that is wrong.
    """
    tokens: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in ("admin", "data"):
            raise InvalidError(f"tokens file {path}: line {n}: expected '<admin|data> <token>'")
        if len(parts[1]) < 16:
            raise InvalidError(f"tokens file {path}: line {n}: a token needs at least 16 characters")
        tokens[parts[1]] = parts[0]
    return tokens


class ServerConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.core = listener.core
        self.conn = frames.Connection("server", max_body=self.core.limits.frame_body_bytes)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.laters: dict[int, Later] = {}
        self.closing = False
        self.paused = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.receiving = False  # inside data_received: what is written goes out once it returns
        self.decoders = listener.decoders

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]
        self.listener.connections.add(self)
        self.listener.touch()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        conn = self.conn
        conn.receive_data(data)
        self.receiving = True
        try:
            while not self.closing:
                batch = conn.next_frames()
                if not batch:
                    break
                for kind, _flags, stream, method, body in batch:
                    if kind is _REQUEST:
                        self.on_request(stream, method, body)
                    else:
                        self.on_frame(kind, stream, body)
                    if self.closing:
                        break
        except ProtocolError as exc:
            self.close(exc.message, "protocol")
        except Exception as exc:
            log.exception("connection error")
            self.close(f"internal error: {exc}", "internal")
        finally:
            self.receiving = False
            # the answers of this read go out in one write, now (not a loop turn later)
            if self.out:
                self.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.listener.connections.discard(self)
        self.listener.touch()
        tasks, self.tasks = self.tasks, {}
        futures, self.futures = self.futures, {}
        for task in tasks.values():
            task.cancel()
        for fut in futures.values():
            fut.cancel()  # nobody is left to answer: what waits for a result stops waiting
        if self.session is not None:
            self.session.close()

    def pause_writing(self) -> None:
        if self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and self.paused:
            self.paused = False
            if not self.closing:
                self.transport.resume_reading()

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
        capability = "admin"
        if self.listener.tokens is not None:
            capability = ""
            for token, cap in self.listener.tokens.items():
                if hmac.compare_digest(token.encode(), hello.token.encode()):
                    capability = cap
            if not capability:
                self.refuse(UnauthenticatedError.code, "the token is missing or wrong")
                return
        try:
            self.session = self.core.new_session(self.push, local=False, capability=capability, name=hello.client)
        except ClosedError as exc:
            self.refuse("unavailable", exc.message)
            return
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
            )
        )
        self.write(self.conn.send_welcome(body))

    def refuse(self, code: str, message: str) -> None:
        self.write(self.conn.send_error(0, encode(ErrorBody(code=code, message=message))))
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
                raise InvalidError(f"{name}: {exc}") from None
            except msgspec.DecodeError as exc:
                raise InvalidError(f"{name}: the body is not valid MessagePack: {exc}") from None
            result = core.invoke(session, name, req)
        except BaseException as exc:
            self.send_error(stream, exc)
            return
        if type(result) is Later:
            self.laters[stream] = result
            result.then(partial(self.answer, stream, result))
        elif isinstance(result, _Future):
            if result.done():
                self.settle(stream, result)
            else:
                self.futures[stream] = result
                result.add_done_callback(partial(self.finish, stream))
        elif type(result) is CoroutineType:
            task = asyncio.ensure_future(result)
            self.tasks[stream] = task
            task.add_done_callback(partial(self.finish, stream))
        else:
            self.send_result(stream, result)

    def cancel(self, stream: int) -> None:
        """A ``CANCEL`` from the client: it gave up on ``stream`` and forgot it. What runs the call is cancelled
        — a task (a coroutine's) or a future (a read on a reader thread, a statement of a transaction) — and
        nothing is answered. A write answered through a ``Later`` cannot be taken back (a cancel after
        sending leaves the write to happen): its answer is dropped when it comes."""
        running: asyncio.Future[Any] | None = self.tasks.pop(stream, None) or self.futures.pop(stream, None)
        if running is not None:
            running.cancel()
        self.laters.pop(stream, None)
        self.conn.finished(stream)

    def finish(self, stream: int, fut: asyncio.Future[Any]) -> None:
        """Answer ``stream`` with the outcome of ``fut``, the task or future that ran its call (its done
        callback); nothing when the call is no longer ours to answer (a ``CANCEL``, the connection's end)."""
        tasks = self.tasks
        if tasks and tasks.get(stream) is fut:
            del tasks[stream]
        elif self.futures.get(stream) is fut:
            del self.futures[stream]
        else:
            return  # cancelled by the client (or the connection is gone); the stream may be in use again
        self.settle(stream, fut)

    def settle(self, stream: int, fut: asyncio.Future[Any]) -> None:
        """Answer ``stream`` with the outcome of ``fut`` (done)."""
        if self.closing:
            return
        if fut.cancelled():
            self.send_error(stream, ClosedError("the call was cancelled"))
            return
        exc = fut.exception()
        if exc is not None:
            self.send_error(stream, exc)
        else:
            self.send_result(stream, fut.result())

    def answer(self, stream: int, later: Later, value: Any, exc: BaseException | None) -> None:
        """The result of a call answered through a :class:`Later` (nothing when the client cancelled it)."""
        laters = self.laters
        if laters.get(stream) is not later:
            return
        del laters[stream]
        if exc is not None:
            self.send_error(stream, exc)
        else:
            self.send_result(stream, value)

    def send_result(self, stream: int, value: Any) -> None:
        if self.closing:
            return
        try:
            body = encode(value)
        except (TypeError, OverflowError) as exc:
            self.send_error(stream, TinystoreError(f"the answer could not be encoded: {exc}"))
            return
        if len(body) > CHUNK:
            self.write_many(self.conn.send_response(stream, body, CHUNK))
            return
        # self.write(...), inline: the hot path of every answer
        frame = self.conn.send_response_frame(stream, body)
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
        self.write(self.conn.send_error(stream, encode(ErrorBody(code=err.code, message=err.message, extra=extra))))

    def push(self, method: str, body: Any) -> None:
        if not self.closing:
            self.write(self.conn.send_push(method, encode(body)))

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
        out, self.out = self.out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self, reason: str, code: str = "closed", notify: bool = True) -> None:
        """Close this connection, telling the client why (GOAWAY) unless ``notify`` is false."""
        if self.closing:
            return
        if notify:
            self.write(self.conn.send_goaway(encode(GoAway(reason=reason, code=code))))
        self.closing = True
        if code == "protocol":
            log.warning("closing a connection: %s", reason)
        if self.transport is not None:
            self.flush()
            self.transport.close()

    async def drain_calls(self, timeout: float) -> None:
        pending = [*self.tasks.values(), *self.futures.values(), *(x.future() for x in self.laters.values())]
        if pending:
            await asyncio.wait(pending, timeout=timeout)


class Listener:
    """A socket server feeding a core. ``tokens``: token → capability, or ``None`` (Unix: trusted)."""

    def __init__(self, core: Core, tokens: dict[str, str] | None = None) -> None:
        self.core = core
        self.tokens = tokens
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[ServerConnection] = set()
        # method name → (method, body decoder), filled as methods are first called
        self.decoders: dict[str, tuple[Method, Any]] = {}
        self.last_activity = time.monotonic()
        self.description = ""
        self.unix_path: Path | None = None

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
        loop = asyncio.get_running_loop()
        if path.exists() or path.is_symlink():
            path.unlink()
        self.server = await loop.create_unix_server(lambda: ServerConnection(self), str(path))
        os.chmod(path, 0o600)
        self.unix_path = path
        self.description = f"unix:{path}"
        self.core.listeners.append(self)

    async def start_tcp(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: ServerConnection(self), host, port, ssl=ssl_context, reuse_address=True
        )
        sock = self.server.sockets[0]
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bound = int(sock.getsockname()[1])
        self.description = f"{'tls' if ssl_context else 'tcp'}://{host}:{bound}"
        self.core.listeners.append(self)
        return bound

    async def close(self, grace: float) -> None:
        """Stop accepting; let calls under way finish (at most ``grace`` seconds); close every connection."""
        if self.server is not None:
            self.server.close()
        conns = list(self.connections)
        await asyncio.gather(*(c.drain_calls(grace) for c in conns), return_exceptions=True)
        for c in conns:
            c.close("the store is stopping", "unavailable")
        if self.unix_path is not None:
            try:
                self.unix_path.unlink()
            except OSError:
                pass
        if self in self.core.listeners:
            self.core.listeners.remove(self)
