"""``store.backup``: a copy of a running store, as a store directory of its own.

Each database of ``DIR/sql`` (the open ones and those not opened since the start) is copied with SQLite's
online backup API (https://sqlite.org/backup.html) from a connection of its own, in one step: the copy is the
database as one read transaction saw it, while the store's writer goes on (WAL). Each copy is written as
``NAME.db.partial``, synced, then renamed; the store's ``EPOCH`` is copied too (with its ``STARTED``), so a
store started on the copy gives fences and message ids above every one the original gave before the copy
(LOCK-02). The copy's ``LOCK``
file, the mark of a store directory, is written last, and its ``BACKUP-UNFINISHED`` mark, written first, then goes:
a backup that did not end holds that mark and no ``LOCK``, and no store is started on it.

Databases are copied one after another: each is consistent in itself (a queue kept in an application database
with ``database=`` is in the same file as its rows), not at one instant with the others.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

from ..engines.descriptors import open_files_limit
from ..errors import ClosedError, InvalidError, PermissionDeniedError, UnavailableError
from ..names import NAME
from .dirlock import LOCK, write_private
from .paths import BACKUP_UNFINISHED, STARTED, STORE_ID

_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _what(directory: Path) -> str:
    return f"backup of store {directory}"


def check_destination(directory: Path, dest: Path) -> None:
    """Refuse a destination: ``InvalidError`` when it is not absolute, not a path (a NUL, a name too long), a
    symbolic link, inside the store or holding it, or an existing folder that is not empty;
    ``PermissionDeniedError`` when it is a folder of another user (who could change the copy)."""
    what = _what(directory)
    text = str(dest)
    if "\0" in text:
        raise InvalidError(f"{what}: the destination {text!r} holds a NUL character")
    if not dest.is_absolute():
        raise InvalidError(f"{what}: the destination {text!r} must be an absolute path (the server's)")
    try:
        if dest.is_symlink():
            raise InvalidError(f"{what}: the destination {dest} is a symbolic link; name a folder itself")
        store, target = directory.resolve(), dest.resolve()
        if target == store or store in target.parents or target in store.parents:
            raise InvalidError(
                f"{what}: the destination {dest} is inside the store, or holds it; pick a folder outside"
            )
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or any(target.iterdir()):
            raise InvalidError(
                f"{what}: the destination {dest} exists and is not an empty folder; a backup goes into a new one"
            )
        if st.st_uid != os.getuid():
            raise PermissionDeniedError(
                f"{what}: the destination {dest} belongs to another user (uid {st.st_uid}; this server runs as "
                f"uid {os.getuid()}), who could change the copy; name a new folder"
            )
    except OSError as exc:
        raise InvalidError(f"{what}: the destination {dest}: {exc.strerror or exc}") from None


def _skip_reason(path: Path) -> str | None:
    """Why ``DIR/sql/NAME.db`` is not a database the store can open (so not copied), or None."""
    if path.is_symlink():
        return "a symbolic link (the store refuses to open it)"
    if not path.is_file():
        return "not a file"
    return None


def backup(directory: Path, dest: Path, cancelled: threading.Event | None = None) -> dict[str, Any]:
    """Copy the store of ``directory`` into ``dest`` (blocking: run it on a thread). Returns ``{"dest": str,
    "databases": {name: bytes}, "skipped": {name: why}, "seconds": float}``: ``skipped`` names the files of
    ``DIR/sql`` that are no database the store can open (a symbolic link, a file that is not SQLite's, a file
    named as a database but not with a database's name: ``App.db``).

    Raises ``InvalidError`` or ``PermissionDeniedError`` (see :func:`check_destination`; also a destination that
    cannot be made, on a read-only file system), ``UnavailableError`` (a disk error while copying),
    ``ClosedError`` (``cancelled`` was set: the store stopped). A failure leaves no ``NAME.db`` half written and
    no ``LOCK``: ``dest`` is no store, and its error says to remove it before trying again.
    """
    check_destination(directory, dest)
    started = time.monotonic()
    what = f"{_what(directory)} into {dest}"
    incomplete = f"{dest} is incomplete (it has no {LOCK}): remove it before trying again"
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(dest, 0o700)
        # (first: a store is never started on a copy cut short; see paths.unfinished_backup)
        write_private(dest / BACKUP_UNFINISHED, "a backup is under way, or did not finish\n", sync=True)
        _fsync(dest)
        (dest / "sql").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno in _DENIED:
            raise PermissionDeniedError(f"{what}: cannot make the folder: {exc.strerror or exc}") from None
        raise UnavailableError(f"{what}: cannot make the folder: {exc.strerror or exc}") from None

    def stop_if_cancelled() -> None:
        if cancelled is not None and cancelled.is_set():
            raise ClosedError(f"{what}: the store stopped during the backup; {incomplete}")

    sizes: dict[str, int] = {}
    skipped: dict[str, str] = {}
    try:
        databases = database_files(directory / "sql")
    except OSError as exc:  # (trial CN: out of descriptors, an "internal error" with a traceback)
        raise UnavailableError(f"{what}: cannot list {directory / 'sql'}: {_os_why(exc)}; {incomplete}") from None
    for name, path in databases:
        stop_if_cancelled()
        why = _skip_reason(path)
        if why is None:
            try:
                sizes[name] = _copy_database(path, dest / "sql" / path.name, stop_if_cancelled)
                continue
            except sqlite3.DatabaseError as exc:
                if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                    hint = f" ({_files_hint()})" if getattr(exc, "sqlite_errorname", "") == "SQLITE_CANTOPEN" else ""
                    raise UnavailableError(f"{what}: database {name}: {exc}{hint}; {incomplete}") from None
                why = f"not a database SQLite can read ({exc})"
            except OSError as exc:
                raise UnavailableError(f"{what}: database {name}: {_os_why(exc)}; {incomplete}") from None
        skipped[name] = why
    for path in misnamed_files(directory / "sql"):
        skipped[path.name] = (
            "its name is no database name (1 to 64 of a-z, 0-9, _ and -, starting with a letter or digit, then .db): "
            "rename it, with the store stopped, to open it and back it up"
        )
    stop_if_cancelled()
    epoch = directory / "EPOCH"
    try:
        if epoch.is_file():
            shutil.copyfile(epoch, dest / "EPOCH")
            os.chmod(dest / "EPOCH", 0o600)
            _fsync(dest / "EPOCH")
            # the copy is of a store that ran: with its EPOCH lost, it is refused as the original would be (trial DS:
            # it started from the wall clock, its fences below the original's)
            mark = dest / STARTED
            mark.write_text(epoch.read_text())
            os.chmod(mark, 0o600)
            _fsync(mark)
        # a store of its own, with an id of its own (paths.STORE_ID; trial EC): restored in the store's place, its
        # clients are told it is another store, not taken back in time without a word
        write_private(dest / STORE_ID, secrets.token_hex(16) + "\n", sync=True)
        _fsync(dest / "sql")
        # last: the mark of a store directory (the file a server locks), so the copy opens as a store only whole
        os.close(os.open(dest / LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        _fsync(dest)
        os.unlink(dest / BACKUP_UNFINISHED)
        _fsync(dest)
    except OSError as exc:
        raise UnavailableError(f"{what}: {_os_why(exc)}; {incomplete}") from None
    return {
        "dest": str(dest),
        "databases": sizes,
        "skipped": skipped,
        "seconds": round(time.monotonic() - started, 3),
    }


def database_files(sql_dir: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` of each ``NAME.db`` in ``DIR/sql`` (a valid name), by name."""
    return [
        (path.name[: -len(".db")], path)
        for path in sorted(sql_dir.glob("*.db"))
        if NAME.fullmatch(path.name[: -len(".db")]) is not None
    ]


_LOOKS_LIKE_SQLITE = (".db", ".sqlite", ".sqlite3", ".db3")


def misnamed_files(sql_dir: Path) -> list[Path]:
    """Files of ``DIR/sql`` named as SQLite databases often are (``App.db``, ``my app.sqlite3``) that the store does
    not take for one of its databases (trial CF: a database brought from an application as ``App.db`` was left out
    of every backup, and named nowhere)."""
    try:
        entries = sorted(sql_dir.iterdir())
    except OSError:
        return []
    return [
        p
        for p in entries
        if p.name.endswith(_LOOKS_LIKE_SQLITE)
        and not (p.name.endswith(".db") and NAME.fullmatch(p.name[: -len(".db")]) is not None)
    ]


BACKUP_STEP_PAGES = 4096
"""Pages a backup copies, and syncs, between two looks at whether the store is stopping (16 MiB of 4 KiB
pages)."""


def _copy_database(source: Path, target: Path, stop_if_cancelled: Any) -> int:
    partial = target.with_name(target.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    try:
        src = sqlite3.connect(source, isolation_level=None, timeout=60)
        try:
            src.execute("pragma query_only = 1")
            # made 0600 before SQLite opens it (its journal takes its mode): never readable by others, even
            # left by a server killed mid-copy (trial DF)
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            dst = sqlite3.connect(partial, isolation_level=None)
            flushed = os.open(partial, os.O_RDONLY)
            try:
                # no rollback journal beside the copy: a copy cut short is thrown away whole, and a server killed
                # mid-copy left "NAME.db.partial-journal" in DEST (trial EU); the copy keeps the source's WAL mode
                dst.execute("pragma journal_mode = off")
                # one read transaction's view of the database, held across the steps (a copy made in steps under
                # no transaction of its own starts again at every commit of another connection), so that a stop is
                # heard between two steps: in one step, a stop waited for the whole copy of a big database (trial
                # HV: 15 s after its grace of 1 s, for 3 GB, the directory held and `stop` said "stopped")
                src.execute("begin")
                src.execute("select count(*) from sqlite_schema").fetchone()
                # each step's pages synced after it, not all at the end: an fsync of a whole copy (hundreds of MB)
                # cannot be cut short, and a stop's grace ending meanwhile waited for it (trial HY: the answer came
                # after the connection closed, an UnavailableError in place of ClosedError)

                def step(*_: Any) -> None:
                    stop_if_cancelled()
                    _datasync(flushed)

                src.backup(dst, pages=BACKUP_STEP_PAGES, progress=step, sleep=0)
                src.execute("rollback")
            finally:
                os.close(flushed)
                dst.close()
        finally:
            src.close()
        stop_if_cancelled()
        os.chmod(partial, 0o600)
        _fsync(partial)
        stop_if_cancelled()  # (a copy the store stopped during is not kept as done)
        os.replace(partial, target)
        return target.stat().st_size
    except BaseException:
        # the copy, and its journal (trial EG: a disk full left "app.db.partial-journal")
        for left in (partial, partial.with_name(partial.name + "-journal")):
            with contextlib.suppress(OSError):
                left.unlink()
        raise


def _files_hint() -> str:
    return f"out of file descriptors? this process may open {open_files_limit()} files: raise `ulimit -n`"


def _os_why(exc: OSError) -> str:
    """What the file system said, and for want of descriptors what to do."""
    said = str(exc.strerror or exc)
    return f"{said} ({_files_hint()})" if exc.errno in (errno.EMFILE, errno.ENFILE) else said


def _datasync(fd: int) -> None:
    """``fdatasync`` where the system has it (Linux), else ``fsync`` (macOS)."""
    getattr(os, "fdatasync", os.fsync)(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
