"""One owner per directory: an OS file lock (``flock``) on ``DIR/LOCK`` (STORE-01)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import CorruptError, InUseError

LOCK = "LOCK"


def is_store(directory: Path) -> bool:
    """Whether ``directory`` holds a store: every store has its ``LOCK`` file, made when it is first opened
    (and kept: the lock is let go, the file stays)."""
    return (directory / LOCK).is_file()


class DirLock:
    """Holds ``DIR/LOCK`` for the life of the process (or until :meth:`release`)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK
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
    (``<epoch>-<seq>``) never repeat across restarts (LOCK-02). Raises ``CorruptError`` when the file is there
    but does not hold a number: starting from the wall clock then could give fences that went out before.
    """
    path = directory / "EPOCH"
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
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
