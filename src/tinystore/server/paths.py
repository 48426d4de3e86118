"""Where a store's server can be reached: ``DIR/server/`` (mode 0700) and its Unix socket.

When ``DIR/server/sock`` is too long for a socket address (``sun_path`` holds 108 bytes on Linux), the
socket goes to ``$XDG_RUNTIME_DIR/tinystore/`` or ``/tmp/tinystore-<uid>/`` (mode 0700), named by a hash of
the directory, and ``DIR/server/address`` says where.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

MAX_SOCKET_PATH = 100


def make_directory(path: Path, what: str) -> None:
    """Make the store's directory ``path`` (and its parents) when missing. ``what`` starts the error message.

    Raises ``InvalidError`` when ``path`` or a parent is not a directory or the OS cannot make it (a read-only
    or virtual file system), and ``PermissionError`` as it is (the caller says it its own way)."""
    from ..errors import InvalidError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)  # a store's files are its user's: no one else may enter a new one
    except (FileExistsError, NotADirectoryError):
        raise InvalidError(f"{what}: {path} is not a directory") from None
    except PermissionError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            from .dirlock import storage_error

            raise storage_error(f"{what}: cannot make the store's directory {path}", exc) from None
        raise InvalidError(f"{what}: cannot make the store's directory {path}: {exc.strerror or exc}") from None


def _private_dir(d: Path, what: str, parents: bool = True) -> None:
    """Make the folder ``d`` (mode 0700) when missing (its parents too, unless not ``parents``: then a missing
    parent is ``FileNotFoundError``); then it must be a folder, not a symlink, of this process's user, and it is
    set to 0700 (on the folder itself, opened without following a link). Another user's folder there (planted
    before the server started, in a shared /tmp or a world-writable store directory) would let that user replace
    the socket, and read what clients send: ``PermissionDeniedError`` names it."""
    from ..errors import PermissionDeniedError

    d.mkdir(mode=0o700, parents=parents, exist_ok=True)
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionDeniedError(
                f"{what}: {d} is a symbolic link or not a folder; the socket goes only in a folder of this user's "
                "own (remove it, and start again)"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise PermissionDeniedError(
                f"{what}: {d} belongs to another user (uid {st.st_uid}; this process runs as uid {os.getuid()}), "
                "who could replace the socket and read what clients send; remove it, and start again"
            )
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def check_store_dir(directory: Path, what: str) -> None:
    """Refuse (``PermissionDeniedError``) a store directory every user may write (another user could plant its
    files: ``LOCK``, ``EPOCH``, ``sql/``, the databases), and a ``sql`` folder in it that is a symbolic link."""
    from ..errors import PermissionDeniedError

    st = os.stat(directory)
    if st.st_mode & 0o002:
        raise PermissionDeniedError(
            f"{what}: the store's directory {directory} may be written by every user (mode "
            f"{stat.S_IMODE(st.st_mode):o}): another user could plant its files; `chmod o-w {directory}` (or 700)"
        )
    sql = directory / "sql"
    if sql.is_symlink():
        raise PermissionDeniedError(
            f"{what}: {sql} is a symbolic link; a store's databases are in a folder of its own: remove it, and "
            "start again"
        )
    try:
        if sql.stat().st_uid == os.getuid():
            os.chmod(sql, 0o700)  # (a store made before its folders were 0700)
    except OSError:
        pass
    unfinished = unfinished_backup(directory)
    if unfinished is not None:
        from ..errors import CorruptError

        raise CorruptError(
            f"{what}: {directory} is a backup that did not finish ({unfinished}): some of its databases may be "
            "missing or cut short, so it is not opened as a store (a new, empty one would have been made there). "
            "Remove it and back up again"
        )


BACKUP_UNFINISHED = "BACKUP-UNFINISHED"
"""``DEST/BACKUP-UNFINISHED``: made first by a backup into ``DEST``, removed last, once the copy is whole."""


def unfinished_backup(directory: Path) -> str | None:
    """What shows that ``directory`` is a backup that did not finish, or ``None``: its :data:`BACKUP_UNFINISHED`
    mark, or (a backup of an earlier version, which made none) a ``sql/NAME.db.partial`` with no ``LOCK`` (trial HJ:
    `tinystore serve` on one made a new, empty store there, with a new epoch, without a word)."""
    if os.path.lexists(directory / BACKUP_UNFINISHED):
        return f"its {BACKUP_UNFINISHED} mark is there"
    if os.path.lexists(directory / "LOCK"):
        return None
    try:
        partial = next((e.name for e in os.scandir(directory / "sql") if e.name.endswith(".db.partial")), None)
    except OSError:
        return None
    return None if partial is None else f"sql/{partial} is there and no LOCK"


def server_dir(directory: Path, make_store: bool = True) -> Path:
    """``DIR/server``, created with mode 0700 (only its user can enter); see :func:`_private_dir`. Not
    ``make_store``: ``DIR`` itself is never made (``FileNotFoundError`` when it is missing)."""
    d = directory / "server"
    try:
        _private_dir(d, f"store {directory}", parents=make_store)
    except PermissionError:
        raise  # the caller names the store and this process's user
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not make_store:
            raise  # (the caller says the store is gone)
        from .dirlock import storage_error

        raise storage_error(f"store {directory}: cannot make {d}", exc) from None
    return d


def check_socket_dir(sock: Path) -> None:
    """Before a client connects to ``sock``: a socket outside a store's ``DIR/server`` (the short path of
    :func:`socket_path`, named by this user's uid) must lie in a folder of this user's own that no one else may
    enter, else ``PermissionDeniedError``: another user could have put a socket of theirs there."""
    from ..errors import PermissionDeniedError

    if sock.name == "sock" and sock.parent.name == "server":
        return  # DIR/server: the store's directory guards it
    try:
        st = os.lstat(sock.parent)
    except FileNotFoundError:
        return  # no server there: connecting fails, with its own message
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionDeniedError(
            f"the socket folder {sock.parent} is not a folder of this user's own that no one else may enter (uid "
            f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; this process runs as uid {os.getuid()}): another "
            "user could have put a socket of theirs there; remove it, and start the server again"
        )


def socket_path(directory: Path) -> Path:
    """The Unix socket of ``directory``'s server (deterministic, so clients can find it without a file)."""
    directory = directory.resolve()
    p = directory / "server" / "sock"
    if len(os.fsencode(p)) <= MAX_SOCKET_PATH:
        return p
    digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:24]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "tinystore"
        if runtime and os.path.isdir(runtime)
        else Path(tempfile.gettempdir()) / f"tinystore-{os.getuid()}"
    )
    return base / f"{digest}.sock"


