"""One owner per directory: an OS file lock (``flock``) on ``DIR/LOCK`` (STORE-01)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import InUseError


class DirLock:
    """Holds ``DIR/LOCK`` for the life of the process (or until :meth:`release`)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "LOCK"
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock at once, or raise ``InUseError`` naming the directory and the owner's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            if owner == str(os.getpid()):
                raise InUseError(
                    f"store {self.path.parent}: this process (pid {owner}) already owns the directory "
                    "(another store opened with embedded=True, or a private server); use that store instead "
                    "of opening it twice"
                ) from None
            raise InUseError(
                f"store {self.path.parent}: the directory is owned by another process (pid {owner}); "
                "connect to it with tinystore.open() instead of owning it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


def next_epoch(directory: Path, now_ms: int) -> int:
    """The store's epoch for this start: ``max(now_ms, last + 1)``, saved (fsync) before it is used.

    It only grows, whatever the wall clock does, so fences (``epoch << 64 | counter``) and message ids
    (``<epoch>-<seq>``) never repeat across restarts (LOCK-02).
    """
    path = directory / "EPOCH"
    try:
        last = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        last = 0
    epoch = max(now_ms, last + 1)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return epoch
