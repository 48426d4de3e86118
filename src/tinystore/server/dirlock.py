"""One owner per directory: an OS file lock (``flock``) on ``DIR/LOCK`` (STORE-01)."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shlex
import time
import weakref
from pathlib import Path

from ..durations import format_seconds
from ..errors import CorruptError, InUseError, PermissionDeniedError, TinystoreError, UnavailableError

LOCK = "LOCK"

# descriptors a child made by fork() must not keep: the LOCK of a directory this process owns (the lock goes
# with the open file, so a child that outlived this process would keep the directory owned by no server)
_CLOSE_IN_CHILD: set[int] = set()


def close_in_child(fd: int) -> None:
    """Have a child made by ``fork()`` let go of ``fd`` at once (the LOCK, a listening socket)."""
    _CLOSE_IN_CHILD.add(fd)


def keep_in_child(fd: int) -> None:
    """Forget ``fd`` (it is closed here): a child made later has nothing to close."""
    _CLOSE_IN_CHILD.discard(fd)


def _after_fork_in_child() -> None:
    """In a child made by ``fork()``: it owns no directory (the lock is the parent's); point each such
    descriptor at ``/dev/null``, which lets go of the file or socket; the number stays open, so the child's
    copies of the objects that hold it close it harmlessly."""
    _HELD.clear()  # (the parent's: trial AS's forked child was told it owned the store and could not open it)
    fds = list(_CLOSE_IN_CHILD)
    _CLOSE_IN_CHILD.clear()
    if not fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in fds:
            try:
                os.dup2(null, fd, inheritable=False)
            except OSError:
                pass
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_after_fork_in_child)


def storage_error(where: str, exc: OSError) -> TinystoreError:
    """What the file system refused while the store starts, as one clear error: a full disk
    (``UnavailableError``), a read-only file system or missing permission (``PermissionDeniedError``)."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UnavailableError(f"{where}: {why}: the disk is full; free some space and open the store again")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return PermissionDeniedError(
            f"{where}: {why}: a store writes its directory (its lock, its epoch, its databases' journals), even to read"
        )
    return UnavailableError(f"{where}: {why}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


STARTING = 10.0
"""Seconds after taking a directory within which an owner that does not serve its socket yet is taken to be
starting (opening its engines), not to have been opened with ``serve=False``."""


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (Linux's /proc), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _args_of(pid: int) -> list[bytes] | None:
    """The command line of process ``pid`` (``/proc/PID/cmdline``), or ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def _command_of(pid: int) -> str | None:
    """The ``tinystore`` command process ``pid`` runs (``"serve"``, ``"sql"``, ``"jobs"``…), as far as ``/proc``
    tells; ``None`` for another program (an application's embedded store)."""
    args = _args_of(pid)
    if args is None:
        return None
    # `tinystore CMD …` (the script, or `python path/to/tinystore CMD`), or `python -m tinystore CMD …`; not an
    # application given a path that ends so (`python app.py /data/tinystore …`)
    if os.path.basename(args[0]) == b"tinystore" and len(args) > 1:
        return args[1].decode(errors="replace") if args[1][:1].isalpha() else None
    # the interpreter's: its options (`-u`, `-X dev`: trial CT), then `-m tinystore CMD` or `path/tinystore CMD`
    i = 1
    while i < len(args) and args[i][:1] == b"-" and args[i] != b"-m":
        i += 2 if args[i] in (b"-X", b"-W") else 1
    if i < len(args) and args[i] == b"-m":
        i += 1
        if i >= len(args) or args[i] != b"tinystore":
            return None
    elif i >= len(args) or os.path.basename(args[i]) != b"tinystore":
        return None
    if i + 1 < len(args) and args[i + 1][:1].isalpha():
        return args[i + 1].decode(errors="replace")
    return None


def started_by_sdk(pid: int) -> bool:
    """Whether process ``pid`` is a server the SDK started (``tinystore serve DIR --sidecar``, or ``--private``),
    as far as ``/proc`` tells: its command is ``serve`` too, and only these flags set it apart from one a user
    started."""
    args = _args_of(pid) or []
    return b"--sidecar" in args or b"--private" in args


def changing_hands(directory: Path) -> bool:
    """Whether ``DIR/LOCK`` names no live owner (empty, or a pid that is gone) though it is held: its new owner has
    taken it and not written its pid yet (trial CT: a command that read it then gave up at once), or a process
    that inherited it."""
    try:
        owner = DirLock(directory).path.read_text(errors="replace").strip()
    except OSError:
        return False
    return not owner.isdigit() or not _alive(int(owner))


def owned_by_command(directory: Path) -> str | None:
    """The command of the ``tinystore`` command line that owns ``directory`` without serving its socket, else
    ``None``: ``"serve"`` (a server still starting), or another (``"sql"``…: it opened the store itself, as no
    server ran, for as long as it runs)."""
    from . import paths

    try:
        owner = DirLock(directory).path.read_text(errors="replace").strip()
    except OSError:
        return None
    if not owner.isdigit() or not _alive(int(owner)):
        return None
    info = paths.read_address(directory)
    if info is not None and str(info.get("pid")) == owner:
        return None
    return _command_of(int(owner))


def socket_gone(directory: Path) -> str | None:
    """The socket that the live server of ``directory`` said it serves (in its address file), when that socket
    file is gone (removed while the server ran: a server writes its address only once it listens); else None."""
    from . import paths

    info = paths.read_address(directory)
    if not info or not str(info.get("pid", "")).isdigit() or not _alive(int(info["pid"])):
        return None
    sock = info.get("socket")
    if not isinstance(sock, str) or os.path.exists(sock):
        return None
    return sock


def is_store(directory: Path) -> bool:
    """Whether ``directory`` holds a store: every store has its ``LOCK`` file, made when it is first opened
    (and kept: the lock is let go, the file stays)."""
    return (directory / LOCK).is_file()


def lock_holders(directory: Path) -> set[int] | None:
    """The pids that hold ``DIR/LOCK`` (Linux's ``/proc/locks``: a lock taken with ``flock`` names the process
    that took it), without taking it; ``None`` when that cannot be told (no ``/proc/locks``, no ``LOCK``)."""
    try:
        st = os.stat(directory / LOCK)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders: set[int] = set()
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146658 0 EOF" (a blocked waiter's line has "->" after its number)
        if "FLOCK" in fields and where in fields:
            i = fields.index(where)
            if fields[i - 1].isdigit():
                holders.add(int(fields[i - 1]))
    return holders


def unreachable_owner(directory: Path) -> InUseError | None:
    """The error of a directory whose owner (the live process that wrote ``LOCK``) cannot be connected to for a
    lasting reason: it wrote no address of its own and took the directory over :data:`STARTING` ago, and is no
    ``tinystore serve`` (an embedded store opened with ``serve=False``), or its socket was removed. ``None``
    otherwise (no owner, one still starting, one that serves): a client waits for it rather than start a sidecar
    that could only lose."""
    lock = DirLock(directory)
    try:
        owner = lock.path.read_text(errors="replace").strip()
    except OSError:
        return None
    if not owner.isdigit() or int(owner) == os.getpid() or not _alive(int(owner)):
        return None
    from . import paths

    info = paths.read_address(directory)
    if info is None or str(info.get("pid")) != owner:
        try:
            age = max(0.0, time.time() - os.stat(lock.path).st_mtime)
        except OSError:
            return None
        # (a `tinystore serve` that took the directory listens once its engines are open, however long a slow
        # disk makes that: it is waited for, within the caller's deadline; trial CM. So is a command such as
        # `tinystore sql`, which lets go when it ends: trial CR)
        if _command_of(int(owner)) is not None:
            return None
        # (open, and will not serve: told at once, trial DI)
        return lock._in_use(owner) if age >= STARTING or paths.unserved_by(directory) == int(owner) else None
    return lock._in_use(owner) if socket_gone(directory) is not None else None


def owner_pid(directory: Path) -> int | None:
    """The live process (not this one) that owns ``directory`` (resolved) by ``LOCK``, whether it serves the socket
    or not (an embedded store, a command that opened the store itself, a server starting or without its
    ``server/`` folder); None when none does."""
    try:
        owner = (directory / LOCK).read_text(errors="replace").strip()
    except OSError:
        return None
    if not owner.isdigit() or int(owner) == os.getpid() or not _alive(int(owner)):
        return None
    holders = lock_holders(directory)
    if holders is not None and int(owner) not in holders:
        return None  # (a pid left in LOCK by an owner killed outright, perhaps another process's now)
    return int(owner)


def is_server(pid: int) -> bool:
    """Whether process ``pid`` is a ``tinystore serve``."""
    return _command_of(pid) == "serve"


def live_owner(directory: Path) -> InUseError | None:
    """The error naming :func:`owner_pid`'s process; None when none owns ``directory``. For a command that found no
    server to ask: it says who owns the directory, not that nobody does."""
    owner = owner_pid(directory)
    return None if owner is None else DirLock(directory)._in_use(str(owner))


def held_here(directory: Path) -> InUseError | None:
    """The error of owning ``directory`` (resolved) again when this process already holds its lock (an embedded
    store, or a server of this process), else None: a private server started now would fail on the lock, and
    call this process "another process"."""
    lock = DirLock(directory)
    return lock._in_use(str(os.getpid())) if lock.path in _HELD else None


def unserved_here(directory: Path) -> InUseError | None:
    """The error of connecting to ``directory`` (resolved) when this process holds its lock but does not serve its
    socket (an embedded store opened with ``serve=False``), else None: no sidecar can start, and none will
    serve it."""
    from . import paths

    lock = DirLock(directory)
    if lock.path in _HELD:
        loop = _LOOPS.get(lock.path)
        if loop is not None and loop.is_closed():
            # (its socket is served by a loop that has ended: trial FU, a connection waited 15 s, then the server
            # was said to be suspended)
            return lock._in_use(str(os.getpid()))
    if lock.path not in _HELD or (paths.read_address(directory) or {}).get("pid") == os.getpid():
        return None
    return InUseError(
        f"store {directory}: this process (pid {os.getpid()}) already owns the directory without serving its "
        "socket (embedded=True, serve=False): nothing can connect to it; use that store, or open it with "
        "serve=True"
    )


class DirLock:
    """Holds ``DIR/LOCK`` for the life of the process (or until :meth:`release`)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock at once, or raise ``InUseError`` naming the directory and the owner's pid;
        ``PermissionDeniedError`` or ``UnavailableError`` when the file system refuses the file (read-only, full).
        A child this process forks does not keep the lock."""
        try:
            # (no symlink followed: one planted there would have this process truncate and write its target)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except PermissionError:
            raise  # the caller names the store and this process's user
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _planted(self.path) from None
            raise storage_error(f"store {self.path.parent}: cannot open {LOCK}", exc) from None
        try:
            os.fchmod(fd, 0o600)  # (a store made before files were 0600: its user's alone from now on)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise self._in_use(owner) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise storage_error(f"store {self.path.parent}: cannot write {LOCK}", exc) from None
        self.fd = fd
        _HELD.add(self.path)
        try:
            _LOOPS[self.path] = asyncio.get_running_loop()
        except RuntimeError:
            _LOOPS.pop(self.path, None)
        close_in_child(fd)

    def _in_use(self, owner: str) -> InUseError:
        where = f"store {self.path.parent}"
        if owner == str(os.getpid()) and self.path in _HELD:
            loop = _LOOPS.get(self.path)
            if loop is not None and loop.is_closed():
                # (trial FT: a store a test forgot to close, its asyncio.run over: "use that store" could not be
                # done, and the other ways in said the server was suspended)
                return InUseError(
                    f"{where}: this process (pid {owner}) opened it (embedded=True, or a private server) in an event "
                    "loop that has ended without closing it: the directory stays held until this process exits. "
                    "Close each store before its loop ends (await store.close(), or async with await "
                    "tinystore.open(...))"
                )
            return InUseError(
                f"{where}: this process (pid {owner}) already owns the directory (another store opened with "
                "embedded=True, or a private server); use that store instead of opening it twice"
            )
        if not owner.isdigit() or owner == str(os.getpid()) or not _alive(int(owner)):
            # the pid in LOCK is not the owner: a process that inherited the lock (forked by the one that wrote
            # it, before this version closed it in children), or one that locks the file by other means
            return InUseError(
                f"{where}: the directory is locked by a process other than the one that wrote {LOCK} (pid "
                f"{owner}, which {'is this one' if owner == str(os.getpid()) else 'is gone'}): a process it "
                f"forked, or another program; `fuser -v {self.path}` names it"
            )
        from . import paths

        info = paths.read_address(self.path.parent)
        if info is None or str(info.get("pid")) != owner:
            # its owner wrote no address of its own: it does not serve the directory's socket, so nothing can
            # connect to it. One that took the directory moments ago is most likely starting (a store writes its
            # address once it listens), which serve=False cannot be told apart from: trial BU's second uvicorn
            # worker was told to open the store with serve=True, its owner an embedded store that did, starting
            try:
                age = max(0.0, time.time() - os.stat(self.path).st_mtime)  # (its owner writes LOCK as it takes it)
            except OSError:
                age = 0.0
            # (open, and will not serve: told so at once, not taken to be starting; trial DH)
            unserved = paths.unserved_by(self.path.parent) == int(owner)
            command = _command_of(int(owner))
            server = command == "serve"
            if command is not None and not server:
                # (trial CR: an operator's `tinystore sql` while no server ran was called an embedded store opened
                # with serve=False, and the advice was to open it there with serve=True)
                return InUseError(
                    f"{where}: the directory is owned by the command `tinystore {command}` (pid {owner}), which "
                    "opened the store itself, as no server ran, for as long as it runs: open the store again once it "
                    f"has ended (to share a store with commands, run a server: tinystore serve {self.path.parent}; "
                    "or open it with tinystore.open(), which starts one)"
                )
            if server and age >= STARTING:
                # (a `tinystore serve` listens once started, however long a slow disk makes that: trial CM)
                return InUseError(
                    f"{where}: the directory is owned by a tinystore server (pid {owner}) that took it "
                    f"{format_seconds(round(age, 3))} ago and does not serve its socket: it is still starting (its "
                    "engines open slowly: a slow disk, a long recovery), or its server/ folder was removed while it "
                    f"ran (then stop it: tinystore stop {self.path.parent}, or SIGTERM; both graceful)"
                )
            if age < STARTING and not unserved:
                return InUseError(
                    f"{where}: the directory is owned by {'a tinystore server' if server else 'another process'} "
                    f"(pid {owner}) that took it {format_seconds(round(age, 3))} ago and does not serve its socket "
                    f"yet: {'it is' if server else 'most likely it is'} still starting (a store serves its socket "
                    "once its engines are open); open the store again in a moment, with tinystore.open() to "
                    "connect to it rather than own it"
                )
            return InUseError(
                f"{where}: the directory is owned by another process (pid {owner}), which does not serve its "
                "socket (an embedded store opened with serve=False, or one whose server/ folder was removed while "
                "it ran): nothing can connect to it; use the store in that process, or open it there with serve=True"
            )
        sock = socket_gone(self.path.parent)
        if sock is not None:
            return InUseError(
                f"{where}: the directory is owned by another process (pid {owner}) whose socket {sock} is gone "
                f"(removed while it ran): nothing can connect to it here; stop it (tinystore stop {self.path.parent}, "
                "or SIGTERM: both graceful) and open the store again"
            )
        parent = _parent_of(int(owner)) if info.get("mode") == "private" else None
        if parent is not None and parent in (os.getpid(), private_for):
            # (a private server of this program, its store not closed: it was called "another process". The check
            # runs in the program, or in the private server it starts next, which fails on the lock)
            return InUseError(
                f"{where}: the directory is owned by a private server (pid {owner}) that this program (pid {parent}) "
                "started with open(..., private=True), whose store is still open, or was left unclosed by an event "
                "loop that has ended: the server stays until that program exits. Close each store before its loop ends "
                "(await store.close(), or async with await tinystore.open(...)); or connect to it with "
                "tinystore.open() instead of owning it"
            )
        if info.get("mode") == "sidecar":
            # (trial BL: after `tinystore lock DIR …`, whose sidecar stays a while, an embedded open said only this)
            idle = info.get("idle")
            if isinstance(idle, int | float) and idle > 0:
                stays = f"which exits by itself after {format_seconds(idle)} without connections"
            elif "idle" in info:  # (idle "0s": it stays until stopped; trial BP)
                stays = "which stays until it is stopped"
            else:  # (a server of an earlier version, which did not say)
                stays = "which exits by itself when idle"
            return InUseError(
                f"{where}: the directory is owned by its sidecar server (pid {owner}, started by tinystore.open() or "
                f"a command such as `tinystore lock`), {stays}; `tinystore stop "
                f"{shlex.quote(str(self.path.parent))}` stops it now. Or connect to it with tinystore.open() instead "
                "of owning it"
            )
        return InUseError(
            f"{where}: the directory is owned by another process (pid {owner}); connect to it with "
            "tinystore.open() instead of owning it"
        )

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.path)
            _LOOPS.pop(self.path, None)
            keep_in_child(self.fd)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


private_for: int | None = None
"""The pid of the program this process is the private server of, if it is one (set as it starts)."""

_HELD: set[Path] = set()
"""The LOCK files this process holds."""
_LOOPS: weakref.WeakValueDictionary[Path, asyncio.AbstractEventLoop] = weakref.WeakValueDictionary()
"""The event loop each was taken in (gone with it once nothing else holds it)."""


def _planted(path: Path) -> PermissionDeniedError:
    return PermissionDeniedError(
        f"store {path.parent}: {path.name} is a symbolic link; a store's files are its own (someone who may write "
        "its directory planted it?): remove it, and start again"
    )


def next_epoch(directory: Path, now_ms: int, ran_before: bool = False) -> int:
    """The store's epoch for this start: ``max(now_ms, last + 1)``, saved (fsync) before it is used.

    It only grows, whatever the wall clock does, so fences (``epoch << 64 | counter``) and message ids
    (``<epoch>-<seq>``) never repeat across restarts (LOCK-02). Raises ``CorruptError`` when the file is there
    but does not hold a number, or is missing from a store that ran before (``ran_before``: its
    ``STARTED`` was there) and has its ``sql/`` folder: starting from the wall clock then could give fences
    that went out before.
    """
    path = directory / "EPOCH"
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as f:
            text = f.read()
    except FileNotFoundError:
        text = None
        if ran_before and (directory / "sql").is_dir():
            # (trial DF: a store whose EPOCH was removed started from the wall clock, without a word: behind the
            # saved epoch, as after a clock stepped back, its fences went below those it gave before). A store
            # that ran left its STARTED, and its sql/ folder is made after its EPOCH is written, databases
            # or not (trial DI: a store of locks only). A first start stopped before it wrote EPOCH left neither;
            # SQLite files put in sql/ for a new store to take up come without STARTED
            raise CorruptError(
                f"{path}: is missing, though the store has run before (its sql/ folder is there, and the mark a "
                "start leaves: STARTED, or server/started of an earlier version). Fences grow across restarts "
                "only from it (LOCK-02): write in it a number above every epoch the store gave, such as the current "
                "time in ms plus a day, to start again"
            ) from None
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
            raise _planted(path) from None
        raise CorruptError(f"{path}: cannot be read ({exc}); it keeps the store's last epoch (LOCK-02)") from None
    last = 0
    if text is not None:
        try:
            last = int(text.strip())
        except ValueError:
            raise CorruptError(
                f"{path}: holds {text[:40]!r}, not the store's last epoch (a number of ms). Fences grow across "
                "restarts only from it (LOCK-02): write in it a number above every epoch the store gave, such as "
                "the current time in ms plus a day, to start again"
            ) from None
        if last < 0:
            raise CorruptError(f"{path}: holds a negative epoch ({last})")
    epoch = max(now_ms, last + 1)
    try:
        write_private(path, f"{epoch}\n", sync=True)
    except PermissionError:
        raise  # the caller names the store and this process's user
    except OSError as exc:
        raise storage_error(f"store {directory}: cannot save its epoch in {path.name}", exc) from None
    return epoch


def write_private(path: Path, text: str, *, sync: bool = False) -> None:
    """Write ``text`` to ``path`` (mode 0600) through ``path.tmp`` and a rename, following no symbolic link (one
    planted at ``path.tmp`` is removed, one at ``path`` replaced); with ``sync``, the file and then its folder are
    synced. Raises ``OSError``, the tmp file removed."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.unlink(missing_ok=True)  # (a leftover, or a symlink planted there: never followed)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