def served_socket(directory: Path) -> Path:
    """The socket at which ``directory``'s server is reached: the one its live server wrote in its address file
    when that is another than :func:`socket_path` (a long path's socket goes under the runtime or temporary
    folder of the server's environment: a client under another ``XDG_RUNTIME_DIR`` or ``TMPDIR``, as cron or a
    service runs it, looked in its own and started sidecars that could not own the store: trial AS), else
    :func:`socket_path`."""
    own = socket_path(directory)
    info = read_address(directory.resolve())
    sock = info.get("socket") if info else None
    if not isinstance(sock, str) or sock == str(own):
        return own
    pid = info.get("pid") if info else None
    try:
        if not isinstance(pid, int) or pid <= 0:
            return own
        os.kill(pid, 0)
    except ProcessLookupError:
        return own
    except OSError:
        pass  # (another user's: its socket is its to say)
    try:
        if not stat.S_ISSOCK(os.stat(sock).st_mode):
            return own
    except OSError:
        return own
    return Path(sock)


def prepare_socket_dir(path: Path) -> None:
    """The folder of the socket ``path`` (see :func:`_private_dir`)."""
    _private_dir(path.parent, f"socket {path}")


def address_file(directory: Path) -> Path:
    return directory / "server" / "address"


EXIT_LOST_PLACE = 75
"""The exit status of a server that stopped because its directory or its socket file went away (sysexits'
EX_TEMPFAIL): not a stop anyone asked for, which exits 0."""


