"""Running a store server: ``tinystore serve DIR`` (and the sidecar and private child servers)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import ipaddress
import logging
import os
import resource
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..addresses import parse_address
from ..clock import Clock
from ..engines import gc_hold
from ..errors import InUseError, InvalidError, PermissionDeniedError
from ..limits import Limits
from ..protocol.frames import PROTOCOL_VERSION
from . import dirlock, paths
from .core import Core
from .dirlock import LOCK, storage_error
from .listener import HANDSHAKE_TIMEOUT, Listener, bind_tcp, load_tokens, tcp_address

log = logging.getLogger("tinystore.server")


@dataclass
class ServeOptions:
    """How to run a server. ``listen``: extra ``tcp://HOST:PORT`` / ``tls://HOST:PORT`` addresses."""

    directory: Path
    listen: list[str] = field(default_factory=list)
    tokens: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    idle: float | None = None  # exit after this long without connections (sidecar)
    parent_pid: int | None = None  # exit when this process is gone (private)
    clock: Clock | None = None
    limits: Limits | None = None
    durability: str = "full"
    mode: str = "serve"  # serve | sidecar | private | embedded
    existing: bool = False  # open only a store that ran there (a sidecar in place of one that ran): Core.existing
    expect_id: str = ""  # with existing: only the store of this id (Core.expect_id)
    handshake_timeout: float = HANDSHAKE_TIMEOUT  # seconds a connection has to finish its handshake


@dataclass
class ListenPlan:
    """The ``--listen`` addresses, checked: (scheme, host, port, TLS context) each, and the tokens."""

    addresses: list[tuple[str, str, int, ssl.SSLContext | None]]
    tokens: dict[str, str] | None


