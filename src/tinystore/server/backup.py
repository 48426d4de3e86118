"""``store.backup``: a copy of a running store, as a store directory of its own.

Each database of ``DIR/sql`` (the open ones and those not opened since the start) is copied with SQLite's
online backup API (https://sqlite.org/backup.html) from a connection of its own, in one step: the copy is the
database as one read transaction saw it, while the store's writer goes on (WAL). Each copy is written as
``NAME.db.partial``, synced, then renamed, and the copy gets a ``LOCK`` file (the mark of a store
directory); the store's ``EPOCH`` is copied too, so a store started on the copy
gives fences and message ids above every one the original gave before the copy (LOCK-02).

Databases are copied one after another: each is consistent in itself (a queue kept in an application database
with ``database=`` is in the same file as its rows), not at one instant with the others.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidError, PermissionDeniedError, TinystoreError, UnavailableError
from ..names import NAME
from .dirlock import LOCK


def check_destination(directory: Path, dest: Path) -> None:
    """Refuse (``InvalidError``) a destination that is not absolute, lies inside the store or holds the store,
    or exists and is not an empty folder."""
    what = f"backup of store {directory}"
    if not dest.is_absolute():
        raise InvalidError(f"{what}: the destination {str(dest)!r} must be an absolute path (the server's)")
    store, target = directory.resolve(), dest.resolve()
    if target == store or store in target.parents or target in store.parents:
        raise InvalidError(f"{what}: the destination {dest} is inside the store, or holds it; pick a folder outside")
    if target.exists() or target.is_symlink():
        if not target.is_dir() or target.is_symlink() or any(target.iterdir()):
            raise InvalidError(
                f"{what}: the destination {dest} exists and is not an empty folder; a backup goes into a new one"
            )


def database_files(sql_dir: Path) -> list[tuple[str, Path]]:
    """The store's databases: ``(name, path)`` of each ``NAME.db`` in ``DIR/sql``, by name."""
    out = []
    for path in sorted(sql_dir.glob("*.db")):
        name = path.name[: -len(".db")]
        if NAME.fullmatch(name) is not None and path.is_file() and not path.is_symlink():
            out.append((name, path))
    return out


def backup(directory: Path, dest: Path) -> dict[str, Any]:
    """Copy the store of ``directory`` into ``dest`` (blocking: run it on a thread). Returns ``{"dest": str,
    "databases": {name: bytes}, "seconds": float}``.

    Raises ``InvalidError`` (see :func:`check_destination`), ``PermissionDeniedError`` (the destination cannot
    be written), ``UnavailableError`` (a disk error while copying). A failure leaves no ``NAME.db`` half
    written: what was copied before stays in ``dest``, the rest is missing.
    """
    check_destination(directory, dest)
    started = time.monotonic()
    what = f"backup of store {directory} into {dest}"
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        (dest / "sql").mkdir(mode=0o700, exist_ok=True)
    except PermissionError as exc:
        raise PermissionDeniedError(f"{what}: cannot make the folder: {exc.strerror or exc}") from None
    except OSError as exc:
        raise UnavailableError(f"{what}: cannot make the folder: {exc.strerror or exc}") from None
    sizes: dict[str, int] = {}
    for name, path in database_files(directory / "sql"):
        sizes[name] = _copy_database(name, path, dest / "sql" / path.name, what)
    epoch = directory / "EPOCH"
    try:
        if epoch.is_file():
            shutil.copyfile(epoch, dest / "EPOCH")
            os.chmod(dest / "EPOCH", 0o600)
            _fsync(dest / "EPOCH")
        # the mark of a store directory (the file a server locks): the copy opens as a store
        os.close(os.open(dest / LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        _fsync(dest / "sql")
        _fsync(dest)
    except OSError as exc:
        raise UnavailableError(f"{what}: {exc.strerror or exc}") from None
    return {"dest": str(dest), "databases": sizes, "seconds": round(time.monotonic() - started, 3)}


def _copy_database(name: str, source: Path, target: Path, what: str) -> int:
    partial = target.with_name(target.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    try:
        src = sqlite3.connect(source, isolation_level=None, timeout=60)
        try:
            src.execute("pragma query_only = 1")
            dst = sqlite3.connect(partial, isolation_level=None)
            try:
                src.backup(dst)  # all pages in one step: one read transaction's view of the database
            finally:
                dst.close()
        finally:
            src.close()
        os.chmod(partial, 0o600)
        _fsync(partial)
        os.replace(partial, target)
        return target.stat().st_size
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        error: TinystoreError = UnavailableError(f"{what}: database {name}: {exc}")
        raise error from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