def write_address(directory: Path, info: dict[str, Any]) -> None:
    """Write ``DIR/server/address`` atomically (JSON: pid, socket, tcp, version, protocol, started, and the
    directory it is the address of)."""
    st = os.stat(directory)
    info = {**info, "directory": info.get("directory") or str(directory.resolve()), "dir_id": [st.st_dev, st.st_ino]}
    path = address_file(directory)
    _write_atomically(path, json.dumps(info, indent=2))


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.tmp`` and a rename; the tmp file removed when it fails."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def mark_stopping(directory: Path, until: float) -> None:
    """Say in ``DIR/server/address`` (when this process wrote it) that its server is stopping, its calls under
    way having until ``until`` (Unix time): a client that opens the store meanwhile waits for the directory
    instead of failing as if another process kept it."""
    info = read_address(directory)
    if info and info.get("pid") == os.getpid():
        info["stopping_until"] = until
        write_address(directory, info)


def remove_address(directory: Path) -> None:
    """Remove ``DIR/server/address`` when this process wrote it (a server letting the directory go)."""
    info = read_address(directory)
    if info and info.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            address_file(directory).unlink()


def unserved_file(directory: Path) -> Path:
    return directory / "server" / "unserved"


def mark_unserved(directory: Path) -> None:
    """Say in ``DIR/server/unserved`` (its pid) that this process owns the directory, open, and will not serve
    its socket (an embedded store opened with ``serve=False``): another process is told so at once, rather than
    that the owner is most likely still starting (trial DH). Errors are ignored: the file only words a message."""
    from ..errors import TinystoreError

    with contextlib.suppress(OSError, TinystoreError):  # (server_dir's own errors: a full disk, say)
        server_dir(directory)
        unserved_file(directory).write_text(f"{os.getpid()}\n")


def unserved_by(directory: Path) -> int | None:
    """The pid ``DIR/server/unserved`` names (see :func:`mark_unserved`), or ``None``."""
    try:
        text = unserved_file(directory).read_text(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def remove_unserved(directory: Path) -> None:
    """Remove ``DIR/server/unserved``; called by the directory's owner only (the file is its own, or was left by
    an owner that was killed)."""
    with contextlib.suppress(OSError):
        unserved_file(directory).unlink()


STARTED = "STARTED"
"""``DIR/STARTED``: written by every start of a server of the directory once its ``EPOCH`` is (see
:func:`mark_started`)."""


def started_file(directory: Path) -> Path:
    return directory / STARTED


def mark_started(directory: Path, epoch: int) -> None:
    """Say in ``DIR/STARTED`` (the epoch of its last start) that a server of the directory started: what tells that
    the store ran before when its ``EPOCH`` is missing (see ``dirlock.next_epoch``); not its ``LOCK``, which a first
    start that failed leaves (trial DN), nor its ``server/`` folder, which a client makes (its ``spawning`` and
    ``sidecar.log``) before the sidecar it starts runs (trial DK). Beside ``EPOCH`` and ``LOCK``, not in
    ``server/`` (trial DS: that folder, its runtime files, cleaned out with the store's EPOCH lost, and the store
    that ran was taken as new, its fences below those it gave). Errors are ignored: the file is only evidence."""
    from .dirlock import write_private

    with contextlib.suppress(OSError):
        write_private(started_file(directory), f"{epoch}\n")


def started_before(directory: Path) -> bool:
    """Whether :func:`mark_started` marked ``directory`` (or a server of the version before, which wrote
    ``DIR/server/started``)."""
    # (anything by that name: a folder or a link planted there, that the mark could not replace, counts too: trial
    # DU, a folder named STARTED had the store taken as new)
    return os.path.lexists(started_file(directory)) or os.path.lexists(directory / "server" / "started")


STORE_ID = "ID"
"""``DIR/ID``: the store's id, random, made at its first start (one of this version) and kept: told each client in
its ``Welcome``, which reconnects only to the store it used, not to another made at the same path meanwhile (trial
EA). A backup is a store of its own, with an id of its own (trial EC: two copies with one id, each served, were
taken for one store; and a restored backup, which goes back in time, was joined without a word)."""

_ID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_")


def read_store_id(directory: Path) -> tuple[str, str]:
    """``(id, "")`` from ``DIR/ID``, or ``("", why not)``: ``"missing"``, ``"cannot be read (...)"``, ``"is not a
    regular file"``, ``"holds no id (...)"``. Read without following a link, only from a regular file, at most 128
    bytes (trial EC: a link to /dev/zero filled the memory, a FIFO hung the start)."""
    path = directory / STORE_ID
    got, why = "", ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        why = "missing"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc})"
    else:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                got = os.read(fd, 128).decode("ascii", "replace").strip()
                why = "" if 0 < len(got) <= 64 and set(got) <= _ID_CHARS else f"holds no id ({got[:20]!r})"
            else:
                why = "is not a regular file"
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
        finally:
            os.close(fd)
    return (got, "") if not why else ("", why)