def check_listen(opts: ServeOptions) -> ListenPlan:
    """Check the ``--listen`` addresses, the tokens file and the TLS files before anything is owned or bound.

    Raises ``InvalidError`` naming what is wrong: an address that is not ``tcp://HOST:PORT`` or
    ``tls://HOST:PORT`` (a port from 0 to 65535), a host that does not resolve, ``--listen`` without
    ``--tokens`` or a tokens file that cannot be used (:func:`load_tokens`), ``tls://`` without
    ``--tls-cert``/``--tls-key``, TLS files with no ``tls://`` address to use them (a ``tcp://`` address is
    plain text: they would be silently ignored), ``--tokens`` without ``--listen`` (ignored as well), a
    certificate or key that cannot be read or used.
    """
    parsed: list[tuple[str, str, str, int]] = []
    for addr in opts.listen:
        scheme, host, port = parse_address(addr, "listen address", lowest_port=0)
        parsed.append((addr, scheme, host, port))
    tls_files = [f"--{name}" for name, value in (("tls-cert", opts.tls_cert), ("tls-key", opts.tls_key)) if value]
    if tls_files and not any(scheme == "tls" for _, scheme, _, _ in parsed):
        plain = [addr for addr, scheme, _, _ in parsed if scheme == "tcp"]
        where = f"the address {plain[0]} is tcp:// (plain text)" if plain else "there is no --listen address"
        raise InvalidError(f"{' and '.join(tls_files)} given but {where}: listen on tls://HOST:PORT to use TLS")
    if not parsed:
        if opts.tokens:
            # (a tokens file guards the TCP listeners only: the Unix socket is guarded by its folder, which only
            # the server's user may enter; a file given for nothing would look like protection that is not there)
            raise InvalidError(
                f"--tokens {opts.tokens} given but there is no --listen address: tokens guard TCP listeners only "
                "(the Unix socket is this user's alone); add --listen tcp://HOST:PORT, or leave --tokens out"
            )
        return ListenPlan([], None)
    if not opts.tokens:
        raise InvalidError("--listen needs --tokens FILE: a TCP listener refuses every client without a token")
    tokens = load_tokens(opts.tokens)
    ctx: ssl.SSLContext | None = None
    addresses: list[tuple[str, str, int, ssl.SSLContext | None]] = []
    for addr, scheme, host, port in parsed:
        if scheme == "tls" and ctx is None:
            ctx = tls_context(addr, opts.tls_cert, opts.tls_key)
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as exc:
            raise InvalidError(f"listen address {addr}: the host {host!r} does not resolve ({exc})") from None
        if scheme == "tcp" and not all(_loopback(str(info[4][0])) for info in found):
            # (trial FK: tcp://0.0.0.0 said nothing, while every token, an admin's too, and every row crossed the
            # network in clear text)
            log.warning(
                "listen address %s is plain text on an address other machines may reach: tokens and data cross the "
                "network unencrypted; listen on tls://HOST:PORT (with --tls-cert and --tls-key) or on 127.0.0.1",
                addr,
            )
        addresses.append((scheme, host, port, ctx if scheme == "tls" else None))
    with contextlib.suppress(OSError):
        mode = os.stat(opts.tokens).st_mode & 0o777
        if mode & 0o077:
            log.warning(
                "tokens file %s may be read by other users of this machine (its mode is %s): chmod 600 it",
                opts.tokens,
                oct(mode),
            )
    return ListenPlan(addresses, tokens)


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def tls_context(addr: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    """The server's TLS context from ``cert`` and ``key``; ``InvalidError`` naming the file that is wrong."""
    if not (cert and key):
        raise InvalidError(f"listen address {addr}: tls:// needs --tls-cert and --tls-key")
    for flag, name in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(name, "rb"):
                pass
        except OSError as exc:
            raise InvalidError(f"{flag} {name}: cannot be read: {exc.strerror or exc}") from None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        # (trial DU: OpenSSL asked for an encrypted key's passphrase on the terminal, and a serve with one waited
        # there; with none, it was told as "not a PEM certificate and its private key")
        ctx.load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise InvalidError(
            f"--tls-key {key}: the private key is encrypted (it needs a passphrase, which serve does not ask for): "
            f"give it unencrypted, made so with `openssl pkey -in {key} -out KEY.pem` (a file only its user may "
            "read, chmod 600)"
        ) from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        cert_kinds, key_kinds = _pem_kinds(cert), _pem_kinds(key)
        if "CERTIFICATE" in cert_kinds and "PRIVATE KEY" in key_kinds and getattr(exc, "reason", None) in _NOT_ITS_KEY:
            # a key of another pair: OpenSSL says "key values mismatch", or, for a key of another type (an RSA key
            # for an EC certificate), "no certificate assigned"
            raise InvalidError(
                f"--tls-key {key}: not the private key of the certificate in --tls-cert {cert} (the key of another "
                f"pair, or of another type: {exc})"
            ) from None
        # (trial DH: two files that were no PEM at all were asked whether they were swapped)
        swapped = cert_kinds == {"PRIVATE KEY"} and key_kinds == {"CERTIFICATE"}
        hint = "; are they swapped?" if swapped else ""
        raise InvalidError(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its private key ({exc}){hint}"
        ) from None
    return ctx


class _Encrypted(Exception):
    """The private key asked for a passphrase."""


def _no_passphrase() -> str:
    """The passphrase OpenSSL asks for: none (raises :class:`_Encrypted`), rather than a prompt on the terminal."""
    raise _Encrypted


_NOT_ITS_KEY = frozenset({"KEY_VALUES_MISMATCH", "KEY_TYPE_MISMATCH", "NO_CERTIFICATE_ASSIGNED"})
"""OpenSSL's reasons for a private key that is not the certificate's."""


def _pem_kinds(name: str) -> set[str]:
    """What PEM blocks file ``name`` holds: ``"CERTIFICATE"``, ``"PRIVATE KEY"`` (of any kind: RSA, EC…)."""
    try:
        with open(name, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return set()
    kinds = set()
    if b"-----BEGIN CERTIFICATE-----" in head:
        kinds.add("CERTIFICATE")
    if b"PRIVATE KEY-----" in head:
        kinds.add("PRIVATE KEY")
    return kinds


def bind_error(addr: str, exc: OSError) -> InvalidError:
    """What a failed bind of ``addr`` means, as one clear error."""
    if exc.errno == errno.EADDRINUSE:
        return InvalidError(f"listen address {addr}: the port is already in use")
    if exc.errno == errno.EACCES:
        return InvalidError(f"listen address {addr}: permission denied (ports below 1024 need privileges)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return InvalidError(f"listen address {addr}: not an address of this machine")
    if isinstance(exc, socket.gaierror):
        return InvalidError(f"listen address {addr}: the host does not resolve ({exc})")
    return InvalidError(f"listen address {addr}: cannot listen: {exc.strerror or exc}")


async def bind_listen(plan: ListenPlan) -> list[list[socket.socket]]:
    """Bind (not yet listen on) each ``--listen`` address of ``plan``, before the directory is owned: a port in
    use is refused with nothing made in the directory. Raises ``InvalidError`` (see :func:`bind_error`)."""
    bound: list[list[socket.socket]] = []
    try:
        for scheme, host, port, _ctx in plan.addresses:
            try:
                bound.append(await bind_tcp(host, port))
            except OSError as exc:
                raise bind_error(tcp_address(scheme, host, port), exc) from None
    except BaseException:
        close_sockets(bound)
        raise
    return bound


def close_sockets(bound: list[list[socket.socket]]) -> None:
    for socks in bound:
        for sock in socks:
            sock.close()


async def start_listeners(
    core: Core, opts: ServeOptions, plan: ListenPlan | None = None, bound: list[list[socket.socket]] | None = None
) -> list[Listener]:
    """Listen on the directory's Unix socket and on each ``--listen`` address; write ``DIR/server/address``.

    ``plan``: :func:`check_listen` of ``opts``, when already made; ``bound``: its addresses' sockets from
    :func:`bind_listen` (bound here otherwise)."""
    if plan is None:
        plan = check_listen(opts)
    if bound is None:
        bound = await bind_listen(plan)
    listeners: list[Listener] = []
    sock = paths.socket_path(core.directory)
    try:
        paths.server_dir(core.directory)
        unix = Listener(core, handshake_timeout=opts.handshake_timeout)
        try:
            paths.prepare_socket_dir(sock)
            await unix.start_unix(sock)
        except OSError as exc:
            # something in its way (a folder where the socket goes, a file where its folder goes): said at once,
            # as one error line, not a traceback (trial AS: open() then tried for 20 s)
            raise storage_error(f"store {core.directory}: cannot listen on its socket {sock}", exc) from None
    except BaseException:
        close_sockets(bound)
        raise
    listeners.append(unix)
    tcp: list[str] = []
    for (_scheme, host, _port, ctx), socks in zip(plan.addresses, bound, strict=True):
        lst = Listener(core, plan.tokens, handshake_timeout=opts.handshake_timeout)
        lst.listen_tcp(host, socks, ctx)
        tcp.append(lst.description)
        listeners.append(lst)
    address = {
        "pid": os.getpid(),
        "socket": str(sock),
        "tcp": tcp,
        "version": __version__,
        "protocol": PROTOCOL_VERSION,
        "mode": opts.mode,
        "idle": opts.idle,
        "started": time.time(),
    }
    try:
        paths.write_address(core.directory, address)
    except OSError as exc:
        # (trial DP: a full disk here was a bare OSError, and the sockets listened on, unserved, in an embedded
        # store's process)
        await asyncio.gather(*(lst.close(0) for lst in listeners), return_exceptions=True)
        raise storage_error(f"store {core.directory}: cannot write its address file", exc) from None
    return listeners


COMMAND_WAIT = 10.0
"""Seconds a server waits for a command of the command line that owns its directory (``status``, ``sql``, ``jobs``
opened the store themselves, as no server ran: each lets go as it ends)."""


async def _start_after_commands(core: Core) -> None:
    """``core.start()``, waiting up to :data:`COMMAND_WAIT` while a command of the command line owns the directory
    (trial IT: a health check's ``tinystore status``, run as the service started, made its ``serve`` fail). Raises
    ``InUseError`` for any other owner (a server, an application's embedded store) at once."""
    deadline = time.monotonic() + COMMAND_WAIT
    told = False
    while True:
        try:
            await core.start()
            return
        except InUseError:
            owner = dirlock.owned_by_command(core.directory)
            if owner is None or owner == "serve" or time.monotonic() >= deadline:
                raise
            if not told:
                told = True
                log.info("store %s: the command tinystore %s owns it: waiting for it to end", core.directory, owner)
        await asyncio.sleep(0.1)


async def serve(opts: ServeOptions, ready: Any = None) -> int:
    """Run a server until SIGTERM/SIGINT, ``tinystore stop``, idle exit, or the parent's exit. Returns 0, or
    :data:`~tinystore.server.paths.EXIT_LOST_PLACE` when it stopped because its directory or socket went away.

    Raises ``InUseError`` when another process owns the directory.
    """
    plan = check_listen(opts)  # bad input is refused before the directory is owned
    bound = await bind_listen(plan)  # and a port in use too
    raise_open_files_limit()
    if opts.mode == "private":
        dirlock.private_for = os.getppid()  # (its program: an owner that program started is named so)
    core = Core(
        opts.directory,
        clock=opts.clock,
        limits=opts.limits,
        durability=opts.durability,
        existing=opts.existing,
        expect_id=opts.expect_id,
    )
    core.mode = opts.mode
    try:
        await _start_after_commands(core)
    except BaseException as exc:
        close_sockets(bound)
        if isinstance(exc, PermissionError):
            raise permission_error(opts.directory, exc) from None
        raise
    loop = asyncio.get_running_loop()
    # SIGHUP (the terminal closed, the ssh session dropped) stops as gracefully as SIGTERM (STORE-05), unless
    # it was ignored when we started (``nohup``)
    sigs = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)

    def on_signal(sig: signal.Signals) -> None:
        if core.stopped.is_set():
            return  # (stopped already: the process is about to exit)
        if core.stop_requested.is_set():
            # a second Ctrl-C: the calls under way are interrupted now, not given the rest of their grace
            if not core.grace_over.is_set():
                log.info("%s again: the grace ends now; what calls still run is interrupted and rolled back", sig.name)
                core.end_grace()
            return
        if opts.mode != "private":
            log.info("%s: stopping", sig.name)  # (sidecar.log tells how each sidecar stopped)
        core.stop_requested.set()

    # (before the listeners: their start writes the address file, and a stop sent as soon as it is read, SIGTERM,
    # came before the handlers and killed the process, status 143)
    for sig in sigs:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        listeners = await start_listeners(core, opts, plan, bound)
    except BaseException as exc:
        await core.stop()
        if isinstance(exc, PermissionError):
            raise permission_error(opts.directory, exc) from None
        raise
    if ready is not None:
        ready(listeners)
    watchers: list[asyncio.Task[Any]] = []
    if opts.idle:
        watchers.append(asyncio.ensure_future(_idle_watch(core, listeners, opts.idle)))
    if opts.parent_pid:
        watchers.append(asyncio.ensure_future(_parent_watch(core, opts.parent_pid)))
    watchers.append(asyncio.ensure_future(_place_watch(core, stop_when_unreachable=opts.mode != "serve")))
    try:
        await core.stop_requested.wait()
    finally:
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await core.stop(core.stop_grace)  # (its address file goes with it)
        for sig in sigs:
            # stopped: a signal that comes now (a second Ctrl-C just too late) must not end the process with a
            # failure status, which says it did not stop cleanly (trial EH: 130, 143)
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)
        if opts.mode != "private":  # (a private server's log is its program's standard error)
            log.info("stopped")
    return core.exit_status


def permission_error(directory: Path, exc: PermissionError) -> PermissionDeniedError:
    """A store directory this process may not write, as one clear error (as an embedded ``open`` gives it)."""
    return PermissionDeniedError(
        f"store {directory}: permission denied on {exc.filename or directory}: this user (uid {os.getuid()}) "
        "cannot own a store there"
    )


def raise_open_files_limit() -> None:
    """Raise this process's soft limit on open files to the hard one: each connection takes a descriptor."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.debug("open files limit raised from %d to %d", soft, want)
    except (OSError, ValueError) as exc:  # pragma: no cover
        log.info("cannot raise the open files limit: %s", exc)


async def _idle_watch(core: Core, listeners: list[Listener], idle: float) -> None:
    while True:
        await asyncio.sleep(min(idle / 4, 1.0))
        if any(lst.connections for lst in listeners):
            continue
        last = max(lst.last_activity for lst in listeners)
        if time.monotonic() - last >= idle:
            log.info("no connections for %.1fs: stopping", idle)
            core.stop_requested.set()
            return


async def _parent_watch(core: Core, pid: int) -> None:
    while True:
        await asyncio.sleep(0.25)
        if os.getppid() != pid:
            core.stop_requested.set()
            return


PLACE_CHECK = 1.0
"""Seconds between two looks at the store's directory (its LOCK) and its socket file."""


def _same_file(path: Path, ino: tuple[int, int]) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ino


async def _place_watch(core: Core, stop_when_unreachable: bool) -> None:
    """Stop the server when its directory was removed, moved or replaced while it ran (``DIR/LOCK`` is no
    longer the file it locked): SQLite cannot go on with files that moved, and every write acknowledged into
    removed files would be lost. Its clients do not make a new store at the old path (the SDK refuses to). A
    sidecar or private server whose socket file was removed (no new client can reach it; the next ``open``
    would start another and fail) stops too; a ``tinystore serve`` logs it, once, and goes on for its
    connections and TCP clients."""
    lock_fd = core._lock.fd
    if lock_fd is None:
        return
    st = os.fstat(lock_fd)
    lock_ino = (st.st_dev, st.st_ino)
    sock = paths.socket_path(core.directory)
    try:
        sst = os.stat(sock)
        sock_ino: tuple[int, int] | None = (sst.st_dev, sst.st_ino)
    except OSError:
        sock_ino = None
    told_sock = False
    while True:
        await asyncio.sleep(PLACE_CHECK)
        removed = os.fstat(lock_fd).st_nlink == 0
        if removed or not _same_file(core.directory / LOCK, lock_ino):
            log.error(
                "store %s: its directory was %s while the server ran: stopping (SQLite cannot go on with files that "
                "moved, and writes into removed files would be lost)",
                core.directory,
                "removed" if removed else "moved or replaced",
            )
            core.exit_status = paths.EXIT_LOST_PLACE
            core.stop_requested.set()
            return
        if sock_ino is not None and not told_sock and not _same_file(sock, sock_ino):
            if stop_when_unreachable:
                log.error(
                    "store %s: its socket %s was removed: no new client can reach it; stopping", core.directory, sock
                )
                core.exit_status = paths.EXIT_LOST_PLACE
                core.stop_requested.set()
                return
            log.error(
                "store %s: its socket %s was removed: new local clients cannot reach this server (restart it)",
                core.directory,
                sock,
            )
            told_sock = True


def run(opts: ServeOptions, ready: Any = None) -> int:
    """Run :func:`serve` on uvloop when available: the whole of this process (``tinystore serve``, a sidecar, a
    private server), so a big queue's load may freeze what it made (see ``engines.gc_hold``)."""
    gc_hold.FREEZE = True
    if not faulthandler.is_enabled():
        # a crash in C code (an extension out of memory: trial CN's server died of SIGSEGV with no word of why)
        # leaves the Python stacks of every thread in the log: stderr, a sidecar's sidecar.log
        faulthandler.enable()
    try:
        import uvloop

        return uvloop.run(serve(opts, ready))
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(opts, ready))


def announce_ready(listeners: list[Listener]) -> None:
    """Tell a parent waiting on our stdout that we serve (one line, then stdout is closed)."""
    try:
        sys.stdout.write("ready " + " ".join(lst.description for lst in listeners) + "\n")
        sys.stdout.flush()
        # Put /dev/null in place of the pipe in one step (dup2 closes the pipe): fd 1 must never be free, or
        # the next connection accepted gets it, and the event loop (libuv) never closes fds 0-2 — a connection
        # it "closed" (a GOAWAY, a stop) would stay open, and its client would wait for ever.
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    except OSError:
        pass