def store_id(directory: Path, ran_before: bool) -> str:
    """The id in ``DIR/ID`` (1 to 64 of ``[A-Za-z0-9_-]``; see :func:`read_store_id`), made now when missing; ""
    when it can be neither read nor made (then clients do not check: it is only a guard; logged). A store that ran
    and lost its id gets a new one, logged: a client that knew the old one is told it is another store. Call with
    the directory owned; ``ran_before``: the store ran before this start (a new store's id is made quietly)."""
    import logging
    import secrets

    from .dirlock import write_private

    log = logging.getLogger("tinystore.server")
    got, why = read_store_id(directory)
    path = directory / STORE_ID
    if not why:
        return got
    made = secrets.token_hex(16)
    try:
        write_private(path, made + "\n", sync=True)
    except OSError as exc:
        log.warning(
            "store %s: its ID %s and cannot be made (%s): its clients do not check that they reconnect to this "
            "same store",
            directory,
            why,
            exc.strerror or exc,
        )
        return ""
    if why != "missing" or ran_before:
        # (missing, of a store that ran: most often one made by an older version, at its first start under this
        # one, whose clients had no id to check; told, not warned of)
        log.log(
            logging.INFO if why == "missing" else logging.WARNING,
            "store %s: its ID %s%s: a new id made; a client that knew its old id is told this is another store",
            directory,
            why,
            " (a store made by an older version, or the file was removed)" if why == "missing" else "",
        )
    return made


def holds_store(directory: Path) -> bool:
    """Whether a store that ran is at ``directory``: :func:`started_before`, or its ``EPOCH`` (a mark that could
    not be written: it is only evidence)."""
    return started_before(directory) or os.path.lexists(directory / "EPOCH")


ReadFacts = dict[str, list[tuple[int, int, int]]]
"""SDK transport (its instance) → ``(server epoch, connection number, last stream read)`` facts (see
``Core.read_facts``)."""


def write_last_read(directory: Path, facts: ReadFacts) -> None:
    """Write ``DIR/server/last-read`` atomically (JSON: for each SDK transport, what servers read of its connections
    that ended without telling it): the next servers tell each client (see ``Core.read_facts``)."""
    _write_atomically(directory / "server" / "last-read", json.dumps({"facts": facts}))


def read_last_read(directory: Path) -> ReadFacts:
    """What :func:`write_last_read` left (the file stays: a server that dies before it writes its own keeps them for
    the one after it), or ``{}``."""
    try:
        data = json.loads((directory / "server" / "last-read").read_text())
        raw = data["facts"]
        return {k: [(int(e), int(c), int(s)) for e, c, s in v] for k, v in raw.items() if isinstance(k, str) and v}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def read_address(directory: Path) -> dict[str, Any] | None:
    """What ``DIR/server/address`` says, or ``None``: no file, or the address of another directory (a copy of a
    store made while its server ran carries the original's: trial AW's copy sent its writes to the original).
    The directory is told by its device and inode, not its path: the same folder reached by another path (a
    bind mount, a symbolic link) is the same store (trial AY)."""
    try:
        data = json.loads(address_file(directory).read_text())
        if not isinstance(data, dict):
            return None
        of = data.get("dir_id")
        if isinstance(of, list) and len(of) == 2:
            st = os.stat(directory)
            if [st.st_dev, st.st_ino] != of:
                return None
        elif not _holds(data.get("pid"), directory):
            # an address of an older server, which named no directory: its pid must hold this directory's LOCK
            # (a copy of a store whose server of an older version ran carries its address too: trial AZ)
            return None
    except (OSError, ValueError):
        return None
    return data


def _holds(pid: object, directory: Path) -> bool:
    """Whether ``pid`` holds ``directory``'s LOCK, as far as can be told (True when it cannot be told)."""
    from .dirlock import lock_holders

    holders = lock_holders(directory)
    return holders is None or pid in holders
